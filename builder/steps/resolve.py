"""Resolve an entry's Python packages with a real resolver (uv pip compile) for its Python and platform.

`resolve` proves a combination installs together; `lock` (lock.py) runs the same resolution with hashes
(`boundary/uv.py` `compile_requirements`). Both ask the index the entry names.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.boundary import uv
from builder.model.lockfile import parse_pins
from builder.model.matrix import Entry
from builder.steps import Done


def resolve(entry: Entry) -> dict[str, str]:
    """Resolve without hashes; return the full pin set."""
    return parse_pins(uv.compile_requirements(entry, hashes=False))


# --- the step --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    pass


def prepare(entries, options: Options) -> None:
    uv.binary()


def run(entry: Entry, options: Options) -> Done:
    pins = resolve(entry)
    nccl = pins.get("nvidia-nccl-cu13") or pins.get("nvidia-nccl-cu12") or "—"
    return Done("resolved", f"{len(pins)} packages from {entry.index_url}; torch {pins.get('torch')}, nccl {nccl}")
