"""scripts/gpu-check's phase runner with real processes: a phase past its time is killed with all it started."""

import time

import pytest

from tests.unit.test_gpu_check import gc


def test_a_phase_past_its_timeout_is_killed_with_what_it_started_in_other_sessions(tmp_path):
    # smoke starts each check and rank with start_new_session: killing the process group would miss them.
    logfile = tmp_path / "phase.log"
    with pytest.raises(gc.Failed) as exc:
        gc.run(["sh", "-c", "setsid sleep 60 & echo $!; wait"], lambda _line: None, str(logfile), timeout=1)
    assert "killed after 1s" in str(exc.value)
    orphan = int(logfile.read_text().split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(orphan):
        time.sleep(0.1)
    assert not _alive(orphan)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, waiting for its reaper
    except OSError:
        return False
