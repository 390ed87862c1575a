"""Atomic file writes: a reader (or a crash) never sees a half-written artifact."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.errors import EnvironmentProblem

LOCK_DIR = Path("build/locks")


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
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
