"""The newest Docker Debian ships (Debian 14's docker.io: 28.5 in December 2026), what GitHub's hosted runners and
most users run: the CI entry builds, passes its gate, publishes, and takes a pin change the way it does on the
Docker 26 floor that the rest of the suite runs on.

`make test-docker-newest` (run by .ci/run after the suite) unpacks that engine (ci/setup-docker-newest.sh) and runs
this module: a private dockerd from it (its own data root, socket, bridge and containerd; tests/integration/
second_engine.py) with the containerd image store, driven by the same client and buildx as the suite.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.images import CI_TAG, gate_once
from tests.integration.registry_fixture import Registry
from tests.integration.second_engine import Engine, running_with_base, skip_unless_possible

pytestmark = pytest.mark.docker_newest

NEWEST = Path(os.environ.get("NEWEST_DOCKER", "/opt/docker-newest"))
PIN = ("peft", "0.21.1")  # a pin the matrix does not have (0.21.2), as a user changes one


@pytest.fixture(scope="module")
def newest(tmp_path_factory):
    skip_unless_possible()
    if not (NEWEST / "usr/sbin/dockerd").exists():
        pytest.fail(f"no engine under {NEWEST}: `make test-docker-newest` unpacks it (ci/setup-docker-newest.sh)")
    with running_with_base(Engine(modern=NEWEST), tmp_path_factory.mktemp("base")) as engine:
        yield engine


def _builder(args: list[str], env: dict, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _env(engine: Engine, reports: Path, **extra) -> dict:
    return engine.env(BUILDER_REPORTS=str(reports), DOCKER_CONFIG=str(reports.parent / "docker-config"),
                      PYTHONUNBUFFERED="1", **extra)


def test_the_ci_entry_builds_passes_its_gate_and_publishes_on_the_newest_docker(newest, tmp_path):
    env = _env(newest, tmp_path / "reports")
    built = _builder(["build", CI_TAG, "--local-base"], env, ROOT, 3000)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    report = json.loads((tmp_path / "reports" / f"{CI_TAG}.build.json").read_text())
    assert report["result"] == "built" and report["verification"] == "ok"
    major, minor = map(int, report["docker"]["engine"].split(".")[:2])
    assert (major, minor) >= (27, 3), report["docker"]  # BuildKit 0.16: what this job is for
    assert report["docker"]["mode"] == "buildx" and report["docker"]["image_store"] == "containerd"
    assert report["layer_compression"] == "zstd"
    assert report["buildkit_provenance"], "buildx wrote no provenance for this build"

    gate, smoke = gate_once(
        lambda: _builder(["smoke", CI_TAG], env, ROOT, 1800),
        lambda: json.loads((tmp_path / "reports" / f"{CI_TAG}.smoke.json").read_text()))
    assert gate.returncode == 0, (gate.stdout + gate.stderr)[-4000:]
    assert smoke["passed"] is True and smoke["image_id"] == report["image_id"]

    registry = Registry(tmp_path / "registry").start()
    try:
        # --allow-substituted-base: the base here is made by debootstrap, not pulled by its digest (docs/ci.md)
        published = _builder(["publish", CI_TAG, "--registry", f"{registry.host}/team", "--allow-substituted-base"],
                             env, ROOT, 1800)
        assert published.returncode == 0, (published.stdout + published.stderr)[-4000:]
        pub = json.loads((tmp_path / "reports" / f"{CI_TAG}.publish.json").read_text())
        assert pub["layer_compression"] == "zstd"
        assert registry.digest("team/train", CI_TAG) == pub["digest"] == registry.digest("team/train", pub["full_tag"])
    finally:
        registry.stop()


def test_a_pin_change_reinstalls_only_the_pins_and_the_image_files(newest, tmp_path):
    """A user changes one pin, re-locks (real PyPI resolution) and rebuilds: only the pins stage's install, the python
    stage's last step and the runtime stage run; every other step is taken from the build cache the first test left,
    and the image has the new version."""
    work = tmp_path / "checkout"
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".venv", "build", ".git", ".pytest_cache"))
    matrix = (work / "matrix.yaml").read_text()
    start = matrix.index(f"- tag: {CI_TAG}\n")
    end = matrix.find("\n  - tag:", start + 1)
    end = len(matrix) if end < 0 else end
    block = re.sub(rf"^(\s+{PIN[0]}:) \S+$", rf"\1 {PIN[1]}", matrix[start:end], count=1, flags=re.M)
    assert block != matrix[start:end], f"{CI_TAG} has no {PIN[0]} pin to change"
    (work / "matrix.yaml").write_text(matrix[:start] + block + matrix[end:])
    env = _env(newest, tmp_path / "reports", PYTHONPATH=str(work))
    for step in (["lock", CI_TAG, "--local-base"], ["render", CI_TAG]):
        done = _builder(step, env, work, 900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    rebuilt = _builder(["build", CI_TAG, "--local-base"], env, work, 1800)
    assert rebuilt.returncode == 0, (rebuilt.stdout + rebuilt.stderr)[-4000:]
    report = json.loads((tmp_path / "reports" / f"{CI_TAG}.build.json").read_text())
    assert report["result"] == "built" and report["versions"][PIN[0]] == PIN[1]
    log = rebuilt.stdout + rebuilt.stderr  # BuildKit's progress, as the builder streams it
    titles = dict(re.findall(r"^\s*#(\d+) (\[[\w-]+ \d+/\d+\] (?:RUN|COPY|WORKDIR).*)$", log, re.M))
    cached = set(re.findall(r"^\s*#(\d+) CACHED$", log, re.M))
    ran = sorted(titles[n].split("]")[0] + "]" for n in titles if n not in cached)
    assert titles and cached, log[-3000:]
    last = {stage: max(int(m) for m in re.findall(rf"\[{stage} \d+/(\d+)\]", log)) for stage in ("pins",)}
    # The pins stage (its install on the OS layer, then their bytecode into the cache), then the runtime's one step
    # (it copies them in with the image's own files) and its WORKDIR: nothing of the python stage.
    assert ran == [*(f"[pins {i}/{last['pins']}]" for i in range(1, last["pins"] + 1)),
                   "[runtime 1/2]", "[runtime 2/2]"], ran
    assert last["pins"] == 2, ran
    # The pins the user did not change come back with the same files: their bytecode is in the cache mount the first
    # build filled, so the pins stage compiles only the changed pin's into it (--warm), and the image's last step
    # compiles nothing (transformers' ~3,200 files: 5 s on 2 cores).
    warm = re.findall(r"bytecode: (\d+) of (\d+) files in the cache for \S+, (\d+) of them there already", log)
    counts = re.findall(r"bytecode: (\d+) of (\d+) files compiled \(hash-checked\), (\d+) of them from the cache", log)
    assert len(warm) == 1 and len(counts) == 1, log[-3000:]
    kept, warm_listed, already = map(int, warm[0])
    compiled, listed, cached_pyc = map(int, counts[0])
    assert warm_listed - already < already <= kept, warm
    assert listed == warm_listed and cached_pyc == compiled, (warm, counts)
    print(f"pin change on Docker {report['docker']['engine']}: {report['duration_s']} s, steps run: {ran}, "
          f"bytecode of {cached_pyc} of {listed} files from the cache")
