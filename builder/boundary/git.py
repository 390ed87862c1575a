"""The git questions the builder asks of a checkout: when its inputs last changed, which revision it is, a
file at a tag. Each answers None when git or the history is not there (a source tarball, a shallow copy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from builder.boundary import process
from builder.errors import EnvironmentProblem

TIMEOUT_S = 10


def _git(*args: str, timeout: float = TIMEOUT_S) -> str | None:
    """git's stdout, or None when it failed or is not installed."""
    try:
        proc = process.run(["git", *args], timeout=timeout, echo=False)
    except EnvironmentProblem:
        return None
    return proc.stdout if proc.returncode == 0 else None


def last_commit_time(paths: Sequence[Path]) -> int | None:
    """Unix time of the last commit touching any of `paths`."""
    out = (_git("log", "-1", "--format=%ct", "--", *map(str, paths)) or "").strip()
    return int(out) if out.isdigit() else None


def revision(paths: Sequence[Path]) -> str:
    """HEAD's commit, `-dirty` when `paths` have uncommitted changes; `unknown` outside a checkout."""
    rev = (_git("rev-parse", "HEAD") or "").strip()
    dirty = (_git("status", "--porcelain", "--", *map(str, paths)) or "").strip()
    return (rev or "unknown") + ("-dirty" if dirty else "")


def show(repo: str, ref: str, path: str) -> str | None:
    """The text of `path` at `ref` in the clone `repo`, or None when it has no such file or tag."""
    return _git("-C", repo, "show", f"{ref}:{path}", timeout=60)
