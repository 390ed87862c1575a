"""Resolve an entry's Python packages with a real resolver (uv pip compile) for its Python and platform.

`resolve` proves a combination installs together; `lock` (lock.py) reuses `compile_requirements` with
hashes. Both ask the index the entry names.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.errors import CompatError, EnvironmentProblem
from builder.model.compat import uses_pypi
from builder.model.lockfile import PLATFORM, parse_pins, requirement_lines
from builder.model.matrix import Entry
from builder.steps import Done


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise EnvironmentProblem("uv is not installed", "run `make venv` (or pip install uv)") from None


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
    argv = [_uv(), "pip", "compile", "-", "--python-version", entry.python, "--python-platform", PLATFORM,
            "--index-url", entry.index_url, "--no-header", "--quiet", "--annotation-style", "split"]
    if out is not None:
        argv += ["--output-file", str(out)]
    if hashes:
        argv.append("--generate-hashes")
    if not uses_pypi(entry):
        argv += ["--index-strategy", "unsafe-best-match", "--extra-index-url", "https://pypi.org/simple"]
    log.echo_command(argv)
    env = dict(os.environ, UV_NO_CONFIG="1")  # the project decides, not a stray uv.toml
    try:
        proc = subprocess.run(argv, input="\n".join(lines or requirement_lines(entry)) + "\n", text=True,
                              capture_output=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{entry.tag}: resolution took over 10 minutes", "is the index reachable?") from None
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


def resolve(entry: Entry) -> dict[str, str]:
    """Resolve without hashes; return the full pin set."""
    return parse_pins(compile_requirements(entry, hashes=False))


# --- the step --------------------------------------------------------------------------------------------

NAME = "resolve"
HELP = "prove each entry's packages resolve (uv pip compile against its index)"
DEFAULT_ALL = True


@dataclass(frozen=True)
class Options:
    pass


def add_arguments(p) -> None:
    pass


def prepare(entries, options: Options) -> None:
    _uv()


def run(entry: Entry, options: Options) -> Done:
    pins = resolve(entry)
    nccl = pins.get("nvidia-nccl-cu13") or pins.get("nvidia-nccl-cu12") or "—"
    return Done("resolved", f"{len(pins)} packages from {entry.index_url}; torch {pins.get('torch')}, nccl {nccl}")
