"""builder audit's decisions without the network: the index's answers (vulndb.fetch_json stubbed with documents
shaped as the JSON API serves them), waivers (valid, expired, malformed) and --max-severity."""

from __future__ import annotations

import datetime as dt

import pytest

from builder.boundary import vulndb
from builder.errors import MatrixError
from builder.model import audit

TODAY = dt.date(2026, 12, 4)
VULN = {"id": "PYSEC-2026-7", "aliases": ["CVE-2026-1234", "GHSA-aaaa-bbbb-cccc"], "fixed_in": ["2.32.0"],
        "link": "https://osv.dev/vulnerability/PYSEC-2026-7", "details": "..."}
FOUND = {("requests", "2.31.0"): {"data": "release", "vulnerabilities": [VULN], "why": ""},
         ("torch", "2.13.0"): {"data": "none", "vulnerabilities": [], "why": "no per-release data"}}


def rules(tmp_path, text: str) -> dict:
    path = tmp_path / "waivers.yaml"
    path.write_text(text)
    return audit.load(path)


WAIVER = """waivers:
  - id: CVE-2026-1234
    package: Requests
    reason: "only used to talk to the local registry over loopback"
    expires: {expires}
severities:
  - id: GHSA-aaaa-bbbb-cccc
    level: high
    source: https://github.com/advisories/GHSA-aaaa-bbbb-cccc
"""


def test_a_valid_waiver_covers_the_finding_by_alias_and_package(tmp_path):
    verdict = audit.assess(FOUND, rules(tmp_path, WAIVER.format(expires="2027-01-31")), TODAY, "none")
    assert verdict["passed"] is True and verdict["waived"] == 1
    row = verdict["findings"][0]
    assert (row["package"], row["id"], row["level"]) == ("requests", "PYSEC-2026-7", "high")
    assert row["waived"] == {"reason": "only used to talk to the local registry over loopback", "expires": "2027-01-31"}
    assert verdict["not_audited"] == {"torch 2.13.0": "no per-release data"}
    assert audit.summary(verdict) == ("audit 2026-12-04: passed; 1/2 Python packages audited, 1 known "
                                      "vulnerabilities (1 waived); OS packages not audited")


def test_an_expired_waiver_fails_the_audit_naming_its_line(tmp_path):
    verdict = audit.assess(FOUND, rules(tmp_path, WAIVER.format(expires="2026-12-03")), TODAY, None)
    assert verdict["passed"] is False
    assert audit.problems(verdict, "waivers.yaml") == [
        "waivers.yaml:2: waiver for CVE-2026-1234 (requests) expired on 2026-12-03: renew it with a new reason and "
        "date, or remove it once the package is upgraded"]


@pytest.mark.parametrize("max_severity,passed", [("medium", False), ("high", True), ("critical", True), (None, True)])
def test_max_severity_compares_the_recorded_level(tmp_path, max_severity, passed):
    text = WAIVER.format(expires="2027-01-31").split("waivers:")[0] + "waivers: []\n" + WAIVER.split("\n", 5)[5]
    verdict = audit.assess(FOUND, rules(tmp_path, text), TODAY, max_severity)
    assert verdict["passed"] is passed and verdict["waived"] == 0
    if not passed:
        assert verdict["above_max_severity"] == ["requests 2.31.0: PYSEC-2026-7 (high)"]


def test_an_unrated_vulnerability_is_above_every_level(tmp_path):
    verdict = audit.assess(FOUND, rules(tmp_path, "waivers: []\nseverities: []\n"), TODAY, "critical")
    assert verdict["passed"] is False and verdict["findings"][0]["level"] == "unrated"
    assert "open: 1 unrated" in audit.summary(verdict)


@pytest.mark.parametrize("text,message", [
    ("waivers:\n  - id: CVE-2026-1\n    package: x\n    expires: 2027-01-01\n", r"waivers.yaml:2: waivers\[0\]: needs"),
    ("waivers:\n  - id: CVE-2026-1\n    package: x\n    reason: because it is fine\n    expires: soon\n",
     r":5: waivers\[0\].expires: 'soon' is not a date"),
    ("waivers:\n  - id: CVE-2026-1\n    package: x\n    reason: short\n    expires: 2027-01-01\n",
     r":4: waivers\[0\].reason: must be one line"),
    ("severities:\n  - id: CVE-2026-1\n    level: severe\n    source: https://x.org/a\n",
     r":3: severities\[0\].level: 'severe' is not a level"),
    ("severities:\n  - id: CVE-2026-1\n    level: high\n    source: my memory\n", r":4: severities\[0\].source"),
    ("waiver: []\n", r":1: waivers: expected a mapping"),
])
def test_a_malformed_waivers_file_names_line_and_field(tmp_path, text, message):
    with pytest.raises(MatrixError, match=message):
        rules(tmp_path, text)


def test_no_waivers_file_is_no_waivers(tmp_path):
    assert audit.load(tmp_path / "absent.yaml") == {"waivers": [], "severities": {}}


def test_the_repository_waivers_file_is_valid():
    assert audit.load(audit.DEFAULT_WAIVERS) is not None


@pytest.fixture
def index(monkeypatch):
    """The index's JSON API as a dict of URL -> document (absent: 404)."""
    docs: dict[str, dict] = {}
    monkeypatch.setattr(vulndb, "fetch_json", docs.get)
    return docs


def test_the_release_document_is_the_answer_when_served(index):
    index[f"{vulndb.INDEX}/requests/2.31.0/json"] = {"info": {"version": "2.31.0"}, "vulnerabilities": [VULN]}
    assert vulndb.release("requests", "2.31.0") == {"data": "release", "vulnerabilities": [VULN], "why": ""}


def test_a_mirror_without_release_documents_answers_only_for_the_latest_release(index):
    index[f"{vulndb.INDEX}/torch/json"] = {"info": {"version": "2.15.0"}, "vulnerabilities": [VULN]}
    assert vulndb.release("torch", "2.15.0")["vulnerabilities"] == [VULN]
    older = vulndb.release("torch", "2.13.0")
    assert older["data"] == "none" and older["vulnerabilities"] == [] and "2.15.0" in older["why"]
    assert vulndb.releases([("nothere", "1.0")]) == {("nothere", "1.0"): {"data": "none", "vulnerabilities": [],
                                                                          "why": "not on the index"}}


def test_audit_lock_reads_the_committed_locks_and_stops_a_refresh_above_the_threshold(index, tmp_path, monkeypatch,
                                                                                      capsys):
    """`audit TAG --lock` (the scheduled refresh's step before a build): the pins of locks/TAG/, no engine; a
    vulnerability above --max-severity in a locked release fails it, naming the package; no image report written."""
    from tests.conftest import ROOT, run_cli

    monkeypatch.chdir(ROOT)
    tag = "cu130-torch2.13-bookworm"
    peft = next(line.split("==")[1].split()[0] for line in (ROOT / "locks" / tag / "requirements.lock").read_text()
                .splitlines() if line.startswith("peft=="))
    index[f"{vulndb.INDEX}/peft/{peft}/json"] = {"info": {"version": peft}, "vulnerabilities": [
        {**VULN, "id": "GHSA-pppp-eeee-ffff", "aliases": [], "fixed_in": ["99.0"]}]}
    waivers = tmp_path / "waivers.yaml"
    waivers.write_text("waivers: []\nseverities:\n  - id: GHSA-pppp-eeee-ffff\n    level: high\n"
                       "    source: https://github.com/advisories/GHSA-pppp-eeee-ffff\n")
    report = ROOT / "build" / "reports" / f"{tag}.audit.json"
    before = report.read_bytes() if report.exists() else None
    assert run_cli("audit", tag, "--lock", "--waivers", str(waivers), "--max-severity", "medium") == 1
    out, err = capsys.readouterr()
    assert f"peft {peft}: GHSA-pppp-eeee-ffff (high)" in err and "Traceback" not in err
    assert "| peft " in out and "99.0" in out
    assert (report.read_bytes() if report.exists() else None) == before
    # The same lock under a threshold the finding is within passes.
    assert run_cli("audit", tag, "--lock", "--waivers", str(waivers), "--max-severity", "high") == 0


def test_audit_lock_of_an_image_reference_is_a_user_error(capsys):
    from tests.conftest import run_cli

    assert run_cli("audit", "ghcr.io/acme/train:x", "--lock") == 2
    assert "not a matrix tag" in capsys.readouterr().err
