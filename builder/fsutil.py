"""Atomic file writes (a reader, or a crash, never sees a half-written artifact) and the flocks that keep
one process per tag and one writer per generated tree."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.errors import EnvironmentProblem

LOCK_DIR = Path("build/locks")
FULL = (errno.ENOSPC, errno.EDQUOT)  # the file system is full (or the user's quota is)


def write_failed(path, exc: OSError) -> EnvironmentProblem:
    """The one-line error for a file that could not be written: what happened to which path, what to do.
    (The writers here write a temp file and rename it, so nothing half-written is left behind.)"""
    where = str(path or getattr(exc, "filename", None) or "a file")
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in FULL:
        return EnvironmentProblem(f"the disk is full: cannot write {where} ({reason})",
                                  f"free space on that file system (`df -h {Path(where).parent}`), then re-run")
    return EnvironmentProblem(f"cannot write {where} ({reason})", "make it writable, or run from a writable checkout")


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """`path` holds `text` whole or not at all (a temp file beside it, renamed); mode 0o600 for a credential."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextmanager
def tag_lock(tag: str, step: str, directory: Path = LOCK_DIR) -> Iterator[None]:
    """One builder process per tag at a time: a second build (or publish) of the same tag while one runs
    would race on the same image name, context directory and reports. The kernel drops the lock when its
    holder dies, even by kill -9, so a crashed run never blocks the next one."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{tag}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise EnvironmentProblem(f"{tag}: {holder} is working on this tag right now",
                                     "wait for it to finish (or stop it), then run again") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"`{step}` (pid {os.getpid()})".encode(), 0)
        yield
    finally:
        os.close(fd)


# --- whole trees -----------------------------------------------------------------------------------------

LOCK_WAIT_S = 600.0


def write_file(path: Path, text: str) -> None:
    """Write a new file in a staging tree (not yet visible to anyone), flushed to disk.

    The one place render writes bytes, so tests can fail it (ENOSPC, EROFS) at this boundary."""
    with open(path, "x", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, 0o644)


def copy_file(source: Path, target: Path) -> None:
    """Copy a regular file's bytes, mode and mtime into a staging tree (never following a link)."""
    shutil.copy2(source, target, follow_symlinks=False)


FS_IOC_GETFLAGS = 0x80086601  # linux/fs.h, as on x86_64 and arm64
PINNED_FLAGS = 0x10 | 0x20  # FS_IMMUTABLE_FL, FS_APPEND_FL: `chattr +i` / `+a`


def pinned(path: Path) -> bool:
    """True when `path` is immutable or append-only (chattr +i/+a): not even root can remove it or, for a
    directory, its entries. False where the file system has no such attributes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(8))
    except OSError:  # ENOTTY: no attributes here (tmpfs before 6.0, overlayfs, NFS)
        return False
    finally:
        os.close(fd)
    return bool(int.from_bytes(flags[:4], sys.byteorder) & PINNED_FLAGS)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_path(tree: Path) -> Path:
    """The lock file that serialises writers of `tree` (beside it, so swapping the tree keeps it)."""
    tree = Path(tree)
    return tree.parent / f".{tree.name}.lock"


@contextlib.contextmanager
def tree_lock(tree: Path, wait_s: float | None = None, on_wait=None):
    """Hold an exclusive flock for writing `tree`; wait for another holder (saying so once).

    flock is released by the kernel when its holder dies, even by kill -9, so a crash never leaves
    the tree locked."""
    path = lock_path(tree)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and on_wait is not None:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
                    on_wait(f"waiting for another process writing {tree}/ (pid {holder}, lock {path})")
                    told = True
                if time.monotonic() > deadline:
                    waited = LOCK_WAIT_S if wait_s is None else wait_s
                    raise EnvironmentProblem(f"{path}: still locked by another process after {waited:.0f}s",
                                             "wait for the other render/lock to finish") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the flock
