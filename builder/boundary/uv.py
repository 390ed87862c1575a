"""uv, the resolver: `uv pip compile` for a Python version and platform other than this machine's."""

from __future__ import annotations

import os
from collections.abc import Sequence

from builder.boundary import process
from builder.errors import EnvironmentProblem

TIMEOUT_S = 600


def binary() -> str:
    """The uv executable the venv installed (the `uv` package), else exit 3 with how to get it."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise EnvironmentProblem("uv is not installed", "run `make venv` (or pip install uv)") from None


def pip_compile(args: Sequence[str], requirements: Sequence[str], what: str) -> process.Result:
    """`uv pip compile - ARGS` with `requirements` on stdin; `what` names the resolution in a time-out."""
    env = dict(os.environ, UV_NO_CONFIG="1")  # the project decides, not a stray uv.toml
    try:
        return process.run([binary(), "pip", "compile", "-", *args], timeout=TIMEOUT_S, env=env,
                           input="\n".join(requirements) + "\n")
    except process.TimedOut:
        raise EnvironmentProblem(f"{what}: resolution took over {TIMEOUT_S // 60} minutes",
                                 "is the index reachable?") from None
