"""Every package in the image, for its SBOM: `python /opt/train-image/smoke/inventory.py` prints one
INVENTORY-JSON line (contract: smoke/schemas/inventory.schema.json). Stdlib only; imports nothing heavy.

Hashes: pip keeps no hash of the wheel it installed, and dpkg none of the .deb, so each package is pinned by
the sha256 of the file that itself hashes every installed file: the dist-info RECORD (sha256 per file) and
dpkg's <package>.md5sums. Change one installed file and the package's hash in the SBOM no longer matches.
Supplier (the SBOM's NTIA minimum element): the package's own metadata, Maintainer/Author or dpkg's Maintainer.
"""

import hashlib
import importlib.metadata as md
import json
import os
import subprocess
import sys

DPKG_INFO = "/var/lib/dpkg/info"


def _sha256(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def _python_supplier(meta):
    """Who supplies the distribution, as its core metadata names them: Maintainer, else Author, else the name part
    of Maintainer-email / Author-email ("Name <addr>"), else the address itself; None when it names nobody."""
    for field in ("Maintainer", "Author"):
        value = (meta.get(field) or "").strip()
        if value and value.upper() != "UNKNOWN":
            return value.splitlines()[0][:200]
    for field in ("Maintainer-email", "Author-email"):
        value = (meta.get(field) or "").strip()
        if value:
            first = value.split(",")[0].strip()
            name = first.split("<")[0].strip().strip('"')
            return (name or first.strip("<>"))[:200]
    return None


def python_packages():
    out = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        record = next((f for f in dist.files or () if f.name == "RECORD" and f.parent.name.endswith(".dist-info")),
                      None)
        out[name.lower()] = {"name": name, "version": dist.version,
                             "record_sha256": _sha256(str(dist.locate_file(record))) if record else None,
                             "supplier": _python_supplier(dist.metadata)}
    return sorted(out.values(), key=lambda p: p["name"].lower())


def dpkg_packages():
    try:
        text = subprocess.run(["dpkg-query", "-W", "-f",
                               "${Package}\t${Version}\t${Architecture}\t${Status}\t${Maintainer}\n"],
                              capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in text.splitlines():
        name, version, arch, status, maintainer = (line.split("\t") + ["", "", "", "", ""])[:5]
        if not status.endswith(" installed"):
            continue
        sums = next((p for p in (f"{DPKG_INFO}/{name}:{arch}.md5sums", f"{DPKG_INFO}/{name}.md5sums")
                     if os.path.exists(p)), None)
        out.append({"name": name, "version": version, "arch": arch,
                    "md5sums_sha256": _sha256(sums) if sums else None, "supplier": maintainer.strip()[:200] or None})
    return out


def main():
    data = {"python": ".".join(map(str, sys.version_info[:3])), "python_packages": python_packages(),
            "dpkg_packages": dpkg_packages()}
    print("INVENTORY-JSON " + json.dumps(data, sort_keys=True))


if __name__ == "__main__":
    main()
