"""Resolve an entry's Python packages with a real resolver (uv pip compile) for its Python and platform.

`resolve` proves a combination installs together; `lock` (lock.py) reuses `compile_requirements` with
hashes. Both ask the index the entry names.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.boundary import uv
from builder.errors import CompatError, EnvironmentProblem
from builder.model.compat import uses_pypi
from builder.model.matrix import Entry
from builder.steps import Done

# Linux x86_64 with glibc 2.28+: Debian 12 (2.36), Ubuntu 22.04 (2.35) and 24.04 (2.39) all qualify.
PLATFORM = "x86_64-manylinux_2_28"
# Always in the image: ninja lets torch/DeepSpeed JIT-build C++ ops; setuptools builds sdists (DeepSpeed).
TOOLING = ("ninja", "setuptools")


def requirement_lines(entry: Entry) -> list[str]:
    """The resolver input. `transformers[torch]` makes transformers' own torch minimum count."""
    lines = []
    for name, version in entry.pins.items():
        if version is None or name == "flash-attn":
            # flash-attn's PyPI release is an sdist that downloads a GitHub wheel at build time; it is
            # installed from that wheel directly (see the Dockerfile), so it stays out of the resolution.
            continue
        extra = "[torch]" if name == "transformers" else ""
        lines.append(f"{name}{extra}=={version}")
    if entry.pins.get("flash-attn"):
        lines.append("einops")  # flash-attn's only runtime dependency besides torch
    lines.extend(TOOLING)
    return lines


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
    proc = uv.pip_compile(args, lines or requirement_lines(entry), entry.tag)
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


def parse_pins(compiled: str) -> dict[str, str]:
    """name -> version for every `name==version` line of a compiled requirements text."""
    pins = {}
    for line in compiled.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", line)
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
    uv.binary()


def run(entry: Entry, options: Options) -> Done:
    pins = resolve(entry)
    nccl = pins.get("nvidia-nccl-cu13") or pins.get("nvidia-nccl-cu12") or "—"
    return Done("resolved", f"{len(pins)} packages from {entry.index_url}; torch {pins.get('torch')}, nccl {nccl}")
