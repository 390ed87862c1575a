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


