"""The content manifest of an image, from its layers as read (builder/boundary/imagesave.py): pure.

The layers are applied in order (whiteouts `.wh.NAME` delete, `.wh..wh..opq` makes a directory opaque) to get
the final filesystem. The manifest lists every path there (type, mode, owner, size, sha256, link target), the
Python packages (`*.dist-info/METADATA` + `INSTALLER`, `*.egg-info/PKG-INFO`), the OS packages
(`/var/lib/dpkg/status`) and, separately, the layer digests. The `manifest` verb prints it; `repro` and
`diff` compare two of them.

`mtime` is recorded but is not content: `compare` and `repro` report it as its own class, because Docker
20.10's BuildKit cannot rewrite layer timestamps to SOURCE_DATE_EPOCH (docs/reproducibility.md).
"""

from __future__ import annotations

import email.parser
import json
import posixpath

FORMAT = 1


# --- applying layers -----------------------------------------------------------------------------------


def _drop_below(fs: dict, path: str, include_self: bool) -> None:
    prefix = "" if path == "." else path + "/"
    for key in [k for k in fs if (k.startswith(prefix) and k != path) or (include_self and k == path)]:
        del fs[key]


def apply_layers(layers: list[dict]) -> dict[str, dict]:
    """The final filesystem: each layer's whiteouts and opaque dirs hide what is below, then its entries land."""
    fs: dict[str, dict] = {}
    for layer in layers:
        for directory in layer["opaque"]:
            _drop_below(fs, directory, include_self=False)
        for path in layer["whiteouts"]:
            _drop_below(fs, path, include_self=True)
        for path, entry in layer["entries"].items():
            old = fs.get(path)
            if old is not None and old["type"] == "dir" and entry["type"] != "dir":
                _drop_below(fs, path, include_self=False)  # a directory replaced by a file loses its children
            fs[path] = entry
    fs.pop(".", None)
    return fs


# --- packages ------------------------------------------------------------------------------------------


def _headers(content: bytes) -> dict:
    head = content.split(b"\n\n", 1)[0].decode("utf-8", "replace")
    msg = email.parser.Parser().parsestr(head, headersonly=True)
    return {"name": msg.get("Name"), "version": msg.get("Version")}


def python_packages(fs: dict[str, dict]) -> list[dict]:
    out = []
    for path, entry in fs.items():
        if not (path.endswith((".dist-info/METADATA", ".egg-info/PKG-INFO")) and "content" in entry):
            continue
        meta = _headers(entry["content"])
        if not meta["name"]:
            continue
        installer = fs.get(posixpath.join(posixpath.dirname(path), "INSTALLER"), {}).get("content")
        out.append({"name": meta["name"], "version": meta["version"], "path": posixpath.dirname(path),
                    "installer": installer.decode("utf-8", "replace").strip() if installer else None})
    return sorted(out, key=lambda p: (p["name"].lower(), p["path"]))


def dpkg_packages(status: bytes | None) -> list[dict]:
    """Installed packages from /var/lib/dpkg/status (only `install ok installed` ones)."""
    out = []
    for paragraph in (status or b"").decode("utf-8", "replace").split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            out.append({"name": fields["Package"], "version": fields.get("Version"),
                        "architecture": fields.get("Architecture")})
    return sorted(out, key=lambda p: (p["name"], p["architecture"] or ""))


def build_manifest(saved: dict, image: str) -> dict:
    fs = apply_layers([saved["layers"][name] for name in saved["order"]])
    status = fs.get("var/lib/dpkg/status", {}).get("content")
    manifest = {
        "format": FORMAT,
        "image": image,
        "config_digest": "sha256:" + saved["config_name"].rsplit("/", 1)[-1].removesuffix(".json"),
        "layers": [{"diff_id": d} for d in saved["config"].get("rootfs", {}).get("diff_ids", [])],
        "python_packages": python_packages(fs),
        "os_packages": dpkg_packages(status),
        "files": {path: {k: v for k, v in entry.items() if k != "content"} for path, entry in sorted(fs.items())},
    }
    manifest["totals"] = {"files": sum(e["type"] == "file" for e in fs.values()), "paths": len(fs),
                          "bytes": sum(e.get("size", 0) for e in fs.values() if e["type"] == "file")}
    return manifest


def _text(value, optional: bool = False) -> bool:
    return isinstance(value, str) or (optional and value is None)


def well_formed(doc) -> bool:
    """Is `doc` a whole manifest of this format? The manifest cache (keyed by image ID) sits on disk
    where anything can damage it (a truncated write by another tool, an edit, an older builder): an entry that
    is not exactly what build_manifest writes is rebuilt, never half-trusted into a KeyError."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not _text(doc.get("config_digest")):
        return False
    totals, files = doc.get("totals"), doc.get("files")
    layers, python, os_ = doc.get("layers"), doc.get("python_packages"), doc.get("os_packages")
    if not (isinstance(totals, dict) and all(type(totals.get(k)) is int for k in ("files", "paths", "bytes"))):
        return False
    if not (isinstance(files, dict) and isinstance(layers, list) and isinstance(python, list)
            and isinstance(os_, list)):
        return False
    return (all(isinstance(e, dict) and _text(e.get("type")) and type(e.get("size", 0)) is int
                for e in files.values())
            and all(isinstance(x, dict) and _text(x.get("diff_id")) for x in layers)
            and all(isinstance(p, dict) and _text(p.get("name")) and _text(p.get("path"))
                    and _text(p.get("version"), optional=True) for p in python)
            and all(isinstance(p, dict) and _text(p.get("name")) and _text(p.get("version"), optional=True)
                    and _text(p.get("architecture"), optional=True) for p in os_))


def dumps(result: dict) -> str:
    """The deterministic JSON form: timing (`stats`) is left out, keys sorted."""
    return json.dumps({k: v for k, v in result.items() if k != "stats"}, indent=1, sort_keys=True) + "\n"
