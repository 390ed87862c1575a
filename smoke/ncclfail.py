"""NCCL failures explained: each WARN/error line of a log matched against smoke/data/nccl_failures.json (a table of
line families → cause → what to check, every row with its source), and the one failure no single line shows:
several nodes that each formed a communicator of their own (two single-node jobs where one two-node job was meant).

Stdlib only: it runs inside the images (the gate's failure signatures) and in the checkout (`builder diagnose-nccl`).
"""

import json
import os
import re

from smoke import nccllog

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nccl_failures.json")


def rows():
    """The table's rows, each with its regular expression compiled (`rx`)."""
    with open(TABLE) as f:
        table = json.load(f)
    return [dict(row, rx=re.compile(row["match"])) for row in table["rows"]]


_ROWS = None


def _rows():
    global _ROWS
    if _ROWS is None:
        _ROWS = rows()
    return _ROWS


def explain(log, expected_nodes=None, signals=None):
    """[{"id", "cause", "check", "source", "line", "followon"}]: every failure the log shows, causes first (in the
    order they appear), then follow-on errors; each row once, with the first line that matched."""
    found = []
    for row in _rows():
        m = row["rx"].search(log)
        if m:
            start = log.rfind("\n", 0, m.start()) + 1
            end = log.find("\n", m.end())
            line = log[start:end if end != -1 else len(log)].strip()
            found.append((bool(row.get("followon")), m.start(), {
                "id": row["id"], "cause": row["cause"], "check": row["check"], "source": row["source"],
                "line": line[:300], "followon": bool(row.get("followon"))}))
    apart = separate_jobs(signals or nccllog.read(log), expected_nodes)  # signals: nccllog.read(log), if read
    if apart:
        found.append((False, len(log), apart))
    return [item for _, _, item in sorted(found, key=lambda t: (t[0], t[1]))]


def separate_jobs(sig, expected_nodes=None):
    """Several hosts in one log whose communicators each span one node, or one node where more were expected:
    each node trained (or hung) on its own. NCCL's own `nNodes` field says it; old NCCL prints ranks only."""
    one_node = sig["nnodes"] == [1] or (sig["local_ranks"] and sig["nranks"] and
                                        max(sig["nranks"]) <= max(sig["local_ranks"]))
    if not one_node:
        return None
    hosts = sig["hosts"]
    if len(hosts) < 2 and not (expected_nodes and expected_nodes > 1):
        return None
    seen = f"{len(hosts)} hosts ({', '.join(hosts[:4])})" if len(hosts) > 1 else f"{expected_nodes} nodes expected"
    return {"id": "separate_single_node_jobs", "followon": False,
            "cause": f"{seen}, but every communicator spans one node (nNodes 1, {max(sig['nranks'] or [0])} ranks): "
                     "each node started a job of its own instead of joining one job across nodes.",
            "check": "Start every node with the same launcher arguments: --nnodes N, --node-rank 0..N-1, the same "
                     "--master-addr/--master-port or --rdzv-endpoint and --rdzv-id (torchrun), or one hostfile "
                     "(deepspeed, mpirun); WORLD_SIZE must be the ranks of all nodes.",
            "source": ["NCCL's communicator line (nRanks, nNodes, localRanks), NCCL >= 2.19",
                       "https://pytorch.org/docs/stable/elastic/run.html"],
            "line": f"nNodes {sig['nnodes'] or '?'}, nRanks {sig['nranks'] or '?'}, "
                    f"localRanks {sig['local_ranks'] or '?'}"}
