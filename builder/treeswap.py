"""Replace a directory tree whole: the new tree is staged beside it and swapped in by one atomic exchange.

A failure, a signal or a kill -9 leaves either the old tree or the new one, never a mix; the next run
finishes or undoes what an interrupted one left (`recover`). Where the file system cannot exchange two paths
(renameat2 RENAME_EXCHANGE: Linux only, not every file system), two renames and a ready marker do the swap,
and `recover` covers a kill between them. render uses it for dockerfiles/; the caller holds the tree's flock.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
from pathlib import Path

from builder import fsutil
from builder.errors import EnvironmentProblem


def staging_dir(tree: Path) -> Path:
    return tree.parent / f".{tree.name}.render-new"


def retired_dir(tree: Path) -> Path:
    return tree.parent / f".{tree.name}.render-old"


def ready_marker(tree: Path) -> Path:
    """Exists only while a complete staging tree waits to be swapped in: tells recovery to finish the swap."""
    return tree.parent / f".{tree.name}.render-ready"


def refuse_pinned(tree: Path) -> None:
    """The old tree is removed whole after the swap: an immutable or append-only entry in it (chattr +i/+a)
    would fail that removal after the new tree is in place. Refused before anything is written instead."""
    entries = [Path(root) / name for root, dirs, files in os.walk(tree) for name in dirs + files]
    for path in [tree, *entries]:
        if fsutil.pinned(path):
            raise EnvironmentProblem(f"{path} is immutable or append-only (chattr +i/+a); render replaces "
                                     f"{tree}/ whole and could not remove it; {tree}/ was left as it was",
                                     f"`chattr -i -a {path}` (as root), then render again")


def recover(tree: Path) -> list[str]:
    """Finish or undo what an interrupted (kill -9, power loss) swap left; say what was done.

    Rule: while the tree exists it is the truth and every leftover is garbage. When it is missing, a swap
    died between its two renames: a staging tree marked ready is complete and is moved in; otherwise the
    retired old tree is moved back."""
    notes = []
    staging, retired, ready = staging_dir(tree), retired_dir(tree), ready_marker(tree)
    if not tree.exists() and not tree.is_symlink():
        if staging.is_dir() and ready.exists():
            os.rename(staging, tree)
            notes.append(f"finished the swap of an interrupted render: {staging} is now {tree}")
        elif retired.is_dir():
            os.rename(retired, tree)
            notes.append(f"restored {tree} from {retired} (a render was interrupted mid-swap)")
    for leftover in (staging, retired):
        if leftover.exists() or leftover.is_symlink():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
            notes.append(f"removed {leftover}, left by an interrupted render")
    if ready.exists():
        ready.unlink()
    return notes


def swap(tree: Path, staging: Path) -> None:
    """Put the staged tree in place of `tree`; signals are held off so the swap is never left half done."""
    retired = retired_dir(tree)
    ready = ready_marker(tree)
    for root, _, _ in os.walk(staging):
        fsutil.fsync_dir(Path(root))
    ready.touch()
    fsutil.fsync_dir(tree.parent)
    blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        if not tree.exists():
            os.rename(staging, tree)
        elif not exchange(staging, tree):
            os.rename(tree, retired)
            os.rename(staging, tree)  # a kill before this line: `recover` moves the ready staging tree in
            os.rename(retired, staging)
        ready.unlink()
        fsutil.fsync_dir(tree.parent)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    if staging.exists():
        shutil.rmtree(staging)  # the old tree


def exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2 RENAME_EXCHANGE, since 3.15); False where unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # the file system cannot exchange: the two-rename swap (with recovery) is used
    raise OSError(err, os.strerror(err), str(b))
