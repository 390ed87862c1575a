"""A private Docker engine for fault tests: started, killed, restarted and filled up by the test itself.

The machine's own engine (default socket) is never touched: it may be busy with someone else's work. This one
has its own data root, exec root, pidfile, socket, containerd namespace and cgroup parent, its own bridge, no
iptables rules (builds use `--network=host`, containers `--network=none`). The builder is pointed at it with
DOCKER_HOST, which both the docker SDK and the docker CLI honour.

Cleanup is complete even after a failed test or a SIGKILLed engine: the daemon and its containerd are stopped,
RUN processes a killed engine orphaned are killed (found by this engine's own cgroup parent, and by command
lines naming its private directory), every mount under the directory is unmounted (deepest first), the
directory removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.images import CI_TAG, DOCKER

BASE = "debian:bookworm-slim"


def skip_unless_possible(loop: bool = False) -> None:
    """Skip (with the reason) where a private engine cannot be run: not root, no dockerd, no Debian client.

    Under the engine jobs' own targets (`make test-docker20`, `make test-docker-newest`, which set
    PRIVATE_ENGINE_REQUIRED=1) the same reason fails instead: a job whose only test skipped would pass having
    proven nothing."""
    problem = None
    if os.geteuid() != 0:
        problem = "fault tests run a private dockerd and mount file systems: they need root"
    elif not shutil.which("dockerd"):
        problem = "no dockerd here (Debian: apt-get install docker.io; `make docker` does it)"
    elif not Path(DOCKER).exists():
        problem = f"{DOCKER} (Debian's docker client, with BuildKit built in) is not here"
    elif not shutil.which("ip"):
        problem = "the private engine gets its own bridge with `ip` (iproute2), which is not here"
    elif loop and not (shutil.which("mkfs.ext4") and shutil.which("mount") and Path("/dev/loop-control").exists()):
        problem = "a small file system needs mkfs.ext4, mount and loop devices (/dev/loop-control)"
    if problem and os.environ.get("PRIVATE_ENGINE_REQUIRED") == "1":
        pytest.fail(f"this engine job cannot run here: {problem}")
    if problem:
        pytest.skip(problem)


def base_archive(directory: Path) -> Path:
    """`docker save` of the base from the machine's engine (read only there), once per directory."""
    tar = directory / "base.tar"
    if not tar.exists():
        # The engine the rest of the suite uses (DOCKER_HOST as the session has it): only read from.
        proc = subprocess.run([DOCKER, "save", BASE, "-o", str(tar)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            tar.unlink(missing_ok=True)
            pytest.skip(f"the machine's engine has no {BASE} to copy into the private one "
                        f"(`make docker` provides it): {proc.stderr.strip()[-200:]}")
    return tar


def _mounts_under(path: Path) -> list[str]:
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(path) or point.startswith(str(path) + "/"):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def _pids_of(directory: Path, cgroup: str) -> list[int]:
    """Processes of this engine only: in its cgroup parent, or with its private directory in their argv."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            groups = (entry / "cgroup").read_text()
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if f":/{cgroup}/" in groups or str(directory) in argv:
            pids.append(int(entry.name))
    return pids


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


class Engine:
    """One private dockerd. `fs_size` puts its data root on a loop-mounted ext4 file system of that size."""

    def __init__(self, fs_size: str | None = None, modern: Path | None = None):
        """`modern`: the directory `DOCKER_ENGINE=modern make docker` unpacked Docker 26 into (/opt/docker-modern):
        that dockerd, its containerd, and the containerd image store, instead of the dockerd on PATH."""
        self.dir = Path(tempfile.mkdtemp(prefix="bft-", dir="/tmp"))  # short: a socket path has 108 bytes
        self.modern = modern
        # Its containerd namespace and cgroup: mkdtemp's letters include "_", and containerd refuses an identifier
        # with "-_" or "__" in it (`docker run`: "namespace validation"), so the underscores become letters.
        self.cgroup = self.dir.name.replace("_", "u")
        self.sock = self.dir / "d.sock"
        self.host = f"unix://{self.sock}"
        self.log = self.dir / "dockerd.log"
        self.proc: subprocess.Popen | None = None
        self.fs: Path | None = None
        if fs_size:
            image, self.fs = self.dir / "fs.img", self.dir / "fs"
            self.fs.mkdir()
            subprocess.run(["truncate", "-s", fs_size, str(image)], check=True)
            # -m 0: no blocks reserved for root (dockerd is root and would write into them: "full" would not be)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True)
            mounted = subprocess.run(["mount", "-o", "loop", str(image), str(self.fs)], capture_output=True,
                                     text=True)
            if mounted.returncode != 0:
                self.cleanup()
                pytest.skip(f"cannot loop-mount an ext4 image here: {mounted.stderr.strip()[-200:]}")
        self.data = (self.fs or self.dir) / "data"
        (self.dir / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}' if modern else "{}")
        # Its own bridge, never `--bridge=none`: a dockerd started without a bridge deletes docker0 (moby's
        # removeDefaultBridgeInterface), the main engine's bridge, and every bridged build or container there
        # fails after it ("could not find bridge docker0"; found by the full suite).
        self.bridge = self.dir.name[:15]
        made = subprocess.run(["ip", "link", "add", "name", self.bridge, "type", "bridge"], capture_output=True,
                              text=True)
        if made.returncode != 0:
            self.bridge = None
            self.cleanup()
            pytest.skip(f"cannot make a bridge for a private dockerd here: {made.stderr.strip()[-200:]}")
        subprocess.run(["ip", "addr", "add", "10.255.250.1/24", "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)

    # --- the daemon ---------------------------------------------------------------------------------

    def env(self, **extra) -> dict:
        return dict(os.environ, DOCKER_HOST=self.host, DOCKER_BUILDKIT="1", **extra)

    def start(self, timeout: float = 60) -> None:
        dockerd = (["env", f"PATH={self.modern}/usr/sbin:{self.modern}/usr/bin:{os.environ['PATH']}",
                    f"{self.modern}/usr/sbin/dockerd"] if self.modern else ["dockerd"])
        argv = [*dockerd, "--config-file", str(self.dir / "daemon.json"), "--data-root", str(self.data),
                "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "dockerd.pid"),
                "-H", self.host, "--bridge", self.bridge, "--iptables=false", "--ip-masq=false",
                "--containerd-namespace", self.cgroup, "--containerd-plugins-namespace", self.cgroup + "-plugins",
                "--cgroup-parent", "/" + self.cgroup]
        self._forget_dead_containerd()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the private dockerd exited ({self.proc.returncode}):\n{self.tail()}")
            if self.docker("info", "--format", "{{.Driver}}", check=False).returncode == 0:
                return
            time.sleep(0.3)
        raise AssertionError(f"the private dockerd did not answer within {timeout}s:\n{self.tail()}")

    def _forget_dead_containerd(self, timeout: float = 20) -> None:
        """dockerd reuses "its" containerd when the pid in containerd.pid answers kill(pid, 0), and a killed
        containerd not yet reaped by init (a zombie) does: it would wait for it forever. Wait until it is gone,
        or drop the stale pid file so that dockerd starts a new one."""
        pidfile = self.dir / "exec" / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and _state(pid) != "Z":
            time.sleep(0.1)
        if not Path(f"/proc/{pid}").exists() or _state(pid) == "Z":
            pidfile.unlink(missing_ok=True)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)

    def kill_orphans(self) -> None:
        """RUN processes a killed engine leaves behind (BuildKit runs them with runc, outside containerd), and
        the the containerd of a SIGKILLed dockerd, which holds its database lock until it is gone."""
        killed = []
        for pid in _pids_of(self.dir, self.cgroup):
            if self.proc is not None and self.proc.poll() is None and pid == self.proc.pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while killed and time.monotonic() < deadline:  # gone, not just signalled (a zombie's parent reaps it)
            killed = [pid for pid in killed if Path(f"/proc/{pid}").exists()
                      and not _state(pid).startswith("Z")]
            time.sleep(0.1)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def cleanup(self) -> None:
        self.stop()
        self.kill_orphans()
        time.sleep(0.2)
        for _ in range(3):
            for point in _mounts_under(self.dir):
                subprocess.run(["umount", "-l", point], capture_output=True)
            if not _mounts_under(self.dir):
                break
            self.kill_orphans()
            time.sleep(0.5)
        shutil.rmtree(self.dir, ignore_errors=True)
        if getattr(self, "bridge", None):
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        # The cgroups this engine made (one per controller on cgroup v1, one on v2), removed once empty.
        tops = [Path("/sys/fs/cgroup")] + [p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir()]
        for top in tops:
            mine = top / self.cgroup
            if mine.is_dir():
                for sub in sorted((d for d in mine.rglob("*") if d.is_dir()), key=lambda d: len(d.parts),
                                  reverse=True) + [mine]:
                    try:
                        sub.rmdir()
                    except OSError:
                        pass

    # --- talking to it ------------------------------------------------------------------------------

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([DOCKER, *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"docker {' '.join(args)}: {proc.stdout[-1000:]}{proc.stderr[-2000:]}"
        return proc

    def load(self, tar: Path) -> None:
        with open(tar, "rb") as fh:
            proc = subprocess.run([DOCKER, "load"], stdin=fh, env=self.env(), capture_output=True, text=True,
                                  timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]

    def image_id(self, ref: str) -> str | None:
        proc = self.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    # --- filling the small file system --------------------------------------------------------------

    def free_bytes(self) -> int:
        stat = os.statvfs(self.fs)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Take the file system's free space, leaving about `leave` bytes, with filler files beside the data root."""
        assert self.fs is not None
        size = self.free_bytes() - leave
        fd = os.open(self.fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while size > 0:  # the extent tree needs blocks too: a little less until it fits
                try:
                    os.posix_fallocate(fd, 0, size)
                    break
                except OSError:
                    size -= 1 << 20
        finally:
            os.close(fd)
        if not leave:  # the last partial blocks, written until the file system refuses
            with open(self.fs / "filler-rest", "wb", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"\0" * 4096)
                except OSError:
                    pass

    def free(self) -> None:
        for name in ("filler", "filler-rest"):
            (self.fs / name).unlink(missing_ok=True)


# --- the builder, run against the private engine ---------------------------------------------------

@contextlib.contextmanager
def running_with_base(engine: Engine, directory: Path):
    """The engine started with the CI entry's base loaded (its archive written under directory); stopped, and its
    data removed, after."""
    try:
        engine.start()
        engine.load(base_archive(directory))
        yield engine
    finally:
        engine.cleanup()


def project(directory: Path, dockerfile: str) -> Path:
    """A checkout-like directory for `builder build CI_TAG`: the real matrix, the entry's real facts file, and
    a tiny Dockerfile (seconds to build) in place of the real one (minutes, gigabytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "matrix.yaml", directory / "matrix.yaml")
    tag_dir = directory / "dockerfiles" / CI_TAG
    tag_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dockerfiles" / CI_TAG / "image.json", tag_dir / "image.json")
    (tag_dir / "Dockerfile").write_text(dockerfile)
    (directory / "smoke").mkdir(exist_ok=True)
    (directory / "smoke" / "README").write_text("the gate is not part of these images\n")
    return directory


def builder_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.integration.fault_build", *args]


def builder_env(engine: Engine) -> dict:
    env = engine.env(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    env.pop("BUILDER_REPORTS", None)
    env.pop("BUILDER_MATRIX", None)
    return env


def run_builder(engine: Engine, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(builder_argv(*args), cwd=cwd, env=builder_env(engine), capture_output=True, text=True,
                          timeout=timeout)


def report(cwd: Path, step: str = "build") -> dict | None:
    path = cwd / "build" / "reports" / f"{CI_TAG}.{step}.json"
    return json.loads(path.read_text()) if path.exists() else None


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(("error:", "hint:"))]
