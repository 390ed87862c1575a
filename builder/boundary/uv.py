"""uv, the resolver: `uv pip compile` for an entry's Python version and platform (not this machine's), with the
entry's index; a conflict comes back as a CompatError in uv's own words, an unreachable index as exit 3."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from builder.boundary import process
from builder.errors import CompatError, EnvironmentProblem
from builder.model.compat import uses_pypi
from builder.model.lockfile import PLATFORM, requirement_lines
from builder.model.matrix import Entry

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


def compile_requirements(entry: Entry, hashes: bool, lines: list[str] | None = None,
                         prefer: list[str] | None = None) -> str:
    """Run uv pip compile; return its output. Conflicts become a CompatError in uv's own plain words.

    `prefer`: `name==version` lines of the current locks. uv keeps those versions wherever the requirements
    still allow them (it reads an existing output file as preferences), so re-locking after one pin changed
    moves only what that pin forces: the other locks, and the layers built from them, stay as they are."""
    with tempfile.TemporaryDirectory(prefix="builder-resolve-") as tmp:
        out = Path(tmp) / "requirements.txt"
        if prefer:
            out.write_text("".join(f"{line}\n" for line in prefer))
        return _compile(entry, hashes, lines, out if prefer else None)


def _compile(entry: Entry, hashes: bool, lines: list[str] | None, out: Path | None) -> str:
    args = ["--python-version", entry.python, "--python-platform", PLATFORM,
            "--index-url", entry.index_url, "--no-header", "--quiet", "--annotation-style", "split"]
    if out is not None:
        args += ["--output-file", str(out)]
    if hashes:
        args.append("--generate-hashes")
    if not uses_pypi(entry):
        args += ["--index-strategy", "unsafe-best-match", "--extra-index-url", "https://pypi.org/simple"]
    proc = pip_compile(args, lines or requirement_lines(entry), entry.tag)
    if proc.returncode == 0:
        return out.read_text() if out is not None else proc.stdout
    message = _explain(proc.stderr)
    if _is_network(proc.stderr):
        raise EnvironmentProblem(f"{entry.tag}: cannot reach {entry.index_url}: {message}",
                                 "check the network/proxy (SSL_CERT_FILE for an intercepting proxy)")
    raise CompatError(f"{entry.tag}: these pins do not install together: {message}",
                      "change the conflicting pin in matrix.yaml")


def _explain(stderr: str) -> str:
    # uv prints a tree ("× No solution found… ╰─▶ Because …"); flatten it to plain sentences.
    text = re.sub(r"[×╰─▶│]+", " ", stderr)
    return " ".join(text.split())


def _is_network(stderr: str) -> bool:
    return any(s in stderr for s in ("Failed to fetch", "dns error", "Connection refused", "certificate",
                                     "timed out", "error sending request"))
