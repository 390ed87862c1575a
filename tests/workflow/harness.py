"""Run .github/workflows/images.yml's hosted jobs here, step by step, as a GitHub runner would.

What stands for what:
- `actions/checkout`: a clean clone of this checkout (full history) with the working tree's uncommitted
  changes copied over; `actions/setup-python`: the system python3 (the job's own `make venv` step then makes
  the venv; the session makes it once with the same recipe and each clone links it, so that step finds it
  current); any other action (artifacts, cosign-installer): skipped, and reported as skipped.
- GitHub's environment: GITHUB_OUTPUT / GITHUB_ENV / GITHUB_PATH / GITHUB_STEP_SUMMARY files in RUNNER_TEMP,
  the event name and payload (workflow_dispatch inputs), the ref, repository, actor; `vars`, `secrets`,
  `inputs`, `matrix`, `needs` and `steps` contexts for the `${{ }}` expressions this workflow uses.
- Steps whose name starts with `image:` need a Docker engine or the image the job builds (build, gate,
  publish, sign, diff, re-lock in the base image): skipped by that rule, and reported. Everything else runs,
  with the default shell (`bash -e`), in order; a failing step fails the job.
- Steps whose name starts with `github:` write to GitHub (the `propose` job's `make propose-pr`: `git push` of
  branch propose/<tag>, `gh pr create`): there is no GitHub here to stand for them, so they are skipped by that
  rule and reported, never run against the clone's origin (this checkout). What they would push is what the steps
  before them left in the clone (matrix.yaml, locks/, dockerfiles/), which the tests can read.
- The `propose` step reads the real PyPI (through the proxy in SSL_CERT_FILE where there is one), as on GitHub.
- Jobs on self-hosted runners are not run; of a matrix job, the first entry of its matrix runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
ENGINE_PREFIX = "image:"
GITHUB_PREFIX = "github:"
STEP_TIMEOUT_S = 900


def load(path: Path = WORKFLOW) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # PyYAML reads the key `on` as True (YAML 1.1)
        data["on"] = data.pop(True)
    return data


# --- expressions ----------------------------------------------------------------------------------------


class Null:
    """GitHub's null: what a missing property reads as; falsy, equal to '' and null, and null all the way down."""

    def __getattr__(self, name):
        return self

    def __getitem__(self, key):
        return self

    def __eq__(self, other):
        return other is None or other == "" or isinstance(other, Null)

    def __hash__(self):
        return 0

    def __bool__(self):
        return False

    def __str__(self):
        return ""


class Ctx(dict):
    """A context object: attribute access like the expression syntax; a missing key reads as null."""

    def __getattr__(self, name):
        return wrap(self[name]) if name in self else Null()


class Seq(list):
    def __getitem__(self, i):
        try:
            return wrap(list.__getitem__(self, i))
        except IndexError:
            return Null()


def wrap(value):
    if isinstance(value, dict) and not isinstance(value, Ctx):
        return Ctx(value)
    if isinstance(value, list) and not isinstance(value, Seq):
        return Seq(value)
    return value


def evaluate(expression: str, ctx: dict):
    """The subset of GitHub's expression language this workflow uses, evaluated as Python."""
    text = expression.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    # Operators and literals are translated outside quoted strings only ('true' stays a string).
    parts = re.split(r"('(?:[^']|'')*')", text)
    text = "".join(part if i % 2 else _python_operators(part) for i, part in enumerate(parts))
    names = {k: wrap(v) for k, v in ctx.items()}
    names.update(fromJSON=lambda s: wrap(json.loads(s)), always=lambda: True, cancelled=lambda: False,
                 success=lambda: True, failure=lambda: False, startsWith=lambda a, b: str(a).startswith(str(b)),
                 format=lambda f, *a: f.format(*a),
                 hashFiles=lambda *globs: "x" if any(any(Path(ctx.get("workspace", ".")).glob(g)) for g in globs) else "")
    return eval(text, {"__builtins__": {}}, names)  # noqa: S307 - our own workflow file, not user input


def _python_operators(code: str) -> str:
    code = code.replace("&&", " and ").replace("||", " or ")
    code = re.sub(r"!(?!=)", " not ", code)
    return re.sub(r"\bnull\b", "None", re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", code)))


def interpolate(value, ctx: dict) -> str:
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _str(evaluate(m.group(1), ctx)), str(value))


def _str(value) -> str:
    if value is None or isinstance(value, Null):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- a run ----------------------------------------------------------------------------------------------


@dataclass
class Event:
    name: str  # pull_request, push, schedule, workflow_dispatch
    registry: str  # vars.REGISTRY: the local registry
    token: str  # secrets.GITHUB_TOKEN
    inputs: dict = field(default_factory=dict)
    variables: dict = field(default_factory=dict)  # repository variables beside REGISTRY (none: a fresh fork)

    @property
    def ref(self) -> str:
        return "refs/pull/1/merge" if self.name == "pull_request" else "refs/heads/main"


@dataclass
class StepResult:
    name: str
    outcome: str  # ran, skipped: <why>
    output: str = ""


@dataclass
class JobResult:
    name: str
    steps: list[StepResult]
    outputs: dict

    def ran(self) -> list[str]:
        return [s.name for s in self.steps if s.outcome == "ran"]

    def skipped(self) -> list[str]:
        return [f"{s.name} ({s.outcome})" for s in self.steps if s.outcome != "ran"]

    def log(self) -> str:
        return "\n".join(f"--- {s.name}: {s.outcome}\n{s.output}" for s in self.steps)


class StepFailed(AssertionError):
    pass


def clean_clone(dest: Path) -> Path:
    """What actions/checkout gives (full history), plus this checkout's uncommitted changes."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True, timeout=300)
    listed = subprocess.run(["git", "ls-files", "-m", "-o", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        if rel == ".venv" or rel.startswith(".venv/"):
            continue
        src, dst = ROOT / rel, dest / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    for rel in filter(None, subprocess.run(["git", "ls-files", "-d", "-z"], cwd=ROOT, capture_output=True, text=True,
                                           check=True).stdout.split("\0")):
        (dest / rel).unlink(missing_ok=True)
    return dest


def job_name(step: dict) -> str:
    return step.get("name") or (step.get("uses") or step.get("run") or "").splitlines()[0][:80]


def _read_pairs(path: Path) -> dict:
    """GITHUB_OUTPUT / GITHUB_ENV: `key=value` lines and `key<<DELIM … DELIM` blocks."""
    out, lines = {}, path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delim = line.split("<<", 1)
            j = lines.index(delim, i + 1)
            out[key] = "\n".join(lines[i + 1:j])
            i = j + 1
            continue
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
        i += 1
    path.write_text("")
    return out


class Runner:
    """Runs one job of the workflow for one event in its own clean clone and runner temp directory."""

    def __init__(self, workflow: dict, event: Event, work: Path, venv: Path):
        self.workflow, self.event, self.work, self.venv = workflow, event, work, venv

    def base_env(self, workspace: Path, temp: Path) -> dict:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "SSL_CERT_FILE", "PIP_CERT",
                                                             "REQUESTS_CA_BUNDLE", "DOCKER_HOST", "TMPDIR")}
        event_file = temp / "event.json"
        event_file.write_text(json.dumps({"inputs": self.event.inputs}))
        for name in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY"):
            (temp / name.lower()).write_text("")
            env[name] = str(temp / name.lower())
        env.update(CI="true", GITHUB_ACTIONS="true", GITHUB_EVENT_NAME=self.event.name, GITHUB_EVENT_PATH=str(event_file),
                   GITHUB_REF=self.event.ref, GITHUB_REPOSITORY="acme/train-images", GITHUB_REPOSITORY_OWNER="acme",
                   GITHUB_ACTOR="ci", GITHUB_WORKSPACE=str(workspace), GITHUB_RUN_ID="1", RUNNER_TEMP=str(temp),
                   RUNNER_ENVIRONMENT="harness", HOME=str(temp / "home"), DOCKER_CONFIG=str(temp / "home" / ".docker"))
        return env

    def context(self, needs: dict, matrix: dict, steps: dict) -> dict:
        return {"github": {"event_name": self.event.name, "ref": self.event.ref, "actor": "ci",
                           "repository_owner": "acme", "workflow": self.workflow["name"],
                           "event": {"pull_request": {"number": 1} if self.event.name == "pull_request" else {}}},
                "vars": {"REGISTRY": self.event.registry, **self.event.variables}, "secrets": {"GITHUB_TOKEN": self.event.token},
                "inputs": dict(self.event.inputs), "matrix": matrix, "needs": needs, "steps": steps,
                "runner": {"environment": "harness", "temp": ""}}

    def should_run(self, name: str, needs: dict) -> bool:
        job = self.workflow["jobs"][name]
        if "self-hosted" in str(job["runs-on"]):
            return False
        return "if" not in job or bool(evaluate(str(job["if"]), self.context(needs, {}, {})))

    def first_matrix(self, job: dict, needs: dict) -> dict:
        matrix = (job.get("strategy") or {}).get("matrix")
        if matrix is None:
            return {}
        value = evaluate(matrix, self.context(needs, {}, {})) if isinstance(matrix, str) else matrix
        include = value.get("include") or [{}]
        return dict(include[0])

    def run_job(self, name: str, needs: dict) -> JobResult:
        job = self.workflow["jobs"][name]
        matrix = self.first_matrix(job, needs)
        workspace, temp = self.work / f"{self.event.name}-{name}", self.work / f"{self.event.name}-{name}.temp"
        temp.mkdir(parents=True)
        (temp / "home").mkdir()
        env, steps, results = self.base_env(workspace, temp), {}, []
        ctx = self.context(needs, matrix, steps)
        for key, value in {**self.workflow.get("env", {}), **job.get("env", {})}.items():
            env[key] = interpolate(value, ctx)
        for step in job["steps"]:
            results.append(self.run_step(step, env, ctx, steps, workspace))
        outputs = {k: interpolate(v, ctx) for k, v in (job.get("outputs") or {}).items()}
        return JobResult(name, results, outputs)

    def run_step(self, step: dict, env: dict, ctx: dict, steps: dict, workspace: Path) -> StepResult:
        name = job_name(step)
        ctx["workspace"] = str(workspace)
        if "if" in step and not evaluate(str(step["if"]), ctx):
            return StepResult(name, "skipped: `if` is false for this event")
        uses = step.get("uses", "")
        if uses.startswith("actions/checkout@"):
            clean_clone(workspace)
            (workspace / ".venv").symlink_to(self.venv)
            (self.venv / ".stamp").touch()  # newer than the clone's requirements-dev.txt: `make venv` finds it current
            return StepResult(name, "ran", "clean clone")
        if uses.startswith("actions/setup-python@"):
            return StepResult(name, "ran", "system python3 (the venv comes from the job's `make venv`)")
        if uses:
            return StepResult(name, "skipped: an action other than checkout/setup-python")
        if name.startswith(ENGINE_PREFIX):
            return StepResult(name, "skipped: needs a Docker engine or the job's image (`image:` step)")
        if name.startswith(GITHUB_PREFIX):
            return StepResult(name, "skipped: writes to GitHub (`github:` step: push, pull request)")
        step_env = dict(env, **{k: interpolate(v, ctx) for k, v in (step.get("env") or {}).items()})
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workspace, env=step_env, capture_output=True,
                              text=True, timeout=STEP_TIMEOUT_S)
        output = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise StepFailed(f"step {name!r} failed (exit {proc.returncode}) for {env['GITHUB_EVENT_NAME']}:\n"
                             f"{output[-6000:]}")
        if step.get("id"):
            steps[step["id"]] = {"outputs": _read_pairs(Path(env["GITHUB_OUTPUT"])), "outcome": "success"}
        else:
            _read_pairs(Path(env["GITHUB_OUTPUT"]))
        env.update(_read_pairs(Path(env["GITHUB_ENV"])))
        added = _read_pairs_lines(Path(env["GITHUB_PATH"]))
        if added:
            env["PATH"] = os.pathsep.join([*added, env["PATH"]])
        return StepResult(name, "ran", output)

    def run(self, only: set[str] | None = None) -> dict[str, JobResult]:
        """Every hosted job the event reaches, in `needs` order (a job whose needs did not run is skipped)."""
        jobs, done, needs = self.workflow["jobs"], {}, {}
        for name in order(jobs):
            required = [jobs[name]["needs"]] if isinstance(jobs[name].get("needs"), str) else jobs[name].get("needs", [])
            needs_ctx = {n: {"outputs": needs.get(n, {}), "result": "success" if n in done else "skipped"}
                         for n in required}
            if (only and name not in only) or not self.should_run(name, needs_ctx):
                continue
            done[name] = self.run_job(name, needs_ctx)
            needs[name] = done[name].outputs
        return done


def _read_pairs_lines(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    path.write_text("")
    return lines


def order(jobs: dict) -> list[str]:
    out: list[str] = []
    while len(out) < len(jobs):
        for name, job in jobs.items():
            required = [job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", [])
            if name not in out and all(n in out for n in required):
                out.append(name)
    return out
