"""`diagnose-nccl LOG...`: what an NCCL_DEBUG=INFO log says about the job's network and its failures.

The judgment is the gate's own (smoke/transport.py: the transport verdict from every signal; smoke/ncclfail.py:
the failure table, smoke/data/nccl_failures.json, each row with its source), applied to a log a user hands over,
from any node of any job, in or out of our images. Where the log cannot show the host (a job whose NCCL found no
RDMA device says nothing of the devices), `--rdma-device` names them, or `--host` reads this machine's.
Exit 0: nothing wrong found; 1: a fallback or a failure explained (or a cluster's one-node job); 2: no log to read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.errors import UserError
from builder.flags import arg, switch
from smoke import ncclfail, transport

MAX_BYTES = 64 * 1024 * 1024  # a whole multi-node job's INFO output is a few MB; more is not a log


@dataclass(frozen=True)
class Options:
    logs: tuple = arg(nargs="+", metavar="LOG", help="NCCL_DEBUG=INFO output (one file per node, or one for all; "
                      "- reads stdin)")
    rdma_device: tuple = arg("--rdma-device", action="append", default=(), metavar="NAME",
                             help="an RDMA device the host has (e.g. mlx5_0, efa_0), where the log cannot show it")
    host: bool = switch("--host", help="also read this machine's fabric: /sys/class/infiniband, IPoIB interfaces, "
                        "/dev/infiniband, ulimit -l (run it where the job ran, inside its container)")
    nodes: int | None = arg("--nodes", type=int, default=None, metavar="N",
                            help="the nodes the job was started on: one node where N were meant is then a failure")
    json_out: bool = switch("--json", help="print the diagnosis as JSON")


def _read(path: str) -> str:
    import sys

    if path == "-":
        return sys.stdin.read()
    p = Path(path)
    try:
        if p.stat().st_size > MAX_BYTES:
            raise UserError(f"{path}: {p.stat().st_size} bytes is not an NCCL log",
                            f"hand over the NCCL_DEBUG=INFO output, at most {MAX_BYTES // 2**20} MB")
        return p.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file", "give the path of the job's NCCL_DEBUG=INFO output") from None
    except IsADirectoryError:
        raise UserError(f"{path}: a directory, not a log", "give the log files inside it") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})", "check the path and its permissions") \
            from None


def main(options: Options, m=None) -> int:
    if options.nodes is not None and options.nodes < 1:
        raise UserError(f"--nodes {options.nodes}: must be 1 or more", "give the number of nodes the job ran on")
    text = "\n".join(_read(p) for p in options.logs)
    host = transport.host_facts() if options.host else None
    verdict = transport.diagnose(text, rdma_devices=options.rdma_device, host=host, expected_nodes=options.nodes)
    failures = ncclfail.explain(text, expected_nodes=options.nodes, signals=verdict["signals"])
    if not verdict["signals"]["nccl_lines"] and not failures:
        raise UserError(f"{', '.join(options.logs)}: no NCCL line in it",
                        "rerun the job with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET is enough) and hand over "
                        "its output")
    ok = verdict["ok"] and not failures
    if options.json_out:
        shown = {k: v for k, v in verdict.items() if k != "signals"}
        print(json.dumps({"ok": ok, "transport": shown, "failures": failures, "host": host}, indent=1, default=list))
        return 0 if ok else 1
    _report(verdict, failures, host)
    return 0 if ok else 1


def _report(verdict: dict, failures: list[dict], host: dict | None) -> None:
    sig = verdict["signals"]
    log.out(f"{log.mark(verdict['ok'])} transport: {verdict['verdict']} — {verdict['line']}")
    rows = [["nodes", verdict["nodes"] if verdict["nodes"] is not None else "?",
             ", ".join(sig["hosts"][:6]) or "no host prefix"],
            ["network chosen", verdict["network"] or "—", "`Using network …`"],
            ["inter-node channels", ", ".join(f"{k} × {v}" for k, v in verdict["channels"].items()) or "—",
             "`via NET/…`"],
            ["intra-node", ", ".join(verdict["intra"]) or "—", "`via P2P/…`, `via SHM`"],
            ["NCCL", ", ".join(sig["versions"]) or "?", "`NCCL version …`"]]
    rows += [[name, kind, shows] for name, shows, kind in verdict["evidence"]]
    if sig["env"]:
        rows.append(["environment", ", ".join(f"{k}={v}" for k, v in sig["env"].items()), "`… set by environment`"])
    if host is not None:
        rows.append(["this host", ", ".join(d["name"] for d in host["rdma"]) or "no RDMA device",
                     f"uverbs {len(host['uverbs'])}, memlock "
                     f"{'unlimited' if host['memlock_kib'] is None else str(host['memlock_kib']) + ' KiB'}"])
    log.out(log.table(("signal", "value", "read from"), rows))
    if not failures:
        log.out("no failure line found")
        return
    log.out(f"\n{len(failures)} failure(s), causes first:")
    for i, f in enumerate(failures, 1):
        tag = " (follow-on)" if f["followon"] else ""
        log.out(f"{i}. {f['id']}{tag}: {f['cause']}\n   line:   {f['line']}\n   check:  {f['check']}\n"
                f"   source: {', '.join(f['source'])}")
