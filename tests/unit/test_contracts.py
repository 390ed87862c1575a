"""The builder↔smoke contract: every JSON one side writes and the other reads has a schema, kept with the
writer (builder/schemas/, smoke/schemas/), and real outputs are held to it. The integration tests do the same
for the reports of a real build, gate, publish and repro."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from builder import reports
from builder.boundary import gate
from builder.errors import StepFailed, UserError
from builder.model import matrix
from builder.steps import render
from tests.conftest import ROOT

BUILDER_SCHEMAS = sorted((ROOT / "builder/schemas").glob("*.schema.json"))
SMOKE_SCHEMAS = sorted((ROOT / "smoke/schemas").glob("*.schema.json"))


@pytest.mark.parametrize("path", BUILDER_SCHEMAS + SMOKE_SCHEMAS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_schemas_are_valid_json_schema(path):
    jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))


def test_every_report_step_has_a_schema():
    assert {p.name.split(".")[0] for p in BUILDER_SCHEMAS} >= {*reports.STEPS, "facts"}


@pytest.mark.parametrize("path", sorted((ROOT / "dockerfiles").glob("*/image.json")), ids=lambda p: p.parent.name)
def test_committed_facts_files_match_the_schema(path):
    assert reports.problems("facts", json.loads(path.read_text())) == []


def test_rendered_facts_match_the_schema():
    for entry in matrix.load(ROOT / "matrix.yaml").entries:
        assert reports.problems("facts", render.facts(entry)) == [], entry.tag


def test_a_check_result_matches_the_schema():
    sys.path.insert(0, str(ROOT))
    from smoke import report

    ok = report.Result("env", "cpu")
    ok.add("python version", True, "3.11.2")
    bad = report.Result("train", "cpu")
    bad.add("loss fell", False, "5.5 -> 5.6")
    bad.diagnose("ImportError: libcudnn.so.8: cannot open shared object file")
    for result in (ok, bad):
        assert reports.problems("check", result.finish().to_dict(), smoke=True) == []


def _gate_dir(tmp_path: Path, all_json: dict) -> Path:
    (tmp_path / "all.json").write_text(json.dumps(all_json))
    (tmp_path / "env.json").write_text(json.dumps({"name": "env", "passed": True, "mode": "cpu", "seconds": 1.0,
                                                  "summary": "ok", "diagnosis": [], "figures": {}, "items": []}))
    return tmp_path


def test_builder_reads_a_valid_gate_output(tmp_path):
    verdict = {"passed": True, "mode": "cpu", "seconds": 20.0, "checks": [{"name": "env", "passed": True}]}
    result, per_check, broken = gate.read_gate_output(_gate_dir(tmp_path, verdict))
    assert result == verdict and set(per_check) == {"env"} and broken is None


def test_scratch_files_of_the_checks_are_not_results(tmp_path):
    """train and nccl leave their ranks' results (.train-adamw.rank0.json) beside the check results: not part
    of the contract, so they must neither be read as results nor fail it (found by the CUDA 12 gate in CI)."""
    verdict = {"passed": True, "mode": "cpu", "seconds": 20.0, "checks": [{"name": "env", "passed": True}]}
    out = _gate_dir(tmp_path, verdict)
    (out / ".train-adamw.rank0.json").write_text(json.dumps({"items": [], "figures": {}}))
    result, per_check, broken = gate.read_gate_output(out)
    assert result == verdict and set(per_check) == {"env"} and broken is None


def test_builder_refuses_gate_output_that_breaks_the_contract(tmp_path):
    # `passed` as a string would read as truthy: exactly what a schema is for.
    verdict = {"passed": "yes", "mode": "cpu", "seconds": 20.0, "checks": []}
    result, _, broken = gate.read_gate_output(_gate_dir(tmp_path, verdict))
    assert result is None and "smoke/schemas" in broken and "passed" in broken


def test_report_writer_refuses_a_report_that_breaks_its_schema(project):
    with pytest.raises(StepFailed, match="breaks its schema"):
        reports.write("cu130-torch2.13-bookworm", "build", {"result": "built"})
    assert not (project / "build/reports/cu130-torch2.13-bookworm.build.json").exists()


def test_report_reader_refuses_a_foreign_or_edited_report(project):
    target = project / "build/reports/cu130-torch2.13-bookworm.smoke.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({"tag": "cu130-torch2.13-bookworm", "step": "smoke", "passed": True}))
    with pytest.raises(UserError, match="not a valid smoke report"):
        reports.read("cu130-torch2.13-bookworm", "smoke")
    good = {"tag": "other", "step": "smoke", "image": "x", "image_id": "sha256:" + "1" * 64, "passed": True,
            "mode": "cpu", "checks": [], "finished_at": "2026-12-03T00:00:00Z"}
    target.write_text(json.dumps(good))
    with pytest.raises(UserError, match="report of tag 'other'"):
        reports.read("cu130-torch2.13-bookworm", "smoke")
