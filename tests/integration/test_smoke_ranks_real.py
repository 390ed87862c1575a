"""The multi-rank launcher for real: ranks are real processes started by smoke's launcher; only the worker is a
stand-in that needs no torch (it writes what a train/nccl rank 0 writes, through the same writer)."""

import json
import textwrap

from smoke import launch, ranks, report

FAKE_WORKER = textwrap.dedent("""
    import os

    from smoke import launch, ranks, report

    launch.die_with_parent()  # a live launcher's rank carries on
    rank, world, local, gpu = ranks.rank_env()
    res = report.Result("fake", "gpu" if gpu else "cpu")
    res.add(f"rank {rank} of {world}", True, f"local {local}")
    res.figures["answer"] = 42
    if os.environ.get("FAKE_WRITE") == "1":
        ranks.write_rank0_result(rank, res)
""")


def _job(tmp_path, write):
    (tmp_path / "fake_rank.py").write_text(FAKE_WORKER)
    env = launch.base_env("cpu")
    env.update(SMOKE_MODE="cpu", FAKE_WRITE="1" if write else "0",
               PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}")
    return ranks.run_job("fake_rank", 2, str(tmp_path / "out"), "fake", 60, env)


def test_rank0_result_reaches_the_parent_and_a_stale_one_does_not(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".fake.rank0.json").write_text(json.dumps({"items": [{"name": "old", "ok": True, "detail": ""}]}))
    r, data = _job(tmp_path, write=False)
    assert r["rcs"] == [0, 0] and data == {}  # the earlier run's file was removed, not read
    res = report.Result("fake", "cpu")
    assert ranks.record_exit(res, r, data, 60, "v: ") is True
    assert [(i["name"], i["ok"]) for i in res.items] == [("v: all ranks exited 0", True),
                                                         ("v: rank 0 wrote its result", False)]

    r, data = _job(tmp_path, write=True)
    assert data == {"items": [{"name": "rank 0 of 2", "ok": True, "detail": "local 0"}], "figures": {"answer": 42}}
    assert sorted(p.name for p in out.iterdir()) == [".fake.rank0.json", "fake.rank0.log", "fake.rank1.log"]




HANGING_WORKER = textwrap.dedent("""
    import os
    import time

    from smoke import launch, ranks, report

    def stuck_leaving_the_group():
        time.sleep(600)

    launch.start_rank()
    rank, world, local, gpu = ranks.rank_env()
    res = report.Result("fake", "cpu")
    res.add("work", True, "")
    ranks.write_rank0_result(rank, res)
    print(ranks.TEARDOWN_MARK, "barrier", flush=True)
    if os.environ.get("HANG_IN") != "barrier":
        print(ranks.TEARDOWN_MARK, "destroy_process_group", flush=True)
    if rank == 1:
        stuck_leaving_the_group()
""")


def test_a_rank_that_hangs_after_its_work_is_named_with_where_it_hangs(tmp_path):
    """The launcher kills a hung job; before that it asks each rank for its stacks. A rank hung in
    destroy_process_group() after every rank did its work (rank 0 wrote, all passed the final barrier) is
    PyTorch's teardown fault: the check passes with the clean exit 'not proven' and the fault named (issue 49);
    hung in the barrier itself, the work of the job is not proven and the check fails."""
    (tmp_path / "hang_rank.py").write_text(HANGING_WORKER)
    env = launch.base_env("cpu")
    env.update(SMOKE_MODE="cpu", PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}")
    r, data = ranks.run_job("hang_rank", 2, str(tmp_path / "out"), "hang", 8, env)
    assert r["timed_out"] and r["rcs"][0] == 0 and r["rcs"][1] != 0 and data["items"][0]["name"] == "work"
    res = report.Result("fake", "cpu")
    assert ranks.record_exit(res, r, data, 8) is True
    [item] = res.items
    assert item["name"] == "all ranks exited 0" and item["ok"] is None
    assert "not proven: the work was done on every rank" in item["detail"]
    assert "rank 1 was killed, hung in destroy_process_group()" in item["detail"]
    assert res.figures["teardown_faults"] == ["rank 1 was killed, hung in destroy_process_group()"]
    assert any(d.startswith("teardown_deadlock: a rank hung in destroy_process_group()") for d in res.diagnosis)
    res.finish()
    assert res.passed and "teardown fault, exit not proven: rank 1 was killed" in res.summary

    env["HANG_IN"] = "barrier"
    r, data = ranks.run_job("hang_rank", 2, str(tmp_path / "out2"), "hang", 8, env)
    res = report.Result("fake", "cpu")
    assert ranks.record_exit(res, r, data, 8) is False
    assert res.items == [{"name": "ranks finished within timeout", "ok": False,
                          "detail": "killed after 8s: the work was done (rank 0 wrote its result), but the ranks did "
                                    "not exit: rank 1 in the final barrier"}]
    ranks.explain_failure(res, r)
    [hint] = [d for d in res.diagnosis if d.startswith("rank 1 hung here")]
    assert "stuck_leaving_the_group" in hint and "hang_rank.py" in hint


def test_ranks_stuck_after_another_left_are_killed_after_the_grace_not_the_timeout(tmp_path):
    """Once a rank has exited 0 the rest are past the last barrier: a rank still there leave_grace later is hung,
    and the job ends then, not at the check's whole timeout (885 s of a CI run, once)."""
    (tmp_path / "hang_rank.py").write_text(HANGING_WORKER)
    env = launch.base_env("cpu")
    env.update(SMOKE_MODE="cpu", PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}",
               SMOKE_RESULT=str(tmp_path / ".hang.rank0.json"))
    r = launch.run_ranks("hang_rank", 2, str(tmp_path / "out"), "hang", 300, env, leave_grace=4)
    assert r["timed_out"] and r["seconds"] < 60 and r["left_first"][0] == 0
    res = report.Result("fake", "cpu")
    assert ranks.record_exit(res, r, {"items": [{"name": "work", "ok": True}]}, 300) is True
    assert res.items[0]["ok"] is None and "rank 1 was killed, hung in destroy_process_group()" in res.items[0]["detail"]
    res = report.Result("fake", "cpu")  # no result from rank 0: the work is not proven, so neither is anything
    ranks.record_exit(res, r, {}, 300)
    assert res.items[0]["detail"].startswith("killed 4s after rank 0 exited 0") and not res.passed
