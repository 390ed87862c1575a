"""What an image says about itself once published: an SBOM (SPDX 2.3 JSON) and a provenance statement
(in-toto Statement v1, SLSA provenance v1), both bound to the pushed digest. Pure: documents in, documents out;
publish pushes them (builder/boundary/registry.py, OCI referrers) and verify reads them back.

https://spdx.github.io/spdx-spec/v2.3/ · https://slsa.dev/spec/v1.0/provenance · https://github.com/in-toto/attestation
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

from packageurl import PackageURL

import builder
from builder.errors import StepFailed
from builder.model import proof

SBOM_TYPE = "application/spdx+json"
CYCLONEDX_TYPE = "application/vnd.cyclonedx+json"
PROVENANCE_TYPE = "application/vnd.in-toto+json"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/train-images/train-images/blob/main/docs/architecture.md#build-v1"


def _spdx_id(kind: str, name: str, version: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]+", "-", f"{kind}-{name}-{version}")


# Scanners match an OS package only with its distribution: purl namespace and `distro=` (purl-spec, deb type),
# and the OS itself by its NVD CPE vendor and product.
OS_CPE = {"debian": ("debian", "debian_linux"), "ubuntu": ("canonical", "ubuntu_linux")}


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines of os-release(5), quotes removed."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            out[key] = value.strip().strip("\"'")
    return out


def distro(os_release: dict[str, str]) -> tuple[str, str]:
    """(purl namespace, distro qualifier) of an os-release, e.g. ("debian", "debian-12"), ("ubuntu", "ubuntu-22.04");
    a release without a version number (testing, sid) is named by its codename."""
    ident = os_release.get("ID", "").lower()
    version = os_release.get("VERSION_ID") or os_release.get("VERSION_CODENAME")
    if not re.fullmatch(r"[a-z0-9._-]+", ident) or not version:
        raise StepFailed("the image's os-release names no distribution (ID) or version (VERSION_ID)",
                         "an SBOM must say which distribution its OS packages come from; fix the base image")
    return ident, f"{ident}-{version}"


def python_purl(name: str, version: str) -> str:
    """pkg:pypi/NAME@VERSION, NAME as the purl spec wants it (lowercase, '_' as '-'): packageurl normalizes it."""
    return PackageURL(type="pypi", name=name, version=version).to_string()


def deb_purl(package: dict, namespace: str, distro_id: str) -> str:
    return PackageURL(type="deb", namespace=namespace, name=package["name"], version=package["version"],
                      qualifiers={"arch": package["arch"], "distro": distro_id}).to_string()


def image_purl(repository: str, digest: str, tag: str) -> str:
    return PackageURL(type="oci", name=repository.rsplit("/", 1)[-1].lower(), version=digest,
                      qualifiers={"repository_url": repository, "tag": tag}).to_string()


def os_cpe(os_release: dict[str, str]) -> str:
    ident, distro_id = distro(os_release)
    vendor, product = OS_CPE.get(ident, (ident, ident))
    return f"cpe:2.3:o:{vendor}:{product}:{distro_id.split('-', 1)[1]}:*:*:*:*:*:*:*"


def _purl_ref(locator: str) -> list[dict]:
    return [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": locator}]


def supplier(text: str | None) -> str:
    """SPDX's supplier field from what a package's own metadata names ("Name <addr>", dpkg's Maintainer, core
    metadata's Maintainer/Author): `Organization: Name (addr)`. The metadata does not say whether it names a person
    or an organization, and SPDX needs one of the two: Organization (a team, a project or a company, mostly).
    NOASSERTION where it names nobody."""
    if not text or not text.strip():
        return "NOASSERTION"
    first = text.strip().splitlines()[0]
    name, _, rest = first.partition("<")
    address = rest.split(">", 1)[0].strip() if rest else ""
    name = " ".join(name.replace("(", " ").replace(")", " ").replace('"', " ").split()) or address
    if not name:
        return "NOASSERTION"
    return f"Organization: {name[:160]}" + (f" ({address[:120]})" if address and address != name else "")


def _package(kind: str, name: str, version: str, sha256: str | None, comment: str, refs: list[dict],
             supplied_by: str | None = None) -> dict:
    return {"name": name, "SPDXID": _spdx_id(kind, name, version), "versionInfo": version,
            "supplier": supplier(supplied_by), "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
            "checksums": [{"algorithm": "SHA256", "checksumValue": sha256}] if sha256 else [],
            "comment": comment, "externalRefs": refs}


def sbom(tag: str, repository: str, digest: str, inventory: dict, created: str, os_release: dict[str, str]) -> dict:
    """Every Python and OS package of the image with its version, a canonical package URL and a content hash
    (see smoke/inventory.py), and the operating system itself (its CPE), as scanners match them."""
    namespace, distro_id = distro(os_release)
    image_id = "SPDXRef-image"
    # The publisher: the registry namespace the image is pushed under (`ghcr.io/org` of `ghcr.io/org/train`).
    publisher = repository.rsplit("/", 1)[0] if "/" in repository else repository
    # downloadLocation must be a URL, a VCS locator, NONE or NOASSERTION: `HOST:PORT/name@sha256:…` is none of
    # them. Where to pull it is the image's package URL (its repository_url), which every scanner reads.
    packages = [{"name": f"{repository}@{digest}", "SPDXID": image_id, "versionInfo": tag,
                 "supplier": supplier(publisher), "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                 "checksums": [{"algorithm": "SHA256", "checksumValue": digest.split(":", 1)[1]}],
                 "primaryPackagePurpose": "CONTAINER", "externalRefs": _purl_ref(image_purl(repository, digest, tag))}]
    os_version = distro_id.split("-", 1)[1]
    packages.append({**_package("os", namespace, os_version, None, f"from the image's os-release: "
                                f"{os_release.get('PRETTY_NAME', distro_id)}",
                                [{"referenceCategory": "SECURITY", "referenceType": "cpe23Type",
                                  "referenceLocator": os_cpe(os_release)}],
                                os_release.get("NAME") or namespace),
                     "primaryPackagePurpose": "OPERATING-SYSTEM"})
    for p in inventory.get("python_packages", []):
        packages.append(_package("pypi", p["name"], p["version"], p.get("record_sha256"),
                                 "checksum: sha256 of the installed dist-info RECORD (which hashes every file)",
                                 _purl_ref(python_purl(p["name"], p["version"])), p.get("supplier")))
    for p in inventory.get("dpkg_packages", []):
        packages.append(_package("deb", p["name"], p["version"], p.get("md5sums_sha256"),
                                 "checksum: sha256 of dpkg's md5sums list of the package's files",
                                 _purl_ref(deb_purl(p, namespace, distro_id)), p.get("supplier")))
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{repository}:{tag}",
        "documentNamespace": f"https://train-images.dev/spdx/{quote(repository)}/{digest}",
        "creationInfo": {"created": created, "creators": [f"Tool: train-image-builder-{builder.__version__}",
                                                          supplier(publisher)]},
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": image_id},
                          *({"spdxElementId": image_id, "relationshipType": "CONTAINS",
                             "relatedSpdxElement": p["SPDXID"]} for p in packages[1:])],
    }


def cyclonedx(tag: str, repository: str, digest: str, inventory: dict, created: str, os_release: dict[str, str]
              ) -> dict:
    """The same packages as `sbom`, as CycloneDX 1.6 (cyclonedx-python-lib, validated against its schema) for
    scanners that read only that: the image as the BOM's subject (its digest as a SHA-256 hash, its package URL),
    every Python and OS package with its package URL, supplier and content hash, and the OS with its CPE."""
    from datetime import datetime
    from uuid import NAMESPACE_URL, uuid5

    from cyclonedx.model import HashAlgorithm, HashType
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.contact import OrganizationalEntity
    from cyclonedx.output.json import JsonV1Dot6
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    namespace, distro_id = distro(os_release)
    publisher = repository.rsplit("/", 1)[0] if "/" in repository else repository

    def party(text: str | None) -> OrganizationalEntity | None:
        named = supplier(text)
        return None if named == "NOASSERTION" else OrganizationalEntity(name=named.removeprefix("Organization: "))

    def sha(value: str | None) -> list:
        return [HashType(alg=HashAlgorithm.SHA_256, content=value)] if value else []

    image_purl_ = PackageURL.from_string(image_purl(repository, digest, tag))
    bom = Bom(serial_number=uuid5(NAMESPACE_URL, f"{repository}@{digest}"))  # one BOM per image: same number
    bom.metadata.timestamp = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ")
    bom.metadata.tools.components.add(Component(type=ComponentType.APPLICATION, name="train-image-builder",
                                                version=builder.__version__))
    bom.metadata.component = root = Component(
        type=ComponentType.CONTAINER, name=f"{repository}@{digest}", version=tag, bom_ref="image",
        purl=image_purl_, hashes=sha(digest.split(":", 1)[1]), supplier=party(publisher))
    os_version = distro_id.split("-", 1)[1]
    parts = [Component(type=ComponentType.OPERATING_SYSTEM, name=namespace, version=os_version,
                       bom_ref=f"os:{namespace}@{os_version}", cpe=os_cpe(os_release),
                       supplier=party(os_release.get("NAME") or namespace))]
    for p in inventory.get("python_packages", []):
        purl = PackageURL.from_string(python_purl(p["name"], p["version"]))
        parts.append(Component(type=ComponentType.LIBRARY, name=p["name"], version=p["version"], purl=purl,
                               bom_ref=purl.to_string(), hashes=sha(p.get("record_sha256")),
                               supplier=party(p.get("supplier"))))
    for p in inventory.get("dpkg_packages", []):
        purl = PackageURL.from_string(deb_purl(p, namespace, distro_id))
        parts.append(Component(type=ComponentType.LIBRARY, name=p["name"], version=p["version"], purl=purl,
                               bom_ref=purl.to_string(), hashes=sha(p.get("md5sums_sha256")),
                               supplier=party(p.get("supplier"))))
    seen: set[str] = set()
    unique = [c for c in parts if not (str(c.bom_ref) in seen or seen.add(str(c.bom_ref)))]
    for component in unique:
        bom.components.add(component)
    bom.register_dependency(root, unique)
    text = JsonV1Dot6(bom).output_as_string(indent=1)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise StepFailed(f"the CycloneDX SBOM of {repository}@{digest[:19]} does not validate: {str(error)[:200]}",
                         "report this: the inventory holds a value CycloneDX 1.6 refuses")
    return json.loads(text)


def cyclonedx_binding(doc, digest: str) -> str | None:
    """None when the CycloneDX BOM's subject (metadata.component) is the image `digest`; else one line why not."""
    component = doc.get("metadata", {}).get("component") if isinstance(doc, dict) else None
    if not isinstance(component, dict):
        return "the CycloneDX SBOM names no image"
    sums = {h.get("content") for h in _dicts(component.get("hashes")) if h.get("alg") == "SHA-256"}
    if sums != {digest.split(":", 1)[1]} or not str(component.get("name", "")).endswith(f"@{digest}"):
        return f"the CycloneDX SBOM describes {_short(sums)}, not this image {digest[:19]}…"
    return None


LABEL_PREFIX = "io.train-images"


def pin(value) -> str | None:
    """A pin as facts (null), labels ("none") and the matrix (None) each spell "not installed"."""
    return None if value in (None, "", "none") else str(value)


def label_problem(tag: str, pins: dict, labels: dict) -> str | None:
    """The first of the image's labels that names another tag or another pin than `tag` and `pins` (an entry's,
    or the image's own facts), one line naming the field; None when none does. A label the image lacks is not
    compared: the facts are, by the caller."""
    label = labels.get(f"{LABEL_PREFIX}.tag", tag)
    if label != tag:
        return f"tag: the image's label says {str(label)[:80]!r}, not {str(tag)[:80]!r}"
    named = {key.removeprefix(f"{LABEL_PREFIX}.pin.") for key in labels if key.startswith(f"{LABEL_PREFIX}.pin.")}
    for name in sorted(set(pins) | named):
        label, want = labels.get(f"{LABEL_PREFIX}.pin.{name}"), pin(pins.get(name))
        if label is not None and pin(label) != want:
            return f"pin {name}: the image's label {LABEL_PREFIX}.pin.{name} says {str(label)[:80]}, not {want}"
    return None


def lock_mismatches(image_locks: dict[str, str], checkout_locks: dict[str, str], where: str) -> list[str]:
    """How the locks inside the image ({name: sha256}, read from /opt/train-image/locks/) differ from the
    checkout's (`where`); empty when every lock the image carries is the checkout's. Locks only the checkout has
    (nvcc.lock, ops.lock: used by build stages, not copied into the image) cannot be compared and are not."""
    if not image_locks:
        return ["the image carries no lock files in /opt/train-image/locks/"]
    out = []
    for name, sha in sorted(image_locks.items()):
        theirs = checkout_locks.get(name)
        if theirs is None:
            out.append(f"{name} is in the image but not in {where}")
        elif theirs != sha:
            out.append(f"{name} differs: the image's is sha256:{sha[:12]}…, {where}{name} is sha256:{theirs[:12]}…")
    return out


def provenance(*, repository: str, digest: str, entry: dict, locks: dict[str, str], source: dict, build: dict,
               gate: dict, builder_id: str, started: str | None, finished: str, audit: dict | None = None) -> dict:
    """Who built the image, from what, and which gate it passed (SLSA provenance v1 in an in-toto Statement).

    entry: the matrix entry as the image's facts file states it; locks: {file name: sha256} of every lock the
    image carries (read from the image, checked against the checkout by lock_mismatches); source: {"uri", "revision"};
    build: the build report; gate: the smoke report."""
    deps = [{"uri": f"{source['uri']}/blob/{source['revision']}/locks/{entry['tag']}/{name}",
             "digest": {"sha256": sha},
             "annotations": {"read_from": f"/opt/train-image/locks/{name} in the image"}}
            for name, sha in sorted(locks.items())]
    base = build.get("base") or {}
    deps.append({"uri": f"docker://{base.get('ref') or entry.get('base')}",
                 "digest": {"sha256": (base.get("image_id") or "sha256:").split(":", 1)[1] or "unknown"},
                 "annotations": {"pinned": entry.get("base"), "substituted": base.get("substituted")}})
    level = gate.get("level") or {"kind": gate.get("mode")}
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": repository, "digest": {"sha256": digest.split(":", 1)[1]}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"tag": entry["tag"], "matrix_entry": entry,
                                       "source": {"uri": source["uri"], "revision": source["revision"]}},
                "internalParameters": {"builder_version": builder.__version__, "input_hash": build.get("input_hash"),
                                       "source_date_epoch": build.get("source_date_epoch"),
                                       "docker": build.get("docker")},
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": builder_id},
                "metadata": {"invocationId": builder_id, "startedOn": started, "finishedOn": finished},
                "byproducts": [{"name": "smoke-gate", "mediaType": "application/json",
                                "annotations": {"passed": gate.get("passed"), "level": level,
                                                "finished_at": gate.get("finished_at"),
                                                "image_id": gate.get("image_id"),
                                                "checks": {c["name"]: c.get("passed")
                                                           for c in gate.get("checks", [])}}},
                               *([{"name": "vulnerability-audit", "mediaType": "application/json",
                                   "annotations": {k: audit[k] for k in ("audited_on", "passed", "max_severity",
                                                                         "summary")}}] if audit else [])],
            },
        },
    }


# --- binding: an attestation counts only for the image its content names ---------------------------------


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _short(hexes) -> str:
    return ", ".join(f"sha256:{str(h)[:12]}…" for h in sorted(hexes, key=str)) or "no digest"


def sbom_binding(doc, digest: str) -> str | None:
    """None when the SPDX document DESCRIBES the image `digest` (its package's SHA256 checksum and its
    name@digest); else one line saying what it describes instead. A referrer's subject is the registry's
    index entry; the document's own words are what a user reads, so both must name the same image."""
    if not isinstance(doc, dict):
        return "the SBOM is not a JSON object"
    listed = doc.get("documentDescribes")
    described = {d for d in listed if isinstance(d, str)} if isinstance(listed, list) else set()
    described |= {str(r.get("relatedSpdxElement")) for r in _dicts(doc.get("relationships"))
                  if r.get("spdxElementId") == "SPDXRef-DOCUMENT" and r.get("relationshipType") == "DESCRIBES"}
    images = [p for p in _dicts(doc.get("packages")) if str(p.get("SPDXID")) in described]
    sums = {str(c.get("checksumValue")) for p in images for c in _dicts(p.get("checksums"))
            if c.get("algorithm") == "SHA256"}
    named = all(str(p.get("name", "")).endswith(f"@{digest}") for p in images)
    if not images or sums != {digest.split(":", 1)[1]} or not named:
        return f"the SBOM describes {_short(sums)}, not this image {digest[:19]}…"
    return None


def _statement_binding(statement, digest: str, predicate: str, what: str, kind: str) -> str | None:
    """None when `statement` is an in-toto statement of `predicate` whose every subject is the image `digest`;
    else one line saying what it is instead."""
    if not isinstance(statement, dict) or statement.get("predicateType") != predicate:
        return f"the {what} is not an {kind} statement"
    subjects = {str(s["digest"].get("sha256")) if isinstance(s.get("digest"), dict) else "none"
                for s in _dicts(statement.get("subject"))}
    if subjects != {digest.split(":", 1)[1]}:
        return f"the {what} is for {_short(subjects)}, not this image {digest[:19]}…"
    return None


def provenance_binding(statement, digest: str) -> str | None:
    """Ours (publish writes exactly one subject): bound to `digest`, or why not."""
    return _statement_binding(statement, digest, SLSA_PROVENANCE, "provenance", "SLSA provenance")


BINDING = {SBOM_TYPE: sbom_binding, PROVENANCE_TYPE: provenance_binding, CYCLONEDX_TYPE: cyclonedx_binding}

# BuildKit's own provenance of the build (SLSA v0.2, as buildx's metadata file gives it: buildkit.provenance_statement),
# stored beside ours with the same artifact type and told apart by its predicate type.
BUILDKIT_PROVENANCE = "https://slsa.dev/provenance/v0.2"
BUILDKIT = "buildkit-provenance"


def buildkit_binding(statement, digest: str) -> str | None:
    """BuildKit's (SLSA v0.2): bound to `digest`, or why not."""
    return _statement_binding(statement, digest, BUILDKIT_PROVENANCE, "BuildKit provenance", "SLSA v0.2")


def slot(artifact_type: str, doc) -> str:
    """Where a referrer's document belongs: BuildKit's provenance, or the kind its artifact type names."""
    if artifact_type == PROVENANCE_TYPE and isinstance(doc, dict) and doc.get("predicateType") == BUILDKIT_PROVENANCE:
        return BUILDKIT
    return artifact_type


def buildkit_summary(statement: dict | None, digest: str) -> str:
    """One line: what BuildKit recorded about the build of this digest, or that there is none."""
    off = _not_shown("buildkit provenance", statement, buildkit_binding, digest)
    if off:
        return off + (" (images built on Docker 20.10 have none)" if statement is None else "")
    pred = statement.get("predicate") if isinstance(statement.get("predicate"), dict) else {}
    meta = pred.get("metadata") if isinstance(pred.get("metadata"), dict) else {}
    materials = [str(m.get("uri")) for m in _dicts(pred.get("materials")) if m.get("uri")]
    started = str(meta.get("buildStartedOn") or "?")[:19]
    return (f"buildkit provenance: SLSA v0.2, bound to this digest; build {pred.get('buildType', '?')} started "
            f"{started}Z; {len(materials)} material(s)" + (f": {', '.join(materials[:3])}" if materials else ""))


def _not_shown(kind: str, doc: dict | None, binding, digest: str) -> str | None:
    """Why `doc` is not summarised (absent, or about another image), or None when it is bound to `digest`."""
    if doc is None:
        return f"{kind}: none found for this digest"
    why = binding(doc, digest)
    return f"{kind}: NOT for this digest, ignored: {why}" if why else None


def claim_problems(statement: dict, identities: set[str] | None, facts: dict | None) -> list[str]:
    """What a provenance bound to the digest says about the image that the image at hand contradicts: the gate
    ran on another image (its image ID is none of this image's: registry digest, local ID, config digests), or
    the statement names another tag or other pins than the image's own facts. A subject binds the statement to
    the digest; these bind what it *says* to the image, so a gate passed elsewhere is never shown as this one's.
    identities None: nothing to check against (said by the caller)."""
    pred = statement.get("predicate") if isinstance(statement.get("predicate"), dict) else {}
    run = pred.get("runDetails") if isinstance(pred.get("runDetails"), dict) else {}
    gate = next((b.get("annotations") for b in _dicts(run.get("byproducts")) if b.get("name") == "smoke-gate"), None)
    gate = gate if isinstance(gate, dict) else {}
    build = pred.get("buildDefinition") if isinstance(pred.get("buildDefinition"), dict) else {}
    params = build.get("externalParameters") if isinstance(build.get("externalParameters"), dict) else {}
    out = []
    if identities is not None and gate:
        ran_on = gate.get("image_id")
        if isinstance(ran_on, str) and ran_on and ran_on not in identities:
            out.append(f"the gate ran on image {ran_on[:19]}…, which is not this image "
                       f"({', '.join(sorted(i[:19] + '…' for i in identities))})")
    if isinstance(facts, dict):
        if params.get("tag") != facts.get("tag"):
            out.append(f"it names tag {str(params.get('tag'))[:60]!r}, the image's facts say "
                       f"{str(facts.get('tag'))[:60]!r}")
        entry = params.get("matrix_entry") if isinstance(params.get("matrix_entry"), dict) else {}
        if isinstance(facts.get("pins"), dict) and entry.get("pins") != facts["pins"]:
            said = entry.get("pins") if isinstance(entry.get("pins"), dict) else {}
            differ = sorted(k for k in set(said) | set(facts["pins"]) if said.get(k) != facts["pins"].get(k))
            out.append(f"its pins differ from the image's facts ({', '.join(differ[:4]) or 'not a mapping'})")
    return out


def summary(sbom_doc: dict | None, statement: dict | None, digest: str, identities: set[str] | None = None,
            facts: dict | None = None) -> list[str]:
    """What a user reads in `verify`: who built it, from what, which gate, how many packages; or what is off.
    A document that names another image is never summarised: its "built by" and gate are another image's. A
    provenance whose claims the image contradicts (claim_problems) is shown as such, its gate verdict not as
    this image's."""
    lines = []
    off = _not_shown("provenance", statement, provenance_binding, digest)
    contradicted = claim_problems(statement, identities, facts) if not off else []
    if off:
        lines.append(off)
    elif contradicted:
        lines.append("provenance: bound to this digest, but what it claims is NOT this image's: "
                     + "; ".join(contradicted) + " (its builder and gate verdict are not shown)")
    else:
        pred = statement.get("predicate", {})
        params = pred.get("buildDefinition", {}).get("externalParameters", {})
        run = pred.get("runDetails", {})
        internal = pred.get("buildDefinition", {}).get("internalParameters", {})
        gate = next((b.get("annotations", {}) for b in run.get("byproducts", []) if b.get("name") == "smoke-gate"),
                    {})
        level = gate.get("level") or {}
        where = level.get("kind") == "gpu" and f"GPU: {level.get('gpu_count')} × {level.get('gpu_model')}, driver " \
                                               f"{level.get('driver')}" or "CPU only"
        lines.append("provenance: bound to this digest; built by "
                     f"{run.get('builder', {}).get('id')} from {params.get('source', {}).get('uri')}@"
                     f"{str(params.get('source', {}).get('revision'))[:12]} (tag {params.get('tag')}, builder "
                     f"{internal.get('builder_version')})" + (f" with {proof.engine_phrase(internal.get('docker'))}"
                                                              if proof.engine_phrase(internal.get("docker")) else ""))
        ran_on = gate.get("image_id")
        checked = "" if identities is None else ", on this image" if isinstance(ran_on, str) and ran_on else \
            ", the image it ran on not recorded: not checked against this one"
        lines.append(f"gate: {'passed' if gate.get('passed') else 'NOT passed'} on {where} "
                     f"({gate.get('finished_at')}{checked})")
        audit = next((b.get("annotations", {}) for b in run.get("byproducts", [])
                      if b.get("name") == "vulnerability-audit"), None)
        lines.append(audit.get("summary", "audit: ?") if audit else "audit: none recorded (published without "
                                                                     "--max-severity)")
    off = _not_shown("sbom", sbom_doc, sbom_binding, digest)
    if off:
        lines.append(off)
    else:
        pkgs = sbom_doc.get("packages", [])
        def count(kind: str) -> int:
            return sum(1 for p in pkgs if any(r.get("referenceLocator", "").startswith(f"pkg:{kind}/")
                                              for r in p.get("externalRefs", [])))

        pypi, deb = count("pypi"), count("deb")
        system = next((f" ({p.get('name')} {p.get('versionInfo')})" for p in pkgs
                       if p.get("primaryPackagePurpose") == "OPERATING-SYSTEM"), "")
        lines.append(f"sbom: {sbom_doc.get('spdxVersion')}, {pypi} Python and {deb} OS packages{system} with hashes")
    return lines
