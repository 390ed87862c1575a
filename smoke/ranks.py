"""The contract between a multi-rank check (train, nccl) and its ranks.

Parent side: start the ranks with SMOKE_RESULT naming a fresh rank-0 result file (.<job>.rank0.json in
the out dir), read it back, and record the launcher's own verdict (exit codes, timeout, missing result)
plus, on failure, what the logs say.  Worker side: the rank's place in the job, and the one rank-0
writer: rank 0 writes its items and figures, then every rank meets at a barrier and leaves the group.
Kept free of torch imports: the worker passes its torch.distributed in.
"""

import os

from smoke import launch, report

# A rank prints one before each step of leaving: the last one in a hung rank's log says where it hangs.
TEARDOWN_MARK = "SMOKE teardown:"
TEARDOWN_STEPS = (("barrier", "in the final barrier"),
                  ("destroy_process_group", "in destroy_process_group()"),
                  ("exit", "at interpreter exit, after destroy_process_group()"))
# What a rank hung in destroy_process_group() means, from our own gdb stacks (docs/training.md).
DESTROY_HANG = (
    "teardown_deadlock: a rank hung in destroy_process_group() after its work was done. Seen with gloo (torch 2.6 "
    "on CPU, about 1 run in 15 of `smoke nccl --cpu` here): freeing the process group holds the GIL and joins "
    "gloo's worker thread, which is freeing the last barrier's tensors and waits for the GIL, a deadlock in PyTorch "
    "(the same root as pytorch/pytorch#190489; with NCCL see pytorch/pytorch#75097). A user's job would hang "
    "there too; rerun the gate.")

# ----------------------------------------------------------------------------- parent side

def run_job(module, n, out_dir, job, timeout, env, node=None):
    """Run `python -m module` as n ranks (on this node of a multi-node job when node is given: see
    launch.rank_vars); returns (launcher result, local rank 0's {"items", "figures"} or {})."""
    path = os.path.join(out_dir, f".{job}.rank0.json")
    if os.path.exists(path):
        os.remove(path)  # a result left by an earlier run must not pass for this one's
    r = launch.run_ranks(module, n, out_dir, job, timeout, dict(env, SMOKE_RESULT=path), node=node)
    return r, report.read_json(path) or {}


# What the gate proves when every rank did its work and one did not leave cleanly (issue 49): the work is proven
# (rank 0 wrote its result, every rank passed the final barrier), the clean exit is not. PyTorch's own teardown
# bugs (gloo's exit race pytorch/pytorch#190489, a hang in destroy_process_group() pytorch/pytorch#75097) end a
# rank there about one run in ten on 2 CPU cores, in any image of that torch: the check passes with the exit
# item "not proven" (ok None), the fault named in its detail, the check's summary and figures["teardown_faults"].
# The same rule decides for a user's `make image`, `verify` and the tests. A rank that failed before the final
# barrier, or no result from rank 0, fails as before.
LEFT_AFTER_WORK = ("destroy_process_group", "exit")


def teardown_faults(r, data):
    """['rank 1 exited -6 at interpreter exit, after destroy_process_group()', ...] when every rank that did not
    exit 0 had passed the final barrier (its last teardown mark) and rank 0 wrote its result; else None."""
    failing = [rank for rank, rc in enumerate(r["rcs"]) if rc != 0]
    if not failing or not data or len(r.get("logs") or []) != len(r["rcs"]):
        return None
    out = []
    for rank in failing:
        step = teardown_step(launch.read_logs([r["logs"][rank]]))
        if step not in LEFT_AFTER_WORK:
            return None
        how = "was killed, hung" if r["timed_out"] or r.get("left_first") else f"exited {r['rcs'][rank]}"
        out.append(f"rank {rank} {how} {dict(TEARDOWN_STEPS)[step]}")
    return out


def record_exit(res, r, data, timeout, prefix=""):
    """Add the launcher's items (all ranks exited 0 / finished in time, rank 0 wrote); True iff all exited 0, or
    every rank did its work and only left uncleanly (teardown_faults: the exit item is then 'not proven')."""
    ok = not r["timed_out"] and all(rc == 0 for rc in r["rcs"])
    faults = None if ok else teardown_faults(r, data)
    if faults:
        res.add(f"{prefix}all ranks exited 0", None,
                "not proven: the work was done on every rank (rank 0 wrote its result, all passed the final "
                f"barrier), then {', '.join(faults)}: PyTorch's teardown fault, not the image's; a job ending the "
                "same way can exit non-zero (exit codes {})".format(r["rcs"]))
        res.figures.setdefault("teardown_faults", []).extend(f"{prefix}{f}" for f in faults)
        # Why, from the failing ranks' own logs (smoke/signatures.py: exit_abort and the rest), and the hang's
        # explanation where a rank had to be killed.
        res.diagnose(launch.read_logs([path for path, rc in zip(r["logs"], r["rcs"]) if rc != 0]))
        if any("hung" in f for f in faults):
            res.hint(f"{prefix}{DESTROY_HANG}")
        return True
    if r["timed_out"]:
        left = r.get("left_first")
        killed = (f"killed after {timeout:.0f}s" if not left else
                  f"killed {left[1]:.0f}s after rank {left[0]} exited 0")
        where = hung_where(r)
        res.add(f"{prefix}ranks finished within timeout", False,
                f"{killed} (hang?)" if not (data and where) else
                f"{killed}: the work was done (rank 0 wrote its result), but the ranks did not exit: {where}")
    else:
        res.add(f"{prefix}all ranks exited 0", ok, "exit codes {}".format(r["rcs"]))
    if not data:
        res.add(f"{prefix}rank 0 wrote its result", False, "no result from rank 0")
    return ok


def hung_where(r):
    """'rank 0 in destroy_process_group(), rank 1 at interpreter exit, ...' from the teardown marks in the logs
    of the ranks the launcher had to kill; "" when none of them had begun to leave."""
    where = []
    for rank, path in enumerate(r["logs"]):
        if r["rcs"][rank] == 0:
            continue
        step = teardown_step(launch.read_logs([path]))
        if step:
            where.append(f"rank {rank} {dict(TEARDOWN_STEPS)[step]}")
    return ", ".join(where)


def teardown_step(log):
    """The step a rank's log says it was leaving in (its last teardown mark: a TEARDOWN_STEPS key), or None."""
    marks = [ln.split(TEARDOWN_MARK, 1)[1].strip() for ln in log.splitlines() if TEARDOWN_MARK in ln]
    return marks[-1] if marks and marks[-1] in dict(TEARDOWN_STEPS) else None


def explain_failure(res, r, prefix="", logs=None):
    """Known failure signatures in the ranks' logs; the tail of the rank that failed first; for a hang, where
    each killed rank was (the stacks it printed when asked, see launch.dump_stacks)."""
    res.diagnose(launch.read_logs(r["logs"]) if logs is None else logs)
    first = r["first_failure"]
    if first is not None:
        res.hint(f"{prefix}rank {first} failed first; log tail:\n"
                 + launch.tail(launch.read_logs([r["logs"][first]]), 8))
    if r.get("timed_out"):
        for rank, path in enumerate(r["logs"]):
            log = launch.read_logs([path])
            stacks = launch.last_stack_dump(log)
            if stacks:
                res.hint(f"{prefix}rank {rank} hung here (Python stacks, innermost first):\n{stacks}")
            if r["rcs"][rank] != 0 and teardown_step(log) == "destroy_process_group":
                res.hint(f"{prefix}{DESTROY_HANG}")


# ----------------------------------------------------------------------------- worker side

def rank_env(env=None):
    """(rank, world size, local rank, gpu?) from the launcher's environment contract."""
    env = os.environ if env is None else env
    return (int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]), env["SMOKE_MODE"] == "gpu")


def write_rank0_result(rank, res, env=None):
    """Rank 0 writes its items and figures where the parent reads them (atomically); other ranks write nothing."""
    if rank != 0:
        return None
    env = os.environ if env is None else env
    return report.write_json_file(env["SMOKE_RESULT"], {"items": res.items, "figures": res.figures})


def finish(dist, rank, res):
    """Write rank 0's result, then leave together: no rank tears down the group while another still reads it."""
    write_rank0_result(rank, res)
    leave_group(dist)


def leave_group(dist):
    """The barrier, then destroy_process_group(), each announced in the log first (TEARDOWN_MARK)."""
    print(f"{TEARDOWN_MARK} barrier", flush=True)
    dist.barrier()
    print(f"{TEARDOWN_MARK} destroy_process_group", flush=True)
    dist.destroy_process_group()
    print(f"{TEARDOWN_MARK} exit", flush=True)


def all_reduce_scalar(value, dev, op, dtype=None):
    """One number reduced over all ranks (op: a torch.distributed.ReduceOp), as a Python number."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64 if dtype is None else dtype, device=dev)
    dist.all_reduce(t, op=op)
    return t.item()
