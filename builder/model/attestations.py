"""What an image says about itself once published: an SBOM (SPDX 2.3 JSON) and a provenance statement
(in-toto Statement v1, SLSA provenance v1), both bound to the pushed digest. Pure: documents in, documents out;
publish pushes them (builder/boundary/registry.py, OCI referrers) and verify reads them back.

https://spdx.github.io/spdx-spec/v2.3/ · https://slsa.dev/spec/v1.0/provenance · https://github.com/in-toto/attestation
"""

from __future__ import annotations

import re
from urllib.parse import quote

import builder

SBOM_TYPE = "application/spdx+json"
PROVENANCE_TYPE = "application/vnd.in-toto+json"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/train-images/train-images/blob/main/docs/architecture.md#build-v1"


def _spdx_id(kind: str, name: str, version: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]+", "-", f"{kind}-{name}-{version}")


def sbom(tag: str, repository: str, digest: str, inventory: dict, created: str) -> dict:
    """Every Python and OS package of the image with its version and a content hash (see smoke/inventory.py)."""
    packages, rels = [], []
    image_id = "SPDXRef-image"
    packages.append({"name": f"{repository}@{digest}", "SPDXID": image_id, "versionInfo": tag,
                     "downloadLocation": f"{repository}@{digest}", "filesAnalyzed": False,
                     "checksums": [{"algorithm": "SHA256", "checksumValue": digest.split(":", 1)[1]}],
                     "primaryPackagePurpose": "CONTAINER"})
    for p in inventory.get("python_packages", []):
        ident = _spdx_id("pypi", p["name"], p["version"])
        packages.append({"name": p["name"], "SPDXID": ident, "versionInfo": p["version"],
                         "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                         "checksums": [{"algorithm": "SHA256", "checksumValue": p["record_sha256"]}]
                         if p.get("record_sha256") else [],
                         "comment": "checksum: sha256 of the installed dist-info RECORD (which hashes every file)",
                         "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                           "referenceLocator": f"pkg:pypi/{quote(p['name'].lower())}@"
                                                               f"{quote(p['version'])}"}]})
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": ident})
    for p in inventory.get("dpkg_packages", []):
        ident = _spdx_id("deb", p["name"], p["version"])
        packages.append({"name": p["name"], "SPDXID": ident, "versionInfo": p["version"],
                         "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                         "checksums": [{"algorithm": "SHA256", "checksumValue": p["md5sums_sha256"]}]
                         if p.get("md5sums_sha256") else [],
                         "comment": "checksum: sha256 of dpkg's md5sums list of the package's files",
                         "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                           "referenceLocator": f"pkg:deb/{quote(p['name'])}@{quote(p['version'])}"
                                                               f"?arch={quote(p['arch'])}"}]})
        rels.append({"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": ident})
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{repository}:{tag}",
        "documentNamespace": f"https://train-images.dev/spdx/{quote(repository)}/{digest}",
        "creationInfo": {"created": created, "creators": [f"Tool: train-image-builder-{builder.__version__}"]},
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": image_id}, *rels],
    }


def provenance(*, repository: str, digest: str, entry: dict, locks: dict[str, str], source: dict, build: dict,
               gate: dict, builder_id: str, started: str | None, finished: str) -> dict:
    """Who built the image, from what, and which gate it passed (SLSA provenance v1 in an in-toto Statement).

    entry: the matrix entry as the image's facts file states it; locks: {file name: sha256} of every lock that
    went into the build; source: {"uri", "revision"}; build: the build report; gate: the smoke report."""
    deps = [{"uri": f"{source['uri']}/blob/{source['revision']}/dockerfiles/{entry['tag']}/{name}",
             "digest": {"sha256": sha}} for name, sha in sorted(locks.items())]
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
                                                           for c in gate.get("checks", [])}}}],
            },
        },
    }


def summary(sbom_doc: dict | None, statement: dict | None, digest: str) -> list[str]:
    """What a user reads in `verify`: who built it, from what, which gate, how many packages; or what is off."""
    lines = []
    if statement is None:
        lines.append("provenance: none found for this digest")
    else:
        subjects = [s.get("digest", {}).get("sha256") for s in statement.get("subject", [])]
        pred = statement.get("predicate", {})
        params = pred.get("buildDefinition", {}).get("externalParameters", {})
        run = pred.get("runDetails", {})
        gate = next((b.get("annotations", {}) for b in run.get("byproducts", []) if b.get("name") == "smoke-gate"),
                    {})
        level = gate.get("level") or {}
        where = level.get("kind") == "gpu" and f"GPU: {level.get('gpu_count')} × {level.get('gpu_model')}, driver " \
                                               f"{level.get('driver')}" or "CPU only"
        ok = digest.split(":", 1)[1] in subjects
        lines.append(f"provenance: {'bound to this digest' if ok else 'NOT for this digest'}; built by "
                     f"{run.get('builder', {}).get('id')} from {params.get('source', {}).get('uri')}@"
                     f"{str(params.get('source', {}).get('revision'))[:12]} (tag {params.get('tag')}, builder "
                     f"{pred.get('buildDefinition', {}).get('internalParameters', {}).get('builder_version')})")
        lines.append(f"gate: {'passed' if gate.get('passed') else 'NOT passed'} on {where} "
                     f"({gate.get('finished_at')})")
    if sbom_doc is None:
        lines.append("sbom: none found for this digest")
    else:
        pkgs = sbom_doc.get("packages", [])
        def count(kind: str) -> int:
            return sum(1 for p in pkgs if any(r.get("referenceLocator", "").startswith(f"pkg:{kind}/")
                                              for r in p.get("externalRefs", [])))

        pypi, deb = count("pypi"), count("deb")
        lines.append(f"sbom: {sbom_doc.get('spdxVersion')}, {pypi} Python and {deb} OS packages with hashes")
    return lines
