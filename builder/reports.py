"""Per-tag step reports: build/reports/<tag>.<step>.json, the artifacts one step hands the next.

Each report has a JSON Schema in builder/schemas/<step>.schema.json, and this is its one reader and writer.
`write` refuses a report that breaks its schema (a bug in the writing step), `read` refuses one that breaks
it (a hand-edited or foreign file) with one line naming the file and the field: a step, or the catalog,
never uses a report it cannot read as specified. The schemas say everything a reader relies on.
"""

from __future__ import annotations

import json
from pathlib import Path

from builder import fsutil
from builder.errors import StepFailed, UserError
from builder.model import paths, yamlread
from builder.model.schemas import problems, type_name

STEPS = ("build", "smoke", "publish", "repro")
MAX_BYTES = 64 << 20  # a report is a few KB; a repro report with capped lists stays far below this


def write(tag: str, step: str, data: dict) -> Path:
    target = paths.report(tag, step)
    report = {"tag": tag, "step": step, **data}
    found = problems(step, report)
    if found:
        raise StepFailed(f"internal error: the {step} report for {tag} breaks its schema: {'; '.join(found[:5])}",
                         "this is a bug in the builder: please report it")
    try:
        fsutil.write_json(target, report)  # whole or not at all: a temp file renamed over the old report
    except OSError as exc:
        raise fsutil.write_failed(target, exc) from None
    return target


def read(tag: str, step: str, required: bool = True, directory: Path | None = None) -> dict | None:
    """The report of `step` for `tag` (from `directory`, default build/reports), held to its schema; None
    when it does not exist and is not required."""
    target = (directory / f"{tag}.{step}.json") if directory is not None else paths.report(tag, step)
    if not target.exists() and not target.is_symlink():
        if required:
            raise UserError(f"{target} does not exist", f"run `python -m builder {step} {tag}` first")
        return None
    rerun = f"re-run `python -m builder {step} {tag}`, or delete {target}"
    parsed = _parse(target, rerun)
    if not isinstance(parsed, dict):
        raise UserError(f"{target}: expected a JSON object at the top, got {type_name(parsed)}", rerun)
    found = problems(step, parsed)
    if found:
        raise UserError(f"{target} is not a valid {step} report: {found[0]}", rerun)
    if parsed["tag"] != tag:
        raise UserError(f"{target} is the report of tag {parsed['tag'][:60]!r} (field 'tag'), its name says {tag!r}",
                        rerun)
    return parsed


def _parse(target: Path, rerun: str):
    try:
        data = yamlread.read_bounded(target, MAX_BYTES, what="report")  # a regular file, bounded
    except UserError as exc:
        raise UserError(exc.message, rerun) from None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{target}: byte {exc.start} is not UTF-8", rerun) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{target} is not valid JSON ({exc.msg})", rerun) from None
    except RecursionError:
        raise UserError(f"{target}: JSON nested too deeply", rerun) from None
