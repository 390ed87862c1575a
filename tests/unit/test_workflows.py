"""The GitHub Actions workflows: valid against GitHub's schema, and shaped like the pipeline we promise."""

from __future__ import annotations

import re
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
def test_valid_against_github_schema(path, capsys):
    from check_jsonschema import main  # in-process: its schema is vendored, no network and no child process

    with pytest.raises(SystemExit) as done:
        main(["--builtin-schema", "vendor.github-workflows", str(path)])
    assert done.value.code == 0, capsys.readouterr()


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


def _steps_text(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", "")) for step in job.get("steps", []))


def reachable_from_pull_request(jobs: dict) -> set[str]:
    """Jobs a pull_request event can start: their `if` does not exclude the event and all they need can run."""
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, job in jobs.items():
            if name in out:
                continue
            condition = str(job.get("if", "")).replace('"', "'")
            # Excluded: `!= 'pull_request'`, or a condition naming only other events (`== 'schedule' || …`).
            only = re.fullmatch(r"(\$\{\{)?\s*github\.event_name == '\w+'(\s*\|\|\s*github\.event_name == '\w+')*"
                                r"\s*(\}\})?", condition.strip())
            excluded = "github.event_name != 'pull_request'" in condition or bool(only and "'pull_request'"
                                                                                    not in condition)
            if not excluded and all(n in out for n in needs(job)):
                out.add(name)
                changed = True
    return out


def self_hosted(job: dict) -> bool:
    return "self-hosted" in str(job.get("runs-on"))


def test_no_self_hosted_job_is_reachable_from_a_pull_request():
    data = load(PIPELINE)
    assert "pull_request" in data["on"], "pull requests are checked (on hosted runners)"
    jobs = data["jobs"]
    on_gpu = {n for n, j in jobs.items() if self_hosted(j)}
    assert on_gpu, "the GPU entries need a self-hosted job"
    assert not on_gpu & reachable_from_pull_request(jobs)
    assert {"plan", "check", "pr-image"} <= reachable_from_pull_request(jobs), "PRs still get the hosted checks"


def test_no_job_holding_an_oidc_token_is_reachable_from_a_pull_request():
    """Only jobs in the branch-protected `publish` environment may mint the signing identity."""
    jobs = load(PIPELINE)["jobs"]
    signing = {n for n, j in jobs.items() if (j.get("permissions") or {}).get("id-token") == "write"}
    assert signing == {"hosted-image", "gpu-image"}
    assert not signing & reachable_from_pull_request(jobs)
    assert all(jobs[n].get("environment") == "publish" for n in signing)


def test_a_pull_request_cannot_choose_runner_labels():
    """Labels are literals in the workflow; the plan (built from a PR's own matrix.yaml) only says gpu or not."""
    data = load(PIPELINE)
    for name, job in data["jobs"].items():
        assert "${{" not in str(job["runs-on"]), f"{name}: runs-on must be a literal from this file's allowlist"
    assert "matrix.runner" not in PIPELINE.read_text()
    assert data["jobs"]["gpu-image"]["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]


def test_build_gate_publish_and_sign_in_one_job_without_image_artifacts():
    text = PIPELINE.read_text()
    assert "docker save" not in text and "docker load" not in text and "image.tar" not in text
    for name in ("hosted-image", "gpu-image"):
        steps = load(PIPELINE)["jobs"][name]["steps"]
        order = [next(i for i, s in enumerate(steps) if marker in str(s.get("run", "")))
                 for marker in ("builder login", "builder plan", "builder build", "builder smoke", "builder publish",
                                "builder sign")]
        assert order == sorted(order), f"{name}: login, moved?, build, gate, publish, sign — in that order"
        for step in steps:
            if any(verb in str(step.get("run", "")) for verb in ("builder publish", "builder sign")):
                assert "refs/heads/main" in step["if"], "only main publishes and signs (the documented identity)"
        login = next(s for s in steps if "builder login" in str(s.get("run", "")))
        assert "--password-stdin" in login["run"] and "REGISTRY_TOKEN" not in login["run"].split("|")[1]


def test_every_step_is_one_make_target_or_one_builder_command():
    for name, job in load(PIPELINE)["jobs"].items():
        for step in job["steps"]:
            run = step.get("run")
            if run is None:
                continue
            assert "\n" not in run.strip(), f"{name}: one command per step: {run!r}"
            command = run.split("|")[-1].removeprefix("set -f;").strip()
            # `sudo … make X`: still one target; the engine jobs start a private dockerd, which needs root.
            assert re.fullmatch(r"(sudo --preserve-env=[A-Z_,]+ )?make [a-z0-9-]+|\.venv/bin/python -m builder [a-z-]+( .*)?",
                                command), f"{name}: {run}"


def test_steps_that_need_an_engine_are_named_so_the_harness_skips_exactly_those():
    """tests/workflow runs every other step; `image:` marks build, gate, publish, sign, diff and the re-lock."""
    for name, job in load(PIPELINE)["jobs"].items():
        for step in job["steps"]:
            engine = re.search(r"builder (build|smoke|publish|sign|diff|lock)\b|make test-docker", str(step.get("run", "")))
            assert bool(engine) == str(step.get("name", "")).startswith("image:"), f"{name}: {step}"
            # `github:` marks what writes to GitHub (push, pull request): the harness has no GitHub to write to.
            writes = str(step.get("run", "")) == "make propose-pr"
            assert writes == str(step.get("name", "")).startswith("github:"), f"{name}: {step}"


def test_plan_rebuilds_only_what_changed_and_splits_by_runner():
    jobs = load(PIPELINE)["jobs"]
    assert "builder plan $TAGS" in _steps_text(jobs["plan"])
    assert "fromJSON(needs.plan.outputs.gpu)" in str(jobs["gpu-image"]["strategy"]["matrix"])
    assert "fromJSON(needs.plan.outputs.hosted)" in str(jobs["hosted-image"]["strategy"]["matrix"])
    moved = next(s for s in jobs["hosted-image"]["steps"] if s.get("id") == "moved")
    assert moved["run"].endswith('builder plan "$TAG"')
    build = next(s for s in jobs["hosted-image"]["steps"] if "builder build" in str(s.get("run", "")))
    assert build["if"] == "steps.moved.outputs.build == 'true'"


def test_checks_run_on_hosted_runners_for_every_event():
    jobs = load(PIPELINE)["jobs"]
    assert jobs["check"]["runs-on"].startswith("ubuntu-")
    assert [s["run"] for s in jobs["check"]["steps"] if "run" in s] == ["make venv", "make validate", "make lint",
                                                                          "make unit"]
    assert "check" in needs(jobs["gpu-image"]) and "check" in needs(jobs["hosted-image"])


def test_make_lint_is_what_the_tests_check():
    """hadolint at one threshold: `make lint` (the check job) and the hadolint test (tests/integration/
    test_real_processes.py: it runs the real binary) use the same one."""
    makefile = (ROOT / "Makefile").read_text()
    threshold = re.search(r"^HADOLINT_THRESHOLD := (\w+)$", makefile, re.M).group(1)
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    for command in ("ruff check builder smoke tests bench", "builder render --check", "builder lock --check",
                    "hadolint --failure-threshold $(HADOLINT_THRESHOLD) dockerfiles/*/Dockerfile"):
        assert command in recipe
    hadolint_test = (ROOT / "tests" / "integration" / "test_real_processes.py").read_text()
    assert f'"--failure-threshold", "{threshold}"' in hadolint_test
    assert "builder validate --strict" in makefile.split("\nvalidate:", 1)[1].split("\n\n", 1)[0]


def test_write_access_only_where_images_are_pushed_or_a_proposal_is_opened():
    jobs = load(PIPELINE)["jobs"]
    assert "propose" not in reachable_from_pull_request(jobs), "no pull request reaches the job that pushes"
    for name, job in jobs.items():
        if name in ("hosted-image", "gpu-image"):
            assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
        elif name == "propose":
            assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
            assert job["environment"] == "propose" and job["steps"][0]["with"]["persist-credentials"] is False
        else:
            assert "write" not in str(job["permissions"]), f"{name} needs no write access"


def test_reachability_rule_itself():
    """The helper above must see through a job that would sneak onto a GPU runner via `needs`."""
    jobs = {"a": {"runs-on": "ubuntu-24.04"}, "b": {"needs": "a", "runs-on": ["self-hosted"]},
            "c": {"needs": "b", "if": "github.event_name != 'pull_request'", "runs-on": ["self-hosted"]},
            "d": {"if": "${{ github.event_name == 'schedule' || github.event_name == 'workflow_dispatch' }}"},
            "e": {"if": "github.event_name == 'schedule' || github.event_name == 'pull_request'"},
            "f": {"if": "github.event_name == 'schedule' || always()"}}
    assert reachable_from_pull_request(jobs) == {"a", "b", "e", "f"}


def test_triggers_and_concurrency():
    data = load(PIPELINE)
    assert "schedule" in data["on"] and data["on"]["schedule"][0]["cron"].split()[-1] not in ("*",)
    assert "pull_request" in data["on"]
    concurrency = data["concurrency"]
    assert "pull_request" in concurrency["cancel-in-progress"]
    assert "github.ref" in concurrency["group"]
