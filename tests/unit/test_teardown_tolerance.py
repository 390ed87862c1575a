"""What the gate decides when every rank did its work and one only failed to leave (PyTorch's gloo teardown bugs:
an abort at interpreter exit, a hang in destroy_process_group()): the check passes with its clean exit "not
proven", the fault said in the item, the summary and figures (smoke/ranks.py teardown_faults, issue 49). The same
for users, verify and tests. Anything else is a failure.

The reports are made by the code that makes them for real: each check's result by smoke's own Result, record_exit
and explain_failure from a launcher result and the ranks' logs, written as the gate writes <check>.json and
all.json, then read back by builder's run_gate (only the engine is stubbed)."""

import json
from pathlib import Path

from builder.boundary import engine, gate
from smoke import cli, ranks, report

ABORT_LOG = "SMOKE teardown: destroy_process_group\nSMOKE teardown: exit\nrank 1/2 done: ok\n" \
            "terminate called without an active exception\n"
HANG_LOG = "SMOKE teardown: barrier\nSMOKE teardown: destroy_process_group\n"


def job(tmp_path: Path, res, name: str, rcs, logs, timed_out=False, wrote=True, left_first=None):
    """One multi-rank job as smoke's train/nccl checks record it: exit items, then the diagnosis of the logs."""
    paths = []
    for rank, text in enumerate(logs):
        path = tmp_path / f"{name}-rank{rank}.log"
        path.write_text(text)
        paths.append(str(path))
    r = {"rcs": rcs, "timed_out": timed_out, "logs": paths, "left_first": left_first,
         "first_failure": next((i for i, rc in enumerate(rcs) if rc != 0), None)}
    prefix = f"{name}: " if name else ""
    if not ranks.record_exit(res, r, {"items": []} if wrote else None, 120, prefix):
        ranks.explain_failure(res, r, prefix)


def gate_report(tmp_path: Path, monkeypatch, *checks) -> dict:
    """builder's smoke report for a gate whose container wrote these check results."""
    results = {res.name: res.finish().to_dict() for res in checks}

    def container(image, command, volumes, **kw):
        out = next(iter(volumes))
        for name, data in results.items():
            report.write_json(out, name, data)
        report.write_json(out, "all", cli.verdict(results, "cpu", list(results), 1.0))
        return (0 if all(r["passed"] for r in results.values()) else 1), ""

    monkeypatch.setattr(engine, "image_or_none", lambda ref: type("Image", (), {"id": "sha256:" + "a" * 64})())
    monkeypatch.setattr(engine, "run_container", container)
    made = gate.run_gate("train:x", gpus=False, timeout=60)
    assert json.loads(json.dumps(made)) == made
    return made


def check(name, *assertions):
    res = report.Result(name, "cpu")
    for item in assertions:
        res.add(*item)
    return res


def exit_item(made: dict, check_name: str) -> dict:
    return next(i for i in made["details"][check_name]["items"] if i["name"].endswith("all ranks exited 0"))


def test_an_abort_at_exit_after_the_work_passes_with_the_exit_not_proven(tmp_path, monkeypatch):
    train = check("train", ("adamw: loss decreased", True, "5.57 -> 5.39"))
    job(tmp_path, train, "trainer-resume", [0, -6], ["rank 0/2 done: ok\n", ABORT_LOG])
    made = gate_report(tmp_path, monkeypatch, check("env", ("torch imports", True)), train)
    assert made["passed"] is True
    item = exit_item(made, "train")
    assert item["ok"] is None and "rank 1 exited -6 at interpreter exit" in item["detail"]
    line = next(c for c in made["checks"] if c["name"] == "train")
    assert "teardown fault, exit not proven: trainer-resume: rank 1 exited -6" in line["summary"]
    assert any("exit_abort" in d for d in line["diagnosis"])


def test_a_hang_in_destroy_after_the_work_beside_an_abort_passes_naming_both(tmp_path, monkeypatch):
    train = check("train")
    job(tmp_path, train, "deepspeed", [0, -6], ["", ABORT_LOG])
    nccl = check("nccl", ("all_reduce exact at 4 MB", True, "0 wrong elements"))
    job(tmp_path, nccl, "", [0, -9], ["", HANG_LOG], timed_out=True, left_first=(0, 120.0))
    made = gate_report(tmp_path, monkeypatch, train, nccl)
    assert made["passed"] is True
    assert "rank 1 was killed, hung in destroy_process_group()" in exit_item(made, "nccl")["detail"]
    assert made["details"]["nccl"]["figures"]["teardown_faults"] == [
        "rank 1 was killed, hung in destroy_process_group()"]


def test_any_other_failure_beside_them_or_a_hang_before_the_work_was_done_fails(tmp_path, monkeypatch):
    wrong = check("nccl", ("all_reduce exact at 4 MB", False, "7 wrong elements"))
    job(tmp_path, wrong, "", [0, -9], ["", HANG_LOG], timed_out=True, left_first=(0, 120.0))
    assert gate_report(tmp_path, monkeypatch, wrong)["passed"] is False

    early = check("nccl")  # killed before rank 0 wrote its result: the work was not done
    job(tmp_path, early, "", [-9, -9], [HANG_LOG, HANG_LOG], timed_out=True, wrote=False)
    assert gate_report(tmp_path, monkeypatch, early)["passed"] is False

    crashed = check("train")  # a rank that crashed, not one that aborted on its way out
    job(tmp_path, crashed, "deepspeed", [0, 1], ["", "RuntimeError: boom\n"])
    assert gate_report(tmp_path, monkeypatch, crashed)["passed"] is False

    in_barrier = check("train")  # stuck in the final barrier: not every rank finished its work
    job(tmp_path, in_barrier, "deepspeed", [0, -9], ["", "SMOKE teardown: barrier\n"], timed_out=True)
    assert gate_report(tmp_path, monkeypatch, in_barrier)["passed"] is False

    aborted = check("train")
    job(tmp_path, aborted, "deepspeed", [0, -6], ["", ABORT_LOG])
    other = check("compile", ("torch.compile trained", False, "loss did not fall"))
    assert gate_report(tmp_path, monkeypatch, aborted, other)["passed"] is False
