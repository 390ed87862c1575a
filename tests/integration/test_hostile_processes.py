"""The hostile render cases that need real processes (moved from tests/unit/test_hostile_render.py, whose
unit tests may not start one): kill -9, SIGTERM and SIGINT mid-render, two renders at once, `lock` waiting for
a render. The tree is always the old one or the new one, locks/ (lock's directory) is never touched, and the
next run cleans up and says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.unit import test_hostile_render as unit
from tests.unit.test_hostile_render import TAGS, change_matrix, leftovers, locks_intact, tree

rendered = unit.rendered  # the same fixture: a project rendered once, a lock file for each tag in locks/


def run_builder(project: Path, *argv: str, prelude: str = "", timeout: float = 60, **popen) -> subprocess.Popen:
    """The builder as a real subprocess in `project` (for signals and concurrency); `prelude` runs first
    inside it (to wrap a function so that it pauses at a chosen point)."""
    code = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n{prelude}\n"
            f"from builder import cli\nsys.exit(cli.main({list(argv)!r}))\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    popen.setdefault("preexec_fn", _default_sigint)
    return subprocess.Popen([sys.executable, "-c", code], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _default_sigint() -> None:
    """SIGINT as in a terminal, even when the suite runs from a background shell (`&` makes SIGINT ignored, and
    children inherit it): the signal tests Ctrl-C this child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- real processes: kill -9, SIGTERM, SIGINT, two at once ---------------------------------------------

PAUSE_AFTER = """
import os, time
from pathlib import Path
from builder import fsutil, treeswap
_count = [0]
def _pausing(real, counts):
    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        if counts(*args):
            _count[0] += 1
            if _count[0] == {n}:
                Path({flag!r}).write_text(str(os.getpid()))
                deadline = time.monotonic() + 30
                while not Path({flag!r} + ".go").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
        return result
    return wrapper
{pause}
"""
# Where a render is paused, by wrapping what it calls (no test hook in builder/): after the nth file written
# into the staging tree, or right after the fallback swap's first rename (the old tree moved aside).
MID_STAGING = ("fsutil.write_file = _pausing(fsutil.write_file, lambda *a: True)\n"
               "fsutil.copy_file = _pausing(fsutil.copy_file, lambda *a: True)\n")
BETWEEN_RENAMES = ("treeswap.exchange = lambda a, b: False\n"  # as on a file system that cannot exchange
                   "os.rename = _pausing(os.rename, lambda src, dst: str(dst).endswith('.render-old'))\n")


def _start_paused(project: Path, pause: str = MID_STAGING, n: int = 3):
    flag = project.parent / f"{project.name}.paused"
    prelude = PAUSE_AFTER.format(n=n, flag=str(flag), pause=pause)
    proc = run_builder(project, "render", prelude=prelude)
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the render never reached the pause"
        time.sleep(0.02)
    return proc


def _resume(project: Path) -> None:
    (project.parent / f"{project.name}.paused.go").write_text("")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["kill-9", "sigterm", "sigint"])
def test_signal_mid_render_keeps_the_old_tree(rendered, capsys, sig):
    change_matrix(rendered)
    before = tree(rendered)
    proc = _start_paused(rendered)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert tree(rendered) == before, "a render cut short changed dockerfiles/"
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert leftovers(rendered) == [".dockerfiles.render-new"]  # what the next run must clean up
    else:
        assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
        assert "Traceback" not in err
        assert leftovers(rendered) == [], "an interrupted render removes its own staging tree"
    assert run_cli("render") == 0
    err = capsys.readouterr().err
    if sig == signal.SIGKILL:
        assert "removed" in err and ".dockerfiles.render-new" in err
    assert leftovers(rendered) == []
    assert run_cli("render", "--check") == 0 and locks_intact(rendered)


def test_kill_between_the_two_renames_is_finished_by_the_next_run(rendered, capsys):
    change_matrix(rendered)
    proc = _start_paused(rendered, BETWEEN_RENAMES, n=1)
    proc.kill()
    proc.communicate(timeout=30)
    assert not (rendered / "dockerfiles").exists()
    assert run_cli("render") == 0
    assert "finished the swap" in capsys.readouterr().err
    assert run_cli("render", "--check") == 0 and leftovers(rendered) == [] and locks_intact(rendered)


def test_two_renders_at_once_are_serialised(rendered, capsys):
    change_matrix(rendered)
    first = _start_paused(rendered)  # holds the lock, paused mid-staging
    second = run_builder(rendered, "render")
    # Read until the second says it waits, not a fixed sleep: on a loaded machine its start alone takes seconds.
    # It cannot finish meanwhile (the first holds the lock), so the loop ends at that line, or at its EOF.
    said = []
    for line in second.stderr:
        said.append(line)
        if "waiting for another process writing dockerfiles/" in line:
            break
    assert second.poll() is None, f"the second render must wait for the first: {said}"
    _resume(rendered)
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), err1 + err2
    assert "waiting for another process writing dockerfiles/" in "".join(said)
    assert "Traceback" not in err1 + err2
    assert run_cli("render", "--check") == 0 and leftovers(rendered) == []


def test_many_concurrent_renders_never_race(rendered, capsys):
    change_matrix(rendered)
    procs = [run_builder(rendered, "render") for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, results
    assert all("Traceback" not in err for _, err in results)
    assert run_cli("render", "--check") == 0 and leftovers(rendered) == []


def test_lock_writes_while_a_render_holds_dockerfiles(rendered, capsys):
    """Separate directories, separate writers: lock does not wait for a render, nor a render undo a lock."""
    import threading

    from builder.steps import lock

    change_matrix(rendered)
    proc = _start_paused(rendered)
    target = rendered / "locks" / TAGS[0] / "requirements.lock"
    writer = threading.Thread(target=lock._write, args=(target, "y==2\n"))
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "lock must not wait for a render: it never writes into dockerfiles/"
    _resume(rendered)
    assert proc.wait(timeout=60) == 0
    assert target.read_text() == "y==2\n" and not (rendered / "dockerfiles" / TAGS[0] / "requirements.lock").exists()
    assert run_cli("render", "--check") == 0
