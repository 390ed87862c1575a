"""Start N ranks of a worker module, with a hard timeout, and collect their logs.

A minimal torchrun: the same env contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
but each rank's stdout+stderr goes to its own log file (NCCL_DEBUG=INFO prints to stdout and
we parse it; failure signatures are searched there), one dead rank stops the others at once
instead of leaving them blocked in a collective until the process-group timeout, and a hang
is killed as a whole process tree.
"""

import faulthandler
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    # Bind port 0 and release it: a small race, but no fixed port to collide with
    # a concurrent run (CI runs matrix jobs on one host).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def detect_mode(force_cpu):
    """('cpu'|'gpu', n_gpus).  Imports torch lazily; a broken torch means CPU mode here
    (the env check reports the breakage itself)."""
    if force_cpu:
        return "cpu", 0
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return "gpu", torch.cuda.device_count()
    except Exception:
        pass
    return "cpu", 0


def writable_caches(env):
    """Give the gate's own caches a writable place when HOME is not (an arbitrary UID with no passwd entry gets
    HOME=/, OpenShift style; a read-only root file system): DeepSpeed's JIT-built ops (torch_extensions),
    Hugging Face and pip all default to $XDG_CACHE_HOME or ~/.cache, triton to ~/.triton. Inductor already uses
    the temp dir. Only for the gate's processes; what a user sets wins. Returns env, changed in place."""
    home = env.get("HOME") or os.path.expanduser("~")
    if os.access(home, os.W_OK):
        return env
    root = os.path.join(tempfile.gettempdir(), f"smoke-home-{os.getuid()}")
    env.setdefault("XDG_CACHE_HOME", os.path.join(root, ".cache"))
    env.setdefault("TRITON_HOME", root)
    return env


def base_env(mode):
    """Environment every smoke process needs: offline, writable caches, fail-fast collectives."""
    env = writable_caches(dict(os.environ))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.setdefault("DEEPSPEED_TIMEOUT", "2")  # minutes (int): DS process-group timeout
    env.setdefault("PYTHONUNBUFFERED", "1")   # logs survive a kill
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Make sure `python -m smoke.x` finds this package in children wherever it lives.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pp = env.get("PYTHONPATH", "")
    if pkg_parent not in pp.split(os.pathsep):
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + pp if pp else "")
    if mode == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu must not touch a GPU even if one is there
        # Under `docker run --network none` the hostname may not resolve; loopback always does.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _kill_tree(p, sig):
    try:
        os.killpg(p.pid, sig)  # each rank leads its own process group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def rank_vars(local, n, port, node=None):
    """The torchrun env contract for local rank `local` of n on this host.

    node: None (one host, loopback rendezvous on `port`) or {"nnodes", "node_rank", "master_addr",
    "master_port"}: this host runs global ranks node_rank*n .. node_rank*n+n-1 of nnodes*n, meeting
    the others at master_addr:master_port (node 0's rank 0 serves the store there).
    """
    if node is None:
        return dict(RANK=str(local), LOCAL_RANK=str(local), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return dict(RANK=str(node["node_rank"] * n + local), LOCAL_RANK=str(local),
                WORLD_SIZE=str(node["nnodes"] * n), LOCAL_WORLD_SIZE=str(n),
                GROUP_RANK=str(node["node_rank"]), MASTER_ADDR=node["master_addr"],
                MASTER_PORT=str(node["master_port"]))


# Once a rank has exited 0, the others get this long to follow. Our ranks leave after a common barrier, so what is
# left is destroy_process_group() and interpreter exit, seconds on a loaded host; a rank stuck there (a teardown
# hang, pytorch/pytorch#75097) would otherwise hold the gate until the check's whole timeout.
LEAVE_GRACE = 120


def run_ranks(module, n, out_dir, name, timeout, env, args=(), node=None, leave_grace=LEAVE_GRACE):
    """Run `python -m module args` as n ranks on this host (node: see rank_vars).  Returns dict:
    {"rcs": [..], "timed_out": bool, "logs": [paths], "first_failure": local rank or None, "seconds",
    "left_first": (rank, leave_grace) when the others were killed leave_grace after that rank exited 0, else None}.
    """
    os.makedirs(out_dir, exist_ok=True)
    port = free_port() if node is None else None
    procs, logs, files = [], [], []
    t0 = time.monotonic()

    def stop_all(sig=signal.SIGTERM):
        for p in procs:
            if p.poll() is None:
                _kill_tree(p, sig)

    # If our own parent (smoke all) kills us, take the ranks with us.
    old = signal.signal(signal.SIGTERM, lambda *_: (stop_all(signal.SIGKILL), sys.exit(143)))
    try:
        for rank in range(n):
            e = dict(env)
            e.update(rank_vars(rank, n, port, node), SMOKE_LAUNCHER_PID=str(os.getpid()))
            log = os.path.join(out_dir, f"{name}.rank{rank}.log")
            f = open(log, "w")
            files.append(f)
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", module] + list(args),
                                          stdout=f, stderr=subprocess.STDOUT, env=e,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        timed_out, first_failure, left_first, by_grace = False, None, None, False
        while True:
            rcs = [p.poll() for p in procs]
            if left_first is None and 0 in rcs:
                left_first = (rcs.index(0), time.monotonic() - t0)
            bad = [i for i, rc in enumerate(rcs) if rc not in (None, 0)]
            if bad and first_failure is None:
                first_failure = bad[0]
                # The others would wait in a collective until the PG timeout: stop them now,
                # after a moment so they can flush their own error output.
                time.sleep(2)
                stop_all()
            if all(rc is not None for rc in rcs):
                break
            now = time.monotonic() - t0
            by_grace = now <= timeout and left_first is not None and now > left_first[1] + leave_grace
            if now > timeout or by_grace:
                timed_out = True
                dump_stacks(procs)
                stop_all()
                deadline = time.monotonic() + 3  # a moment to exit cleanly, then no mercy
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.1)
                stop_all(signal.SIGKILL)
                for p in procs:
                    p.wait()
                break
            time.sleep(0.2)
        return {"rcs": [p.returncode for p in procs], "timed_out": timed_out,
                "first_failure": first_failure, "logs": logs,
                "seconds": round(time.monotonic() - t0, 2),
                "left_first": (left_first[0], leave_grace) if by_grace else None}
    finally:
        stop_all(signal.SIGKILL)
        for f in files:
            f.close()
        signal.signal(signal.SIGTERM, old)


def read_logs(paths, limit=200000):
    out = []
    for p in paths:
        try:
            with open(p, errors="replace") as f:
                data = f.read()
        except OSError:
            continue
        out.append(f"==> {os.path.basename(p)} <==\n{data[-limit:]}")
    return "\n".join(out)


def tail(text, lines=15, width=240):
    return "\n".join(ln[:width] for ln in text.strip().splitlines()[-lines:])


STACKS_SIGNAL = signal.SIGUSR1  # a rank started with start_rank() prints its Python stacks to its log on it
_STACK_LINE = re.compile(r"^(?:(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|  File .*|\s*)$")


def start_rank():
    """What every rank does first: die with the launcher, and print where it is when the launcher, about to
    kill it as hung, asks (faulthandler: every Python thread's stack, no GIL needed)."""
    die_with_parent()
    faulthandler.register(STACKS_SIGNAL, all_threads=True)


def dump_stacks(procs, wait=2.0):
    """Ask each live rank for its stacks (lands in its log) and give it a moment to write them."""
    asked = False
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, STACKS_SIGNAL)
                asked = True
            except (ProcessLookupError, PermissionError):
                pass
    if asked:
        time.sleep(wait)


def last_stack_dump(text, lines=16):
    """The last faulthandler dump in a rank's log (each Python thread's frames, innermost first), or ""."""
    rows = [ln.rstrip() for ln in text.splitlines()]
    heads = [i for i, ln in enumerate(rows) if ln.endswith("(most recent call first):")]
    if not heads:
        return ""
    start = end = heads[-1]
    while start > 0 and _STACK_LINE.match(rows[start - 1]):  # the dump's earlier threads
        start -= 1
    while end + 1 < len(rows) and _STACK_LINE.match(rows[end + 1]):
        end += 1
    start = min(i for i in heads if i >= start)
    return "\n".join([ln for ln in rows[start:end + 1] if ln][:lines])


def die_with_parent():
    """Linux: get SIGKILL when the launcher dies, so a killed gate leaves no orphan ranks."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        # Parent already gone before prctl took effect: we were re-parented.  Compared with the launcher's
        # pid, not with 1: in `docker run IMAGE smoke train` the launcher itself is pid 1.
        launcher = os.environ.get("SMOKE_LAUNCHER_PID")
        if launcher and os.getppid() != int(launcher):
            os._exit(1)
    except Exception:
        pass
