"""The SBOM as scanners read it (SPDX 2.3 validated by spdx-tools, canonical package URLs, the OS as a package)
and the provenance's lock check. The inventory is the real one of the CI image cu130-torch2.13-bookworm, as
smoke/inventory.py printed it (tests/unit/data/inventory-bookworm.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packageurl import PackageURL
from spdx_tools.spdx.parser.jsonlikedict.json_like_dict_parser import JsonLikeDictParser
from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

from builder.errors import StepFailed
from builder.model import attestations

DATA = Path(__file__).parent / "data"
DIGEST = "sha256:" + "ab" * 32
BOOKWORM = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'
TRIXIE = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\nVERSION_CODENAME=trixie\n'
JAMMY = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n'


def sbom(os_release: str = BOOKWORM, inventory: dict | None = None, repository: str = "ghcr.io/train-images/train"
         ) -> dict:
    inventory = inventory or json.loads((DATA / "inventory-bookworm.json").read_text())
    return attestations.sbom("cu130-torch2.13-bookworm", repository, DIGEST, inventory,
                             "2026-12-04T00:00:00Z", attestations.parse_os_release(os_release))


def ntia_gaps(doc: dict, folder: Path) -> dict:
    """What ntia-conformance-checker (the NTIA minimum elements, as SBOM consumers check them) finds missing:
    {element: [package names]}, {} when conformant. It reads a file, as consumers do."""
    from ntia_conformance_checker.sbom_checker import SbomChecker

    path = folder / "sbom.spdx.json"
    path.write_text(json.dumps(doc))
    checker = SbomChecker(str(path))
    gaps = {element: [name for name, _ in names] for element, names in checker.all_components_without_info}
    gaps = {k: v for k, v in gaps.items() if v}
    if not checker.doc_author:
        gaps["author"] = ["document"]
    if not checker.doc_timestamp:
        gaps["timestamp"] = ["document"]
    if not checker.dependency_relationships:
        gaps["relationships"] = ["document"]
    assert checker.compliant is (not gaps), (checker.compliant, gaps)
    return gaps


def locators(doc: dict, kind: str = "") -> list[str]:
    return [r["referenceLocator"] for p in doc["packages"] for r in p.get("externalRefs", [])
            if r["referenceLocator"].startswith(kind)]


@pytest.mark.parametrize("repository", ["ghcr.io/train-images/train", "127.0.0.1:5000/train",
                                        "registry.example:8443/team/ml/train", "[::1]:5000/train", "localhost/train"])
def test_the_ci_image_sbom_validates_as_spdx_2_3_for_any_registry(repository):
    """Published to a registry with a port (the issue-48 case: `HOST:PORT/train@sha256:…` is not a download
    location) or none, the document validates: where to pull the image is its package URL."""
    doc = sbom(repository=repository)
    assert validate_full_spdx_document(JsonLikeDictParser().parse(doc)) == []
    image = doc["packages"][0]
    assert image["downloadLocation"] == "NOASSERTION"
    purl = PackageURL.from_string(image["externalRefs"][0]["referenceLocator"])
    assert purl.qualifiers["repository_url"] == repository and purl.version == DIGEST


def test_the_ci_image_sbom_has_the_ntia_minimum_elements(tmp_path):
    """Supplier, name, version, unique identifier of every package; author, timestamp, relationships of the
    document: the inventory of the real CI image names a supplier for each of its packages."""
    doc = sbom(repository="127.0.0.1:5000/train")
    assert ntia_gaps(doc, tmp_path) == {}
    suppliers = {p["name"]: p["supplier"] for p in doc["packages"]}
    assert suppliers["torch"].startswith("Organization: PyTorch")
    assert suppliers["python3"].startswith("Organization: Matthias Klose")
    assert suppliers["debian"] == "Organization: debian"  # os-release ID: this one names no NAME
    assert "Organization: 127.0.0.1:5000" in doc["creationInfo"]["creators"]


def test_a_package_that_names_no_supplier_is_said_so_and_found_by_the_checker(tmp_path):
    inventory = {"python_packages": [{"name": "anon", "version": "1.0", "record_sha256": None, "supplier": None}],
                 "dpkg_packages": []}
    doc = sbom(inventory=inventory)
    assert next(p for p in doc["packages"] if p["name"] == "anon")["supplier"] == "NOASSERTION"
    assert ntia_gaps(doc, tmp_path) == {"supplier": ["anon"]}


@pytest.mark.parametrize("text, expected", [
    ("Debian Python Team <team+python@tracker.debian.org>",
     "Organization: Debian Python Team (team+python@tracker.debian.org)"),
    ("PyTorch Team", "Organization: PyTorch Team"),
    ('"Hugging Face, Inc." <julien@huggingface.co>', "Organization: Hugging Face, Inc. (julien@huggingface.co)"),
    ("<only@addr.example>", "Organization: only@addr.example"),
    ("Name (nick) <a@b.c>\nsecond line", "Organization: Name nick (a@b.c)"),
    ("", "NOASSERTION"), (None, "NOASSERTION"), ("  ", "NOASSERTION"),
])
def test_supplier_from_package_metadata(text, expected):
    assert attestations.supplier(text) == expected


def test_every_package_has_a_canonical_identifier():
    doc = sbom()
    assert all(p.get("externalRefs") for p in doc["packages"])  # image, OS, every Python and OS package
    purls = locators(doc, "pkg:")
    assert len(purls) == len(doc["packages"]) - 1  # all but the OS, which has a CPE
    assert all(PackageURL.from_string(p).to_string() == p for p in purls)  # canonical: round-trips unchanged
    python = locators(doc, "pkg:pypi/")
    assert len(python) == 68 and all(p == p.lower() and "_" not in p.split("@")[0] for p in python)
    assert "pkg:pypi/typing-extensions@4.16.0" in python and "pkg:pypi/huggingface-hub@2.4.0" in python


def test_os_packages_name_their_distribution_and_the_os_is_a_package():
    doc = sbom()
    debs = locators(doc, "pkg:deb/")
    assert len(debs) == 162 and all(p.startswith("pkg:deb/debian/") and "distro=debian-12" in p for p in debs)
    assert "pkg:deb/debian/apt@2.6.1?arch=amd64&distro=debian-12" in debs
    os_pkg = next(p for p in doc["packages"] if p.get("primaryPackagePurpose") == "OPERATING-SYSTEM")
    assert (os_pkg["name"], os_pkg["versionInfo"]) == ("debian", "12")
    assert os_pkg["externalRefs"][0]["referenceLocator"] == "cpe:2.3:o:debian:debian_linux:12:*:*:*:*:*:*:*"
    contained = {r["relatedSpdxElement"] for r in doc["relationships"] if r["relationshipType"] == "CONTAINS"}
    assert contained == {p["SPDXID"] for p in doc["packages"][1:]}


@pytest.mark.parametrize("release,purl,cpe", [
    (TRIXIE, "pkg:deb/debian/libc6@2.41-12?arch=amd64&distro=debian-13", "cpe:2.3:o:debian:debian_linux:13:"),
    (JAMMY, "pkg:deb/ubuntu/libc6@2.41-12?arch=amd64&distro=ubuntu-22.04", "cpe:2.3:o:canonical:ubuntu_linux:22.04:"),
])
def test_distribution_comes_from_the_image_os_release(release, purl, cpe):
    inventory = {"python_packages": [], "dpkg_packages": [{"name": "libc6", "version": "2.41-12", "arch": "amd64"}]}
    doc = sbom(release, inventory)
    assert locators(doc, "pkg:deb/") == [purl]
    assert locators(doc, "cpe:")[0].startswith(cpe)
    assert validate_full_spdx_document(JsonLikeDictParser().parse(doc)) == []


def test_an_os_release_naming_no_distribution_is_an_error():
    with pytest.raises(StepFailed, match="names no distribution"):
        sbom('NAME="Something"\n')


def test_lock_mismatches_name_each_lock():
    inside = {"requirements.lock": "a" * 64, "torch.lock": "b" * 64}
    assert attestations.lock_mismatches(inside, {**inside, "ops.lock": "c" * 64}, "locks/t/") == []
    wrong = attestations.lock_mismatches(inside, {"requirements.lock": "d" * 64}, "locks/t/")
    assert wrong == [f"requirements.lock differs: the image's is sha256:{'a' * 12}…, locks/t/requirements.lock is "
                     f"sha256:{'d' * 12}…", "torch.lock is in the image but not in locks/t/"]
    assert attestations.lock_mismatches({}, inside, "locks/t/") == [
        "the image carries no lock files in /opt/train-image/locks/"]


def test_verify_summary_counts_packages():
    lines = attestations.summary(sbom(), None, DIGEST)
    assert lines[-1] == "sbom: SPDX-2.3, 68 Python and 162 OS packages (debian 12) with hashes"


def provenance(audit: dict | None) -> dict:
    return attestations.provenance(
        repository="ghcr.io/train-images/train", digest=DIGEST, entry={"tag": "t", "base": "debian:bookworm-slim"},
        locks={"requirements.lock": "a" * 64}, source={"uri": "https://github.com/x/y", "revision": "abc"},
        build={}, gate={"passed": True, "mode": "cpu"}, builder_id="local:test", started=None, finished="now",
        audit=audit)


def test_the_provenance_carries_the_audit_and_verify_shows_it():
    verdict = {"audited_on": "2026-12-04", "passed": True, "max_severity": "high",
               "summary": "audit 2026-12-04: passed; 45/68 Python packages audited, 0 known vulnerabilities"}
    statement = provenance(verdict)
    dep = statement["predicate"]["buildDefinition"]["resolvedDependencies"][0]
    assert dep["uri"] == "https://github.com/x/y/blob/abc/locks/t/requirements.lock"
    assert dep["annotations"]["read_from"] == "/opt/train-image/locks/requirements.lock in the image"
    assert verdict["summary"] in attestations.summary(None, statement, DIGEST)
    assert "audit: none recorded (published without --max-severity)" in attestations.summary(
        None, provenance(None), DIGEST)


OTHER = "sha256:" + "cd" * 32
SMALL = {"python_packages": [], "dpkg_packages": []}


def test_documents_publish_writes_are_bound_to_their_digest():
    assert attestations.sbom_binding(sbom(inventory=SMALL), DIGEST) is None
    assert attestations.provenance_binding(provenance(None), DIGEST) is None


def test_another_images_sbom_is_not_summarised_for_this_digest():
    """The SBOM of image B stored beside image A: verify must not count B's packages as A's."""
    lines = attestations.summary(sbom(inventory=SMALL), None, OTHER)
    assert lines[-1] == (f"sbom: NOT for this digest, ignored: the SBOM describes sha256:{'ab' * 6}…, "
                         f"not this image {OTHER[:19]}…")


def test_another_images_provenance_shows_no_builder_and_no_gate():
    """A provenance naming another digest: its "built by" and its GPU gate are another image's, never shown."""
    lines = attestations.summary(None, provenance(None), OTHER)
    assert lines[0].startswith("provenance: NOT for this digest, ignored: the provenance is for sha256:abab")
    assert not any("built by" in line or line.startswith("gate:") for line in lines)


@pytest.mark.parametrize("change", [
    lambda d: d["packages"][0].update(name=f"ghcr.io/train-images/train@{OTHER}"),  # checksum ours, name another's
    lambda d: d["relationships"].pop(0),                                              # describes nothing
    lambda d: d.update(packages="junk", relationships=[{"relatedSpdxElement": ["x"]}]),  # hostile shapes
])
def test_an_sbom_that_does_not_describe_this_image_exactly_is_refused(change):
    doc = sbom(inventory=SMALL)
    change(doc)
    assert attestations.sbom_binding(doc, DIGEST).startswith("the SBOM describes")


@pytest.mark.parametrize("subject", [[], [{"digest": {"sha256": DIGEST[7:]}}, {"digest": {"sha256": OTHER[7:]}}],
                                     [{"digest": "junk"}]])
def test_a_provenance_naming_anything_but_this_digest_alone_is_refused(subject):
    statement = {**provenance(None), "subject": subject}
    assert attestations.provenance_binding(statement, DIGEST).startswith("the provenance is for")
    assert attestations.provenance_binding({**statement, "predicateType": "x"}, DIGEST) == (
        "the provenance is not an SLSA provenance statement")


def test_the_cyclonedx_twin_validates_and_is_bound_to_its_digest_only():
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    inventory = json.loads((DATA / "inventory-bookworm.json").read_text())
    doc = attestations.cyclonedx("cu130-torch2.13-bookworm", "127.0.0.1:5000/train", DIGEST, inventory,
                                 "2026-12-04T00:00:00Z", attestations.parse_os_release(BOOKWORM))
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc)) is None
    assert attestations.cyclonedx_binding(doc, DIGEST) is None
    other = "sha256:" + "cd" * 32
    assert attestations.cyclonedx_binding(doc, other).startswith("the CycloneDX SBOM describes")
    assert attestations.cyclonedx_binding({"metadata": {}}, DIGEST) == "the CycloneDX SBOM names no image"
    spdx = sbom(repository="127.0.0.1:5000/train")
    assert len(doc["components"]) == len(spdx["packages"]) - 1  # the OS and every package; the image is the subject
    assert {c["purl"] for c in doc["components"] if "purl" in c} == set(locators(spdx, "pkg:")) - {
        spdx["packages"][0]["externalRefs"][0]["referenceLocator"]}
    assert next(c for c in doc["components"] if c["type"] == "operating-system")["cpe"].startswith(
        "cpe:2.3:o:debian:debian_linux:12:")
