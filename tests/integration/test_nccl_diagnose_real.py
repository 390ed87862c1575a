"""`python -m builder diagnose-nccl` as a user runs it: a child process, real public NCCL logs, this machine's own
/sys and /dev for `--host`, stdin, a pipe closed early. No engine, no network."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.unit.test_nccl_transport import DATA


def _diagnose(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder", "diagnose-nccl", *argv], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_a_fallback_log_exits_1_with_its_cause_fix_and_sources():
    proc = _diagnose(str(DATA / "ib_disabled_refused.log"))
    assert proc.returncode == 1, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("✕ transport: fallback") and "NCCL_IB_DISABLE=1" in first and "Fix:" in first
    assert "socket_connect" in proc.stdout and "https://github.com/espnet/espnet/issues/1940" in proc.stdout
    assert proc.stderr == ""


def test_host_facts_of_this_machine_are_read_and_shown():
    """This machine has no RDMA device: --host must say so (and read its real memlock limit), not fail."""
    proc = _diagnose("--host", "--json", str(DATA / "socket_network_no_ib.log"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["host"]["rdma"] == [] and doc["host"]["efa"] is False
    assert doc["host"]["memlock_kib"] is None or doc["host"]["memlock_kib"] > 0
    assert doc["transport"]["verdict"] == "socket-only" and doc["ok"] is True


def test_stdin_is_a_log_too():
    proc = _diagnose("-", stdin=(DATA / "roce.log").read_text())
    assert proc.returncode == 0 and proc.stdout.startswith("✓ transport: rdma — between nodes via RoCE")


def test_a_reader_that_is_gone_ends_no_traceback():
    """`| true` has closed the pipe before the interpreter starts writing: every write meets EPIPE."""
    proc = subprocess.run(f"{sys.executable} -m builder diagnose-nccl {DATA / 'roce_modify_qp.log'} | true; "
                          "echo \"status ${PIPESTATUS[0]}\" >&2", shell=True, executable="/bin/bash", cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith("status 1")
