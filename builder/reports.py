"""Per-tag step reports: build/reports/<tag>.<step>.json, the artifacts one step hands the next.

Each report has a JSON Schema in builder/schemas/<step>.schema.json. `write` refuses a report that breaks
its schema (a bug in the writing step), `read` refuses one that breaks it (a hand-edited or foreign file):
a step never trusts a report it cannot read as specified.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import jsonschema

from builder import fsutil
from builder.errors import StepFailed, UserError
from builder.model import paths

STEPS = ("build", "smoke", "publish", "repro")
MAX_BYTES = 64 << 20  # a report is a few KB; a repro report with capped lists stays far below this


@cache
def schema(name: str) -> dict:
    """builder/schemas/<name>.schema.json: the reports builder writes, and the facts file render writes."""
    text = resources.files("builder").joinpath(f"schemas/{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@cache
def smoke_schema(name: str) -> dict:
    """smoke/schemas/<name>.schema.json: what the in-image gate writes (kept with smoke/, the writer)."""
    # Beside the package, not the working directory: smoke/ and builder/ ship together in one checkout.
    folder = Path(__file__).resolve().parent.parent / "smoke" / "schemas"
    return json.loads((folder / f"{name}.schema.json").read_text(encoding="utf-8"))


def problems(name: str, data, smoke: bool = False) -> list[str]:
    """Every way `data` breaks schema `name`, as 'field: reason' lines (empty when valid)."""
    validator = jsonschema.Draft202012Validator(smoke_schema(name) if smoke else schema(name))
    out = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        out.append(f"{where}: {error.message[:200]}")
    return out


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
    from builder.model import yamlread

    target = (directory / f"{tag}.{step}.json") if directory is not None else paths.report(tag, step)
    if not target.exists() and not target.is_symlink():
        if required:
            raise UserError(f"{target} does not exist", f"run `python -m builder {step} {tag}` first")
        return None
    rerun = f"re-run `python -m builder {step} {tag}`"
    data = yamlread.read_bounded(target, MAX_BYTES, what="report")  # a regular file, bounded: else UserError
    try:
        parsed = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{target}: byte {exc.start} is not UTF-8", rerun) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{target} is not valid JSON ({exc.msg})", rerun) from None
    except RecursionError:
        raise UserError(f"{target}: JSON nested too deeply", rerun) from None
    if not isinstance(parsed, dict):
        raise UserError(f"{target}: expected a JSON object at the top, got {type(parsed).__name__}", rerun)
    found = problems(step, parsed)
    if found:
        raise UserError(f"{target} is not a valid {step} report: {found[0]}", rerun)
    if parsed.get("tag") != tag:
        raise UserError(f"{target} is the report of tag {parsed.get('tag')!r}, not {tag!r}", rerun)
    return parsed
