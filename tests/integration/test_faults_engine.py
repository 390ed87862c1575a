"""Faults of the machine during a build and an export, against a private Docker engine (second_engine.py):
the engine restarting mid-RUN (SIGTERM and SIGKILL), the disk filling up during a RUN step, during the
image export, and under `manifest` (the engine's `docker save` export, and the JSON written on the host).

Each fault must end with exit 3 and one `error:` line naming what happened (plus its `hint:` line, what to
do), no report claiming success, no half-written file, the image tag where it was, and a state from which
the next run of the same command succeeds once the fault is gone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.images import CI_TAG
from tests.integration.second_engine import (
    Engine,
    base_archive,
    builder_argv,
    builder_env,
    error_lines,
    project,
    report,
    run_builder,
    skip_unless_possible,
)

pytestmark = pytest.mark.docker

REF = f"ghcr.io/train-images/train:{CI_TAG}"  # the entry's image name, only ever in the private engine
BUILD = ("build", CI_TAG, "--local-base")
FIRST = "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo one > /version\n"
# The markers are computed in the shell so that only the RUN's output carries them, not BuildKit's step title.
# The RUN outlasts the marker by far: buildx's plain progress may hold a step's output back up to 10 s while
# another step is still open (its printer's maxDelay); with `sleep 10` the marker came out only when the step had
# ended, and the engine was stopped after a finished build.
SLOW = "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo started-$((6*7)) && sleep 40 && echo two > /version\n"
BIG = "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN head -c 100M /dev/zero > /big && echo two > /version\n"
EXPORT = ("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n"
          "RUN head -c 50M /dev/zero > /big && echo two > /version && echo written-$((6*7)) && sleep 3\n")


@pytest.fixture(scope="module")
def base_tar(tmp_path_factory):
    skip_unless_possible()
    return base_archive(tmp_path_factory.mktemp("fault-base"))


def _engine(base_tar, fs_size=None):
    skip_unless_possible(loop=fs_size is not None)
    main_bridge = _has_link("docker0")
    engine = Engine(fs_size)
    try:
        engine.start()
        engine.load(base_tar)
        yield engine
    finally:
        engine.cleanup()
        assert not engine.dir.exists(), f"{engine.dir} was not removed"
    # The main engine is untouched: its bridge (a dockerd without one deletes docker0) is still there.
    if main_bridge:
        assert _has_link("docker0"), "the private engine deleted the main engine's docker0 bridge"


def _has_link(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.fixture
def engine(base_tar):
    yield from _engine(base_tar)


@pytest.fixture
def small_engine(base_tar):
    """Its data root on a 640 MB ext4 file system (the base takes ~210 MB of it)."""
    yield from _engine(base_tar, "640M")


def _set_dockerfile(cwd: Path, text: str) -> None:
    (cwd / "dockerfiles" / CI_TAG / "Dockerfile").write_text(text)


def _first_build(engine: Engine, cwd: Path) -> str:
    proc = run_builder(engine, cwd, *BUILD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = report(cwd)
    assert built["result"] == "built" and engine.image_id(REF) == built["image_id"]
    return built["image_id"]


def _start_build(engine: Engine, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as fh:
        return subprocess.Popen(builder_argv(*BUILD), cwd=cwd, env=builder_env(engine), stdout=fh,
                                stderr=subprocess.STDOUT)


def _wait_for(log: Path, marker: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"the build ended before {marker}:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no {marker} within {timeout}s:\n{log.read_text()[-3000:]}")


def _assert_fault(output: str, *words: str) -> str:
    """Exactly one error line, naming the fault, and a hint; no traceback. Returns the error line."""
    lines = error_lines(output)
    print("\n".join(lines))  # shown with `pytest -rP`: what the user reads
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and any(line.startswith("hint:") for line in lines), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def _assert_nothing_claimed(engine: Engine, cwd: Path, before: str, *words: str) -> None:
    failed = report(cwd)
    assert failed["result"] == "failed" and "image_id" not in failed, failed
    for word in words:
        assert word in failed["error"], failed["error"]
    leftovers = [p.name for p in (cwd / "build" / "reports").iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"half-written report files: {leftovers}"
    assert engine.image_id(REF) == before, "the tag moved to an image that did not finish"


def _assert_rebuilt(engine: Engine, cwd: Path, before: str) -> None:
    proc = run_builder(engine, cwd, *BUILD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = report(cwd)
    assert built["result"] == "built" and built["image_id"] != before
    assert engine.image_id(REF) == built["image_id"]
    shown = engine.docker("run", "--rm", "--network=none", REF, "cat", "/version")
    assert shown.stdout.strip() == "two"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_engine_restart_mid_run(engine, tmp_path, sig):
    cwd = project(tmp_path / "checkout", FIRST)
    before = _first_build(engine, cwd)
    _set_dockerfile(cwd, SLOW)
    log = tmp_path / "build.log"
    proc = _start_build(engine, cwd, log)
    _wait_for(log, "started-42", proc)
    engine.stop(sig)
    assert proc.wait(timeout=120) == 3, log.read_text()[-3000:]
    output = log.read_text()
    _assert_fault(output, "the Docker engine at " + engine.host, "stopped answering during the build")
    assert "restart" in [line for line in error_lines(output) if line.startswith("hint:")][0]
    engine.kill_orphans()  # the interrupted RUN's processes: runc's, not the engine's (a real host reboots)
    engine.start()
    _assert_nothing_claimed(engine, cwd, before, "stopped answering")
    _assert_rebuilt(engine, cwd, before)


def test_disk_full_during_run(small_engine, tmp_path):
    engine = small_engine
    cwd = project(tmp_path / "checkout", FIRST)
    before = _first_build(engine, cwd)
    _set_dockerfile(cwd, BIG)
    engine.fill(leave=30 << 20)  # something else filled the disk: 30 MB left, the RUN writes 100 MB
    proc = run_builder(engine, cwd, *BUILD)
    assert proc.returncode == 3, proc.stderr[-3000:]
    _assert_fault(proc.stderr, "the disk is full", "No space left on device")
    _assert_nothing_claimed(engine, cwd, before, "the disk is full")
    engine.free()  # what the hint says: free space
    _assert_rebuilt(engine, cwd, before)


def test_disk_full_during_export(small_engine, tmp_path):
    engine = small_engine
    cwd = project(tmp_path / "checkout", FIRST)
    before = _first_build(engine, cwd)
    _set_dockerfile(cwd, EXPORT)
    log = tmp_path / "build.log"
    proc = _start_build(engine, cwd, log)
    _wait_for(log, "written-42", proc)
    engine.fill()  # the RUN step has written its layer; now nothing is left for the export
    assert proc.wait(timeout=120) == 3, log.read_text()[-3000:]
    output = log.read_text()
    _assert_fault(output, "the disk is full", "no space left on device")
    lines = output.splitlines()
    export = next(i for i, line in enumerate(lines) if "exporting to image" in line)
    assert any("ERROR" in line and "no space left on device" in line for line in lines[export:]), output[-3000:]
    _assert_nothing_claimed(engine, cwd, before, "the disk is full")
    engine.free()
    _assert_rebuilt(engine, cwd, before)


def _manifest(engine: Engine, cwd: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder", "manifest", REF, "-o", str(out)], cwd=cwd,
                          env=engine.env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)


def test_disk_full_during_docker_save(small_engine, tmp_path):
    """`manifest` reads `docker save`; the engine stages that export in its data root, which is full."""
    engine = small_engine
    cwd = project(tmp_path / "checkout", FIRST)
    _first_build(engine, cwd)
    out = tmp_path / "out" / "manifest.json"
    out.parent.mkdir()
    engine.fill()
    proc = _manifest(engine, cwd, out)
    assert proc.returncode == 3, proc.stderr[-3000:]
    _assert_fault(proc.stderr, f"`docker save {REF}` failed", "the disk is full", "no space left on device")
    assert list(out.parent.iterdir()) == [], "nothing may be written when the export failed"
    assert not list(cwd.glob("build/manifests/*")), "no manifest cache from a failed export"
    engine.free()
    proc = _manifest(engine, cwd, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["totals"]["files"] > 1000
    assert [p.name for p in out.parent.iterdir()] == ["manifest.json"]


def test_manifest_written_to_a_full_file_system(engine, tmp_path):
    """The manifest JSON (and its cache) onto a full host file system: exit 3, nothing half-written."""
    cwd = project(tmp_path / "checkout", FIRST)
    _first_build(engine, cwd)
    small = engine.dir / "small"  # under the engine's directory: its cleanup unmounts it
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()[-200:]}")
    out = small / "manifest.json"
    proc = _manifest(engine, small, out)  # run from there: the manifest cache (build/manifests) lands there too
    assert proc.returncode == 3, proc.stderr[-3000:]
    _assert_fault(proc.stderr, "the disk is full", f"cannot write {out}", "No space left on device")
    assert "warning: the manifest cache" in proc.stderr
    assert not out.exists()
    assert [p for p in small.rglob("*") if p.is_file()] == [], "half-written files left behind"
    subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)  # space freed
    proc = _manifest(engine, small, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["totals"]["files"] > 1000
