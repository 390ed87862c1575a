"""The two CI images as a security team scans them: their SBOM validates as SPDX 2.3 with a canonical identifier
for every package, and `builder audit` runs on each against the real package index, with a valid waiver (passes)
and an expired one (fails, naming the waiver's line). Waiver and --max-severity logic: tests/unit/test_audit.py."""

from __future__ import annotations

import json

import pytest
from packageurl import PackageURL
from spdx_tools.spdx.parser.jsonlikedict.json_like_dict_parser import JsonLikeDictParser
from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

from builder.boundary import engine, inspect
from builder.model import attestations, matrix
from tests.conftest import ROOT, run_cli
from tests.unit.test_attestations import ntia_gaps

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.usefixtures("require_docker")]
WAIVER = """waivers:
  - id: PYSEC-2000-1
    package: pip
    reason: "a test waiver: pip is not used at run time by training code"
    expires: {expires}
severities: []
"""


def sbom_of(ref: str) -> dict:
    image = engine.sdk().images.get(ref)
    os_release = attestations.parse_os_release(inspect.read_os_release(image))
    return attestations.sbom(ref.rsplit(":", 1)[1], ref.rsplit(":", 1)[0], image.id, inspect.inventory(image.id),
                             "2026-12-04T00:00:00Z", os_release)


def check_image(tag: str, expires: str, tmp_path, monkeypatch) -> tuple[int, dict, dict]:
    """(audit exit code, audit verdict, SBOM) of the CI image `tag`, the audit's report kept out of the project."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("BUILDER_REPORTS", str(tmp_path))
    waivers, verdict = tmp_path / "waivers.yaml", tmp_path / "audit.json"
    waivers.write_text(WAIVER.format(expires=expires))
    code = run_cli("audit", tag, "--waivers", str(waivers), "--json", str(verdict))
    return code, json.loads(verdict.read_text()), sbom_of(f"ghcr.io/train-images/train:{tag}")


@pytest.mark.parametrize("build,expires,code", [
    ("ci_build", "2000-01-01", 1), pytest.param("ci_build_cuda12", "2099-12-31", 0, marks=pytest.mark.cuda12_image)])
def test_each_ci_image_is_scannable_and_audited(build, expires, code, request, tmp_path, monkeypatch, capsys):
    tag = request.getfixturevalue(build)["report"]["tag"]
    got, verdict, sbom = check_image(tag, expires, tmp_path, monkeypatch)
    assert validate_full_spdx_document(JsonLikeDictParser().parse(sbom)) == []
    assert ntia_gaps(sbom, tmp_path) == {}  # every package of the real image names its supplier
    purls = [r["referenceLocator"] for p in sbom["packages"] for r in p["externalRefs"]
             if r["referenceType"] == "purl"]
    assert all(PackageURL.from_string(p).to_string() == p for p in purls)
    debian = "debian-12" if "bookworm" in tag else "debian-13"
    assert all(f"distro={debian}" in p for p in purls if p.startswith("pkg:deb/"))
    python = [p for p in purls if p.startswith("pkg:pypi/")]
    torch = next(e for e in matrix.load(ROOT / "matrix.yaml").entries if e.tag == tag).pins["torch"]
    assert f"pkg:pypi/torch@{torch}" in python  # the entry's own pin, whichever CUDA line CI builds
    assert verdict["python_packages"] == len(python)  # the audit covers what the SBOM lists
    assert set(verdict["not_audited"]) <= {f"{p['name']} {p['versionInfo']}" for p in sbom["packages"]}
    out = capsys.readouterr()
    assert "OS packages: not audited" in out.out and verdict["summary"] in out.out
    assert got == code and verdict["passed"] is (code == 0)
    if code:  # the expired waiver fails the audit, naming where it is
        assert f"waivers.yaml:2: waiver for PYSEC-2000-1 (pip) expired on {expires}" in out.err
    print(f"\n{tag}: {len(purls)} package URLs; {verdict['summary']}")
