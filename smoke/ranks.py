"""The contract between a multi-rank check (train, nccl) and its ranks.

Parent side: start the ranks with SMOKE_RESULT naming a fresh rank-0 result file (.<job>.rank0.json in
the out dir), read it back, and record the launcher's own verdict (exit codes, timeout, missing result)
plus, on failure, what the logs say.  Worker side: the rank's place in the job, and the one rank-0
writer: rank 0 writes its items and figures, then every rank meets at a barrier and leaves the group.
Kept free of torch imports: the worker passes its torch.distributed in.
"""

import os

from smoke import launch, report

# ----------------------------------------------------------------------------- parent side

def run_job(module, n, out_dir, job, timeout, env, node=None):
    """Run `python -m module` as n ranks (on this node of a multi-node job when node is given: see
    launch.rank_vars); returns (launcher result, local rank 0's {"items", "figures"} or {})."""
    path = os.path.join(out_dir, f".{job}.rank0.json")
    if os.path.exists(path):
        os.remove(path)  # a result left by an earlier run must not pass for this one's
    r = launch.run_ranks(module, n, out_dir, job, timeout, dict(env, SMOKE_RESULT=path), node=node)
    return r, report.read_json(path) or {}


def record_exit(res, r, data, timeout, prefix=""):
    """Add the launcher's items (all ranks exited 0 / finished in time, rank 0 wrote); True iff all exited 0."""
    ok = not r["timed_out"] and all(rc == 0 for rc in r["rcs"])
    if r["timed_out"]:
        res.add(f"{prefix}ranks finished within timeout", False, f"killed after {timeout:.0f}s (hang?)")
    else:
        res.add(f"{prefix}all ranks exited 0", ok, "exit codes {}".format(r["rcs"]))
    if not data:
        res.add(f"{prefix}rank 0 wrote its result", False, "no result from rank 0")
    return ok


def explain_failure(res, r, prefix="", logs=None):
    """Known failure signatures in the ranks' logs, and the tail of the rank that failed first."""
    res.diagnose(launch.read_logs(r["logs"]) if logs is None else logs)
    first = r["first_failure"]
    if first is not None:
        res.hint(f"{prefix}rank {first} failed first; log tail:\n"
                 + launch.tail(launch.read_logs([r["logs"][first]]), 8))


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
    dist.barrier()
    dist.destroy_process_group()


def all_reduce_scalar(value, dev, op, dtype=None):
    """One number reduced over all ranks (op: a torch.distributed.ReduceOp), as a Python number."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64 if dtype is None else dtype, device=dev)
    dist.all_reduce(t, op=op)
    return t.item()
