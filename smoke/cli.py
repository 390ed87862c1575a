"""python -m smoke {env,ops,compile,train,nccl,all} [--cpu] [--out DIR] [--steps N] [--only LIST] [--timeout SECONDS]
python -m smoke nccl --nnodes N --node-rank R --master-addr HOST [--master-port P] [--nproc-per-node K]

A single check runs in this process (train/nccl start their ranks from here) and writes
DIR/<check>.json.  `all` runs each check as a child process with its own hard timeout, so
a hang or a crash (segfault in a CUDA library) costs only that check (on CPU, env, ops and
nccl run beside compile: BESIDE_COMPILE), then writes DIR/all.json (with `--only`, the checks
left out are listed as not run).  Exit status 0 iff everything passed.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from smoke import CHECKS, launch, report
from smoke.facts import facts_path, load_facts

DEFAULT_TIMEOUTS = {"env": 300, "ops": 300, "compile": 300, "train": 900, "nccl": 300}
KEY_FIGURES = {"env": ("shm_mb", "gpu_count"), "ops": (), "compile": ("first_step_seconds",),
               "train": ("wall_seconds",), "nccl": ()}
INNER_MARGIN = 15  # seconds the child keeps for itself to kill its ranks and write its JSON


def parse_args(argv):
    p = argparse.ArgumentParser(prog="smoke", description=__doc__.splitlines()[0])
    p.add_argument("check", choices=CHECKS + ("all",))
    p.add_argument("--cpu", action="store_true", help="force CPU mode (auto when no GPU is visible)")
    p.add_argument("--out", default=None, help="result dir (default $SMOKE_OUT or /tmp/smoke)")
    p.add_argument("--steps", type=int, default=5, help="train steps (default 5)")
    p.add_argument("--only", default=None, metavar="CHECKS",
                   help="with `all`: run only these checks (comma list of {}); the verdict lists what ran".format(
                       ",".join(CHECKS)))
    p.add_argument("--timeout", type=float, default=None,
                   help="hard timeout per check in seconds (default env {env}, ops {ops}, compile {compile}, "
                        "train {train}, nccl {nccl})".format(**DEFAULT_TIMEOUTS))
    m = p.add_argument_group("nccl across nodes (run the same command on every node; torchrun's flags)")
    m.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1: this host only)")
    m.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..nnodes-1 (0 serves the rendezvous)")
    m.add_argument("--master-addr", default=None, help="node 0's address, reachable from every node")
    m.add_argument("--master-port", type=int, default=29500, help="rendezvous TCP port on node 0 (default 29500)")
    m.add_argument("--nproc-per-node", type=int, default=None,
                   help="ranks on this node (default: one per GPU; 2 in CPU mode)")
    return p.parse_args(argv)


def node_layout(args):
    """The nccl multi-node layout from the flags, or None; ValueError names the flag that is wrong."""
    from smoke import nccl
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node {args.nproc_per_node}: must be 1 or more")
    node = nccl.node_layout(args.nnodes, args.node_rank, args.master_addr, args.master_port)
    if node and args.check != "nccl":
        raise ValueError(f"--nnodes {args.nnodes}: only the nccl check runs across nodes (smoke nccl --nnodes ...)")
    return node


def run_one(name, args, out_dir):
    """Run one check in this process; returns its result dict (also written to DIR/name.json)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    launch.writable_caches(os.environ)  # `smoke env` run by hand as an arbitrary UID, not only under `all`
    mode, n_gpus = launch.detect_mode(args.cpu)
    if mode == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed must not probe for CUDA in CPU mode
    res = report.Result(name, mode)
    timeout = args.timeout or DEFAULT_TIMEOUTS[name]
    try:
        facts = load_facts()
    except (OSError, ValueError) as e:
        facts = {}
        res.add("facts file", False if name == "env" else None, f"{facts_path()}: {e}")
    try:
        if name == "env":
            from smoke import env
            env.run(res, facts, mode)
        elif name == "ops":
            from smoke import ops
            ops.run(res, facts, mode)
        elif name == "compile":
            from smoke import compile as compile_check
            compile_check.run(res, facts, mode)
        elif name == "train":
            from smoke import train
            train.run(res, facts, mode, n_gpus, out_dir, args.steps, timeout)
        elif name == "nccl":
            from smoke import nccl
            nccl.run(res, facts, mode, n_gpus, out_dir, timeout, node_layout(args), args.nproc_per_node)
    except Exception as e:  # a bug or a broken import must still produce a report
        import traceback
        text = traceback.format_exc()
        sys.stderr.write(text)
        res.diagnose(text)
        res.add(f"{name} check ran", False, f"{type(e).__name__}: {e}")
    d = res.finish().to_dict()
    report.write_json(out_dir, name, d)
    return d


# On CPU the gate is bound by cores (2 in CI): torch.compile's first step keeps one core busy with inductor's Python
# while env, ops and nccl mostly import, so these run beside compile (measured on 2 cores: 30 s side by side, 53 s one
# after the other; compile's own time did not grow). train's ranks use every core and run alone. On a GPU every check
# runs alone, in order: nccl's bandwidth is gated there and compile's first-step time is a reported figure.
BESIDE_COMPILE = ("env", "ops", "nccl")


def schedule(mode, wanted):
    """Phases of lanes: the lanes of a phase run side by side, each lane's checks one after the other, and a phase
    starts when the one before it has ended."""
    order = [c for c in CHECKS if c in wanted]
    if mode != "cpu":
        return [[[c]] for c in order]
    side = [c for c in order if c in BESIDE_COMPILE]
    first = [lane for lane in ([c for c in order if c == "compile"], side) if lane]
    rest = [[[c]] for c in order if c != "compile" and c not in BESIDE_COMPILE]
    return ([first] if first else []) + rest


def run_check(name, args, out_dir, mode):
    """One check as a child process with its own hard timeout; its result dict, made from its log if it left none."""
    outer = args.timeout or DEFAULT_TIMEOUTS[name]
    inner = round(outer - min(INNER_MARGIN, outer * 0.25), 1)
    cmd = [sys.executable, "-m", "smoke", name, "--out", out_dir, "--steps", str(args.steps),
           "--timeout", str(inner)] + (["--cpu"] if mode == "cpu" else [])
    json_path = os.path.join(out_dir, name + ".json")
    if os.path.exists(json_path):
        os.remove(json_path)
    log_path = os.path.join(out_dir, name + ".log")
    c0 = time.monotonic()
    timed_out, rc = False, None
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=launch.base_env(mode),
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=outer)
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGTERM first: the check's launcher kills its ranks on SIGTERM.
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    d = report.read_json(json_path)
    if d is None:
        # The check died without a report (crash, kill): build one from its log.
        text = launch.read_logs([log_path])
        r = report.Result(name, mode)
        r.add(f"{name} check completed", False,
              f"timed out after {outer}s" if timed_out else f"exited {rc} without a report")
        r.diagnose(text)
        r.hint("log tail:\n" + launch.tail(text, 8))
        r.finish()
        r.seconds = round(time.monotonic() - c0, 2)
        d = r.to_dict()
        report.write_json(out_dir, name, d)
    return d


def run_phases(phases, run, mode):
    """Run `phases` (see schedule) with run(name) -> result dict; each result is printed as its check ends.
    Returns {name: result} with every scheduled check: one whose run raised is a failure, never a gap (a lane's
    thread would otherwise end silently and the verdict count only the checks that came back)."""
    results, printing = {}, threading.Lock()

    def lane(names):
        for name in names:
            try:
                d = run(name)
            except Exception as e:  # noqa: BLE001 - the gate's own bug must still fail the gate, visibly
                r = report.Result(name, mode)
                r.add(f"{name} check ran", False, f"{type(e).__name__}: {e}")
                d = r.finish().to_dict()
            with printing:
                results[name] = d
                report.print_result(d, KEY_FIGURES.get(name, ()))

    for phase in phases:
        threads = [threading.Thread(target=lane, args=(names,), daemon=True) for names in phase[1:]]
        for t in threads:
            t.start()
        lane(phase[0])  # the first lane in this thread: a Ctrl-C lands here, as before
        for t in threads:
            t.join()
    return results


def verdict(results, mode, wanted, seconds):
    """all.json: each check's name, verdict, summary, diagnosis and figures (its assertions stay in <check>.json)."""
    checks = [{k: results[c].get(k) for k in ("name", "passed", "seconds", "summary", "diagnosis", "figures")}
              for c in CHECKS if c in results]
    return {"passed": all(c["passed"] for c in checks), "mode": mode, "seconds": round(seconds, 2), "checks": checks,
            "not_run": [c for c in CHECKS if c not in wanted]}


def run_all(args, out_dir):
    t0 = time.monotonic()
    mode, _ = launch.detect_mode(args.cpu)
    wanted = [c for c in (args.only or ",".join(CHECKS)).split(",") if c]
    unknown = [c for c in wanted if c not in CHECKS]
    if unknown:
        print(f"smoke: unknown check(s) {','.join(unknown)}; choose from {','.join(CHECKS)}", file=sys.stderr)
        return 2
    results = run_phases(schedule(mode, wanted), lambda name: run_check(name, args, out_dir, mode), mode)
    total = verdict(results, mode, wanted, time.monotonic() - t0)
    passed = total["passed"]
    path = report.write_json(out_dir, "all", total)
    print("{} smoke all [{}]: {} in {:.1f}s -> {}".format(report.OK if passed else report.BAD, mode,
                                                   "passed" if passed else "FAILED", total["seconds"], path))
    return 0 if passed else 1


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        node_layout(args)
    except ValueError as e:
        print(f"smoke: {e}", file=sys.stderr)
        return 2
    out_dir = os.path.abspath(args.out or report.default_out_dir())
    os.makedirs(out_dir, exist_ok=True)
    if args.check == "all":
        return run_all(args, out_dir)
    d = run_one(args.check, args, out_dir)
    report.print_result(d, KEY_FIGURES.get(args.check, ()))
    return 0 if d["passed"] else 1
