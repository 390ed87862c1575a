"""The workflow executed here: every hosted job's `run:` steps, in order, in a clean clone, per event.

pull_request, push and schedule run against a real registry on 127.0.0.1 that wants a login (like private
packages): `plan` and the image job must log in before they read it. `image:` steps (build, gate, publish,
sign, diff, re-lock in the base image) need an engine and a multi-GB build: skipped by that rule here, and
covered by tests/integration. tests/workflow/harness.py says what stands for what.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.integration import registry_fixture
from tests.workflow import harness
from tests.workflow.conftest import TOKEN

EVENTS = ("pull_request", "push", "schedule")
pytestmark = pytest.mark.skipif(not registry_fixture.available(), reason="needs Debian's docker-registry")


@pytest.fixture(scope="session")
def runs(venv, local_registry, tmp_path_factory):
    """Each event's run of every hosted job but `check` (which is event-independent: run once, below)."""
    workflow, done = harness.load(), {}

    def run(event: str) -> dict[str, harness.JobResult]:
        if event not in done:
            where = tmp_path_factory.mktemp(f"run-{event}")
            # The schedule runs as the upstream repository with its GPU runners; push and pull_request as a fresh
            # fork that has none (no GPU_RUNNERS variable).
            variables = {"GPU_RUNNERS": "true"} if event == "schedule" else {}
            ev = harness.Event(event, registry=f"{local_registry.host}/acme", token=TOKEN, variables=variables)
            done[event] = harness.Runner(workflow, ev, where, venv).run(only=set(workflow["jobs"]) - {"check"})
        return done[event]

    return run


def test_check_job_runs_every_step_and_is_the_same_for_every_event(venv, local_registry, tmp_path):
    job = harness.load()["jobs"]["check"]
    # Nothing in `check` depends on the event (no `if`, no expression): one run stands for all three.
    assert "if" not in job and "${{" not in json.dumps(job["steps"]) and "GITHUB_EVENT" not in json.dumps(job)
    ev = harness.Event("pull_request", registry=f"{local_registry.host}/acme", token=TOKEN)
    result = harness.Runner(harness.load(), ev, tmp_path, venv).run(only={"check"})["check"]
    assert result.ran() == [harness.job_name(s) for s in job["steps"]], result.skipped()
    assert [s["run"] for s in job["steps"] if "run" in s] == ["make venv", "make validate", "make lint", "make unit"]
    lint = next(s for s in result.steps if s.name.startswith("make lint"))
    assert "hadolint --failure-threshold warning" in lint.output


def jobs_for(event: str) -> set[str]:
    return {"pull_request": {"plan", "pr-image"}, "push": {"plan", "hosted-image", "catalog"},
            "schedule": {"plan", "hosted-image", "catalog", "propose", "newest-docker"}}[event]


@pytest.mark.parametrize("event", EVENTS)
def test_each_event_runs_its_hosted_jobs_cleanly(runs, event):
    result = runs(event)
    assert set(result) == jobs_for(event)
    for job in result.values():
        for step in job.steps:
            assert step.outcome == "ran" or step.outcome.startswith("skipped"), step
        engine_steps = [s for s in job.steps if s.name.startswith(harness.ENGINE_PREFIX)]
        assert all(s.outcome != "ran" for s in engine_steps), "no image is built here"


def planned_tags(outputs: dict, runner: str) -> list[str]:
    return [entry["tag"] for entry in json.loads(outputs[runner])["include"]]


def test_pull_request_plans_the_ci_entries_without_reading_the_registry(runs):
    plan = runs("pull_request")["plan"]
    assert "login (before the plan reads published labels; private packages refuse anonymous reads)" \
        in " ".join(plan.skipped())
    from builder.model import matrix

    m = matrix.load(ROOT / "matrix.yaml")
    assert planned_tags(plan.outputs, "hosted") == [e.tag for e in m.entries if "gpu" not in e.runner]
    pr = runs("pull_request")["pr-image"]
    assert pr.ran()[-1] == "make venv" and len(pr.skipped()) == 2  # build and gate: `image:` steps


def test_push_logs_in_before_the_plan_reads_the_registry(runs):
    plan = runs("push")["plan"]
    assert plan.ran().index("plan") > next(i for i, n in enumerate(plan.ran()) if n.startswith("login"))
    text = plan.log()
    assert "cannot read" not in text and "inputs changed: planned" in text, text[-3000:]
    # A fork without GPU runners: no GPU job is queued for a runner that does not exist; each entry left out is
    # named with how to enable it, and the hosted entries are planned as always.
    from builder.model import matrix

    m = matrix.load(ROOT / "matrix.yaml")
    assert planned_tags(plan.outputs, "gpu") == []
    assert planned_tags(plan.outputs, "hosted") == [e.tag for e in m.entries if "gpu" not in e.runner]
    for e in m.entries:
        if "gpu" in e.runner:
            assert f"{e.tag}: gated on a GPU runner" in text and "set GPU_RUNNERS=true" in text, text[-3000:]
    image = runs("push")["hosted-image"]
    moved = next(s for s in image.steps if s.name.startswith("moved"))
    assert "build=true" in moved.output and "previous=\n" in moved.output  # nothing published yet
    assert "cannot read" not in moved.output, moved.output
    # Nothing published, so everything is built: build, gate, publish and sign are reached (their `if` holds)
    # and stop only at the harness's `image:` rule; the diff has no previous image; the cosign action is skipped.
    outcome = {s.name.split(" (")[0]: s.outcome for s in image.steps}
    for name in ("image: build", "image: smoke gate", "image: publish", "image: sign the digest and its attestations"):
        assert "`image:` step" in outcome[name], (name, outcome[name])
    assert "`if` is false" in outcome["image: what moved"]
    # The audit of the locked packages runs before the build, against the index's real data, and passes.
    audit = next(s for s in image.steps if s.name.startswith("audit the locked packages"))
    assert audit.outcome == "ran" and "audit locks/" in audit.output and ": passed;" in audit.output, audit.output


def test_schedule_plans_every_entry_for_a_refresh(runs):
    plan = runs("schedule")["plan"]
    from builder.model import matrix

    m = matrix.load(ROOT / "matrix.yaml")
    assert sorted(planned_tags(plan.outputs, "hosted") + planned_tags(plan.outputs, "gpu")) == \
        sorted(e.tag for e in m.entries)
    image = runs("schedule")["hosted-image"]
    relock = next(s for s in image.steps if "re-lock" in s.name)
    assert relock.outcome.startswith("skipped") and "image:" in relock.outcome
    moved = next(s for s in image.steps if s.name.startswith("moved"))
    assert "build=true" in moved.output and "inputs changed: planned" in moved.output, moved.output
    assert "cannot read" not in moved.output, "the job logged in before reading"
    build = next(s for s in image.steps if s.name == "image: build")
    assert "`image:` step" in build.outcome, "nothing published yet: the refresh builds"


def test_expressions_are_evaluated_as_github_does():
    ctx = {"steps": {"moved": {"outputs": {"build": "true"}}}, "github": {"event_name": "push"}, "matrix": {"gpu": False}}
    assert harness.evaluate("steps.moved.outputs.build == 'true'", ctx) is True
    assert harness.evaluate("steps.missing.outputs.build == 'true'", ctx) is False
    assert harness.evaluate("github.event_name != 'pull_request' && !cancelled()", ctx) is True
    assert harness.interpolate("${{ matrix.gpu && '--gpus=all' || '--cpu' }}", ctx) == "--cpu"
    assert harness.evaluate("fromJSON('{\"include\": []}').include[0] != null", ctx) is False


def test_schedule_proposes_an_entry_for_new_releases_and_stops_before_github(runs):
    """The `propose` job against the real PyPI: `propose` runs and says what it did; a proposed entry is rendered
    (the lock needs the base image: `image:`), and the push and pull request are skipped (`github:`)."""
    job = runs("schedule")["propose"]
    outcome = {s.name.split(" (")[0]: s for s in job.steps}
    assert job.ran()[:3] == ["actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683",
                             "actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065", "make venv"]
    said = outcome["propose"].output
    assert outcome["propose"].outcome == "ran" and ("appended" in said or "nothing" in said), said
    proposed = "appended" in said
    assert "`image:` step" in outcome["image: lock the proposed entry"].outcome if proposed else \
        "`if` is false" in outcome["image: lock the proposed entry"].outcome
    assert (outcome["render the proposed entry"].outcome == "ran") == proposed
    push = outcome["github: push propose/<tag> and open its pull request"].outcome
    assert ("`github:` step" in push) if proposed else ("`if` is false" in push), push
    assert "propose" not in runs("push"), "only the schedule (and a dispatch) proposes"
