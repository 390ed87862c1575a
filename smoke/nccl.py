"""nccl check: all-reduce correctness on every element, bus bandwidth, and the transport NCCL chose.

One process per GPU (gloo over 2 CPU ranks in CPU mode: correctness only).  Bandwidth
follows nccl-tests (GB = 1e9; busbw = algbw * 2(n-1)/n) and is gated on the largest size
only.  The transport is read from NCCL_DEBUG=INFO output: a channel "via NET/Socket" on
one host is the silent TCP fallback the field complains about.
"""

import os
import re
import time

from smoke import launch, ranks, report, transport

RENDEZVOUS_MARK = "SMOKE rendezvous complete"  # a rank prints it once every node has joined

GPU_SIZES = [2 ** 10, 2 ** 14, 2 ** 18, 2 ** 22, 2 ** 26, 2 ** 28]  # 1 KB .. 256 MB
CPU_SIZES = [2 ** 10, 2 ** 14, 2 ** 18, 2 ** 22]                    # 1 KB .. 4 MB

# Conservative busbw floors (GB/s) for 8-GPU NVLink/NVSwitch boxes: ~60% of the reference
# figures (8xA100 ~230, 8xH100 ~370 ring, 8xH200 ~470), so only a real regression (PCIe or
# socket fallback, missing fabric manager) trips them.  Matched on torch's device name;
# applied only with 8 ranks, the configuration the references were measured on.
BUSBW_FLOORS_8GPU = [
    (r"A100.*SXM", 140.0),
    (r"H100.*(HBM3|SXM)", 220.0),
    (r"H200", 280.0),
    (r"B200", 400.0),
]


def algbw_gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def busbw_gbps(nbytes, seconds, n):
    """nccl-tests all-reduce bus bandwidth; 0 factor for one rank (nothing crosses a bus)."""
    return algbw_gbps(nbytes, seconds) * (2.0 * (n - 1) / n)


def floor_for(gpu_name, n, env=None):
    """(floor GB/s or None, source)."""
    env = os.environ if env is None else env
    v = env.get("SMOKE_MIN_BUSBW_GBPS")
    if v:
        return float(v), "SMOKE_MIN_BUSBW_GBPS"
    if n == 8 and gpu_name:
        for rx, floor in BUSBW_FLOORS_8GPU:
            if re.search(rx, gpu_name):
                return floor, f"table ({rx} x8)"
    return None, "none"


_VIA = re.compile(r"via (P2P/[\w/]+|SHM[\w/]*|NET/[\w/]+|CollNet[\w/]*|NVLS[\w/]*)")
_NET = re.compile(r"Using network (\w+)")
_VER = re.compile(r"NCCL version ([\w.+\-]+)")


def parse_transports(log):
    """Summarise NCCL_DEBUG=INFO output.

    Returns {"transports": {kind: count}, "network": name|None, "version": str|None,
    "init_complete": count, "tcp_fallback": bool}.  kind is the first part of the path
    (P2P/IPC, P2P/CUMEM, SHM, NET/IB, NET/Socket ...).  "Using network Socket" alone is not a
    fallback - NCCL loads a net plugin even on one host; only a channel connected via
    NET/Socket is.
    """
    counts = {}
    for m in _VIA.finditer(log):
        parts = m.group(1).split("/")
        kind = "/".join(parts[:2]) if parts[0] in ("P2P", "NET") else parts[0]
        counts[kind] = counts.get(kind, 0) + 1
    nets = _NET.findall(log)
    ver = _VER.search(log)
    return {"transports": counts, "network": nets[0] if nets else None,
            "version": ver.group(1) if ver else None,
            "init_complete": log.count("Init COMPLETE"),
            "tcp_fallback": counts.get("NET/Socket", 0) > 0}


def expected_sum(n):
    """Each rank contributes rank+1: the sum is n(n+1)/2, exact in fp32 for any sane n."""
    return n * (n + 1) / 2


def node_layout(nnodes, node_rank, master_addr, master_port):
    """The multi-node layout for launch.rank_vars, or None for one host; ValueError names the bad flag."""
    if nnodes < 1:
        raise ValueError(f"--nnodes {nnodes}: must be 1 or more")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank}: must be in 0..{nnodes - 1} (--nnodes {nnodes})")
    if nnodes == 1:
        return None
    if not master_addr:
        raise ValueError("--master-addr: required with --nnodes > 1 (node 0's address, reachable from every node)")
    if not 0 < master_port < 65536:
        raise ValueError(f"--master-port {master_port}: must be a TCP port (1-65535), the same on every node")
    return {"nnodes": nnodes, "node_rank": node_rank, "master_addr": master_addr, "master_port": master_port}


def run(res, facts, mode, n_gpus, out_dir, timeout, node=None, nproc=None):
    n = nproc or (n_gpus if mode == "gpu" else 2)
    env = launch.base_env(mode)
    env["SMOKE_MODE"] = mode
    if node is not None:
        # The process group (rendezvous included) gives up before the launcher kills it, so a missing
        # node fails with its own error; one host keeps the worker's 60 s default.
        env["SMOKE_PG_TIMEOUT"] = str(max(5, int(timeout - 10)))
        if mode == "cpu" and "GLOO_SOCKET_IFNAME" not in os.environ:
            del env["GLOO_SOCKET_IFNAME"]  # loopback cannot reach the other nodes; gloo uses the hostname's address
    if mode == "gpu":
        # The transport lines we parse ("via P2P/IPC") come at INFO with the default subsystems;
        # NCCL prints them to stdout, which the launcher captures in per-rank log files.
        env["NCCL_DEBUG"] = "INFO"
    else:
        env.setdefault("OMP_NUM_THREADS", "1")
    nnodes = node["nnodes"] if node else 1
    world = n * nnodes
    res.figures.update(ranks=world, world_size=world, nnodes=nnodes, nproc_per_node=n,
                       node_rank=node["node_rank"] if node else 0,
                       master="{master_addr}:{master_port}".format(**node) if node else None)
    res.figures["backend"] = "nccl" if mode == "gpu" else "gloo"
    r, data = ranks.run_job("smoke.nccl", n, out_dir, "nccl", timeout, env, node=node)
    res.items.extend(data.get("items", []))
    res.figures.update(data.get("figures", {}))
    res.figures["logs"] = r["logs"]
    logs = launch.read_logs(r["logs"])
    if node:
        check_rendezvous(res, logs, node, timeout)
    ok = ranks.record_exit(res, r, data, timeout)
    if mode == "gpu":
        check_transport(res, logs, world, node)
        check_busbw(res, world)
    if not ok or not data or any(i["ok"] is False for i in res.items):
        ranks.explain_failure(res, r, logs=logs)
    summarise(res, mode, world, nnodes)


def check_rendezvous(res, logs, node, timeout):
    """Every node joined the group: the one item that tells a missing or late node from a failed collective."""
    joined = RENDEZVOUS_MARK in logs
    res.add(f"all {node['nnodes']} nodes joined", joined,
            "rendezvous at {master_addr}:{master_port} complete".format(**node) if joined else
            "no rendezvous at {}:{} within {:.0f}s: a node is missing or late (start all {} with the same "
            "--master-addr/--master-port; node 0 serves it)".format(node["master_addr"], node["master_port"],
                                                                      timeout, node["nnodes"]))


def check_transport(res, logs, n, node=None):
    """What NCCL connected the GPUs with.  One host, 2+ ranks: a channel over TCP fails.  Across nodes:
    sockets fail only where this host has RDMA devices (transport.diagnose)."""
    tp = parse_transports(logs)
    res.figures.update(nccl_transports=tp["transports"], nccl_network=tp["network"],
                       nccl_runtime_version=tp["version"], nccl_init_complete=tp["init_complete"])
    if node:
        host = transport.host_facts()
        d = transport.diagnose(logs, host=host, expected_nodes=node["nnodes"])
        res.figures.update(nccl_inter_node=d["fabric"], rdma_devices=d["rdma_devices"], nccl_verdict=d["verdict"],
                           memlock_kib=host["memlock_kib"])
        res.add("inter-node transport", d["ok"], d["line"])
        if not d["ok"]:
            res.hint(d["line"])
    elif n > 1:
        res.add("no TCP fallback (NET/Socket)", not tp["tcp_fallback"],
                "transports %s" % (tp["transports"] or "none parsed"))
        if tp["tcp_fallback"]:
            res.hint("NCCL connected GPUs via NET/Socket (TCP): expect 2-10x lower bandwidth; "
                     "check P2P/NVLink (nvidia-smi topo -m), NCCL_P2P_DISABLE/NCCL_SHM_DISABLE, "
                     "and /dev/shm (--ipc=host)")


def check_busbw(res, n):
    """The largest size's bus bandwidth against the floor for this GPU and rank count, when there is one."""
    big = res.figures.get("largest")
    if big and big.get("busbw_gbps") is not None and n > 1:
        floor, src = floor_for(res.figures.get("gpu_name"), n)
        res.figures["busbw_floor_gbps"], res.figures["busbw_floor_source"] = floor, src
        if floor is not None:
            res.add(f"busbw >= floor at {big['bytes'] // 2 ** 20} MB", big["busbw_gbps"] >= floor,
                    "{:.1f} GB/s vs floor {:.1f} ({})".format(big["busbw_gbps"], floor, src))


def summarise(res, mode, n, nnodes=1):
    big = res.figures.get("largest")
    if big:
        via = ",".join(res.figures.get("nccl_transports") or {})
        where = f" on {nnodes} nodes" if nnodes > 1 else ""
        res.summary = (f"{n} ranks{where} {res.figures['backend']}, {len(res.figures.get('sizes', []))} sizes exact, "
                       f"{big['bytes'] // 2 ** 20} MB busbw {big['busbw_gbps'] or 0.0:.2f} GB/s"
                       + ("" if mode == "gpu" else " (CPU: not gated)") + (f", via {via}" if via else ""))


# ----------------------------------------------------------------------------- worker side

def worker():
    launch.start_rank()
    import torch
    import torch.distributed as dist

    rank, n, local, gpu = ranks.rank_env()
    dev = join_group(gpu, local)
    print(f"{RENDEZVOUS_MARK}: rank {rank} of {n}", flush=True)
    res = report.Result("nccl", "gpu" if gpu else "cpu")
    res.figures["sizes"] = []
    reps = (5, 20) if gpu else (2, 5)  # (warm-up, timed) all-reduces per size
    for nbytes in GPU_SIZES if gpu else CPU_SIZES:
        row = measure(nbytes, rank, n, dev, gpu, reps)
        res.figures["sizes"].append(row)
        res.add(f"all_reduce exact at {_human(nbytes)}", row["wrong_elements"] == 0,
                f"{row['wrong_elements']} wrong elements (want {expected_sum(n):g} everywhere)")
    res.figures["largest"] = res.figures["sizes"][-1]
    if gpu:
        res.figures["gpu_name"] = torch.cuda.get_device_name(dev)
    # Each node's local rank 0 writes: every figure is already reduced over all ranks of all nodes.
    ranks.finish(dist, local, res)


def join_group(gpu, local):
    """This rank's device, in an NCCL (GPU) or gloo (CPU) process group; the timeout (SMOKE_PG_TIMEOUT,
    default 60 s) also bounds the env:// rendezvous, so a missing node ends it with an error."""
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(os.environ.get("SMOKE_PG_TIMEOUT", "60")))
    if not gpu:
        dist.init_process_group("gloo", timeout=timeout)
        return torch.device("cpu")
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    try:
        # device_id makes NCCL create its communicator now (eager init), so even one
        # GPU proves NCCL initialises, and an init hang is caught by the timeout.
        dist.init_process_group("nccl", timeout=timeout, device_id=dev)
    except TypeError:
        dist.init_process_group("nccl", timeout=timeout)
    return dev


def measure(nbytes, rank, n, dev, gpu, reps):
    """One size: every element exact after an all-reduce, and the slowest rank's time per all-reduce."""
    import torch
    import torch.distributed as dist

    dtype = torch.float32
    numel = nbytes // torch.tensor([], dtype=dtype).element_size()
    # Correctness first, on a fresh buffer: every element must be exactly n(n+1)/2.
    x = torch.full((numel,), float(rank + 1), dtype=dtype, device=dev)
    dist.all_reduce(x)
    bad = (x != expected_sum(n)).sum().item()
    # Timing on zeros, so repeated in-place sums stay exact and cannot overflow.
    z = torch.zeros(numel, dtype=dtype, device=dev)
    # The slowest rank sets the pace.
    s = ranks.all_reduce_scalar(time_all_reduce(z, gpu, *reps), dev, dist.ReduceOp.MAX)
    wrong = ranks.all_reduce_scalar(bad + int((z != 0).sum().item()), dev, dist.ReduceOp.SUM, torch.int64)
    return {"bytes": nbytes, "seconds": s, "algbw_gbps": algbw_gbps(nbytes, s),
            "busbw_gbps": busbw_gbps(nbytes, s, n), "wrong_elements": int(wrong)}


def time_all_reduce(buf, gpu, warmup, iters):
    """Seconds per in-place all-reduce of buf, after warm-up: CUDA events on GPU, the wall clock on CPU."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        dist.all_reduce(buf)
    if not gpu:
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        return (time.perf_counter() - t0) / iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        dist.all_reduce(buf)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _human(n):
    for unit, k in (("MB", 2 ** 20), ("KB", 2 ** 10)):
        if n >= k:
            return f"{n // k} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    worker()
