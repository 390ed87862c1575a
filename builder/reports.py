"""Per-tag step reports: build/reports/<tag>.<step>.json, the artifacts one step hands the next."""

from __future__ import annotations

import json
import os
from pathlib import Path

from builder import fsutil
from builder.errors import UserError


def directory() -> Path:
    return Path(os.environ.get("BUILDER_REPORTS", "build/reports"))


def path(tag: str, step: str) -> Path:
    return directory() / f"{tag}.{step}.json"


def write(tag: str, step: str, data: dict) -> Path:
    target = path(tag, step)
    fsutil.write_json(target, {"tag": tag, "step": step, **data})
    return target


def read(tag: str, step: str, required: bool = True) -> dict | None:
    target = path(tag, step)
    if not target.exists():
        if required:
            raise UserError(f"{target} does not exist", f"run `python -m builder {step} {tag}` first")
        return None
    try:
        return json.loads(target.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{target} is not valid JSON ({exc.msg})", f"re-run `python -m builder {step} {tag}`") from None
