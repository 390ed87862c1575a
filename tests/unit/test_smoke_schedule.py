"""`smoke all`'s schedule: on CPU env, ops and nccl run beside compile, train alone; on a GPU one check at a time."""

import io
import threading
import time

import pytest

from smoke import CHECKS, cli


def test_cpu_runs_env_ops_nccl_beside_compile_and_train_alone():
    assert cli.schedule("cpu", CHECKS) == [[["compile"], ["env", "ops", "nccl"]], [["train"]]]


def test_gpu_runs_every_check_alone_in_order():
    assert cli.schedule("gpu", CHECKS) == [[[c]] for c in CHECKS]


@pytest.mark.parametrize("wanted, phases", [
    (["train"], [[["train"]]]),
    (["nccl", "env"], [[["env", "nccl"]]]),
    (["compile"], [[["compile"]]]),
    (["compile", "train"], [[["compile"]], [["train"]]]),
])
def test_only_schedules_what_was_asked(wanted, phases):
    assert cli.schedule("cpu", wanted) == phases


def _result(name):
    return {"name": name, "passed": True, "mode": "cpu", "seconds": 0.0, "summary": name, "diagnosis": [],
            "figures": {}, "items": []}


def test_lanes_of_a_phase_overlap_and_the_next_phase_waits(monkeypatch):
    monkeypatch.setattr("sys.stdout", io.StringIO())
    env_started, events = threading.Event(), []

    def run(name):
        events.append(("start", name))
        if name == "env":
            env_started.set()
        if name == "compile":  # would time out if the env lane only started after compile ended
            assert env_started.wait(10), "env did not start while compile ran"
            time.sleep(0.2)
        events.append(("end", name))
        return _result(name)

    results = cli.run_phases(cli.schedule("cpu", CHECKS), run, "cpu")
    assert sorted(results) == sorted(CHECKS)
    ends = [n for kind, n in events if kind == "end"]
    assert ends.index("compile") > ends.index("env")
    assert events.index(("start", "train")) > max(events.index(("end", n)) for n in ("env", "ops", "nccl", "compile"))
    assert ends[:3] == ["env", "ops", "nccl"]  # one lane: in order


def test_each_result_is_printed_as_its_check_ends(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    seen = []

    def run(name):
        seen.append(out.getvalue().count("\u2713"))  # lines printed before this check started
        return _result(name)

    cli.run_phases(cli.schedule("gpu", CHECKS), run, "gpu")
    assert seen == [0, 1, 2, 3, 4]
    assert [line.split()[1] for line in out.getvalue().splitlines()] == list(CHECKS)


def test_a_check_whose_run_raises_is_a_failure_and_its_lane_goes_on(monkeypatch):
    monkeypatch.setattr("sys.stdout", io.StringIO())

    def run(name):
        if name == "ops":
            raise OSError("no space left on device")
        return _result(name)

    results = cli.run_phases(cli.schedule("cpu", CHECKS), run, "cpu")
    assert sorted(results) == sorted(CHECKS)  # no gap a verdict could pass over
    assert results["ops"]["passed"] is False
    assert [i["detail"] for i in results["ops"]["items"]] == ["OSError: no space left on device"]
    assert results["nccl"]["passed"] is True  # the rest of ops' lane still ran
