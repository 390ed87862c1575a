"""Resolve an entry's Python packages with a real resolver (uv pip compile) for its Python and platform.

`resolve` proves a combination installs together; `lock` (lock.py) runs the same resolution with hashes
(`boundary/uv.py` `compile_requirements`). Both ask the index the entry names.

`resolve --import-check` proves it imports together: the tag's locks (when current, else this resolution)
installed into a throwaway venv and the training surface imported in it on the CPU (`boundary/importcheck.py`,
`data/import-check.py`). A combination that installs but breaks at import (transformers importing a name its pinned
accelerate lacks) stops there, before any image build, as a CompatError naming both packages. `make build` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder import log
from builder.boundary import importcheck, uv
from builder.flags import switch
from builder.model import lockfile, paths
from builder.model.lockfile import parse_pins
from builder.model.matrix import Entry
from builder.steps import Done


def resolve(entry: Entry) -> dict[str, str]:
    """Resolve without hashes; return the full pin set."""
    return parse_pins(uv.compile_requirements(entry, hashes=False))


def import_check(entry: Entry) -> importcheck.Report:
    """Install what the image gets and import the training surface; a failed import raises (CompatError naming both
    packages). Current locks are that set, hash-checked, and were made by this resolver from these very inputs: they
    are installed without resolving again. Another resolution here would also cost the next run ~30 s behind a proxy
    that strips PyPI's cache headers (this project's machines): uv then downloads DeepSpeed's sdist again under a new
    cache revision, and the wheel it built from it last time is lost. Stale or missing locks: the resolution."""
    lock_dir = paths.lock_dir(entry)
    stale = lockfile.python_problems(entry, lock_dir)
    if not stale:
        log.info(f"{entry.tag}: {lock_dir}/ is current (made from these inputs): installing it, hash-checked")
        report = importcheck.check(entry, lock_dir, None)
    else:
        log.info(f"{entry.tag}: installing the resolution, without hashes: {stale[0]}")
        report = importcheck.check(entry, None, resolve(entry))
    return report


# --- the step --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    import_check: bool = switch("--import-check", help="install the tag's locks (when current; else the resolution) "
                                "into a throwaway venv and import the training surface on the CPU: Trainer with a "
                                "DeepSpeed config, get_peft_model, Accelerator, deepspeed (uv's cache keeps it fast "
                                "after the first run)")


def prepare(entries, options: Options) -> None:
    uv.binary()


def run(entry: Entry, options: Options) -> Done:
    if options.import_check:
        return Done("imports ok", import_check(entry).summary())
    pins = resolve(entry)
    nccl = pins.get("nvidia-nccl-cu13") or pins.get("nvidia-nccl-cu12") or "—"
    return Done("resolved", f"{len(pins)} packages from {entry.index_url}; torch {pins.get('torch')}, nccl {nccl}")
