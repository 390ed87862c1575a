"""The GitHub Actions workflows: valid against GitHub's schema, and shaped like the pipeline we promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
PIPELINE = ROOT / ".github" / "workflows" / "images.yml"


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # PyYAML reads the bare key `on` as True (YAML 1.1); GitHub reads it as "on".
    if True in data:
        data["on"] = data.pop(True)
    return data


def needs(job: dict) -> list[str]:
    value = job.get("needs", [])
    return [value] if isinstance(value, str) else list(value)


def test_there_are_workflows():
    assert PIPELINE in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_valid_against_github_schema(path):
    tool = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run([str(tool), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege_and_pinned_actions(path):
    data = load(path)
    assert data.get("permissions") == {}, "top-level `permissions: {}`; jobs ask for what they need"
    for name, job in data["jobs"].items():
        assert "permissions" in job, f"job {name} must state its permissions"
        assert "write-all" not in str(job["permissions"])
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not uses.startswith("./"):
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), f"{name}: {uses} is not pinned by SHA"
    for line in path.read_text().splitlines():
        if "uses:" in line and "@" in line and not line.strip().startswith("#"):
            assert re.search(r"#\s*v\d", line), f"say which version a SHA is: {line.strip()}"


def test_pipeline_chain():
    jobs = load(PIPELINE)["jobs"]
    for job in ("plan", "build", "smoke", "publish"):
        assert job in jobs, f"missing job {job}"
    assert "plan" in needs(jobs["build"])
    assert "build" in needs(jobs["smoke"])
    assert "smoke" in needs(jobs["publish"])
    assert "check" in needs(jobs["build"]), "build only after validate/render --check/lint"
    plan_steps = " ".join(str(s.get("run", "")) for s in jobs["plan"]["steps"])
    assert "python -m builder matrix --format github" in plan_steps


def test_pipeline_runs_heavy_jobs_on_matrix_runners_and_checks_on_hosted():
    jobs = load(PIPELINE)["jobs"]
    for job in ("build", "smoke", "publish"):
        assert "matrix.runner" in str(jobs[job]["runs-on"])
        assert "needs.plan.outputs.matrix" in str(jobs[job]["strategy"]["matrix"])
    check_runs = " ".join(str(s.get("run", "")) for s in jobs["check"]["steps"])
    assert jobs["check"]["runs-on"].startswith("ubuntu-")
    for command in ("validate", "render --check", "ruff", "hadolint"):
        assert command in check_runs


def test_publish_only_on_default_branch_after_a_passing_gate():
    jobs = load(PIPELINE)["jobs"]
    publish = jobs["publish"]
    assert "pull_request" in publish["if"] and "default_branch" in publish["if"]
    assert publish["permissions"] == {"contents": "read", "packages": "write"}
    steps = publish["steps"]
    gate = next(i for i, s in enumerate(steps) if s.get("id") == "gate")
    push = next(i for i, s in enumerate(steps) if "builder publish" in str(s.get("run", "")))
    assert gate < push and "passed" in steps[push]["if"]
    assert "--password-stdin" in steps[push]["run"] and "REGISTRY_TOKEN" not in steps[push]["run"].split("|")[1]
    assert any("GITHUB_STEP_SUMMARY" in str(s.get("run", "")) and "digest" in str(s.get("run", ""))
               for s in steps[push:])
    for name, job in jobs.items():
        if name != "publish":
            assert "write" not in str(job["permissions"]), f"{name} needs no write access"


def test_triggers_and_concurrency():
    data = load(PIPELINE)
    assert "schedule" in data["on"] and data["on"]["schedule"][0]["cron"].split()[-1] not in ("*",)
    assert "pull_request" in data["on"]
    concurrency = data["concurrency"]
    assert "pull_request" in concurrency["cancel-in-progress"]
    assert "github.ref" in concurrency["group"]
