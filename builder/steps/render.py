"""Render each entry into dockerfiles/<tag>/ (step 4): Dockerfile and image.json (the facts file).

Everything is rendered in memory first; files are written only when every entry rendered, each by
an atomic rename. `check` compares the committed tree with a fresh render (staleness, extra dirs).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2

from builder import fsutil, log
from builder.errors import UserError
from builder.model import compat, paths
from builder.model.matrix import Entry, Matrix, select

OUT_DIR = paths.DOCKERFILES
FACTS_SCHEMA = 1


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("builder", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # Dockerfiles, not HTML; values are validated in matrix.py instead
        keep_trailing_newline=True,
        trim_blocks=False,
    )


def os_id(entry: Entry) -> str:
    """A cache-mount id per base OS, so apt caches of Ubuntu and Debian never mix."""
    name = entry.base_name.rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() else "-" for c in name)


def facts(entry: Entry) -> dict:
    """The image's own description: copied to /opt/train-image/image.json and into labels."""
    derived = compat.derive(entry)
    return {
        "schema": FACTS_SCHEMA,
        "tag": entry.tag,
        "image": entry.image,
        "base": entry.base,
        "python": entry.python,
        "cuda": entry.cuda,
        "pins": dict(entry.pins),
        "min_driver": derived["min_driver"],
        "toolkit_driver": derived["toolkit_driver"],
        "cxx11abi": derived["cxx11abi"],
        "cudnn_major": derived["cudnn_major"],
        "flash_attn_wheel": derived["flash_attn_wheel"],
        "deepspeed_ops": [],
        "index_url": entry.index_url,
    }


def render_entry(entry: Entry) -> dict[str, str]:
    data = facts(entry)
    template = _environment().get_template("Dockerfile.j2")
    dockerfile = template.render(
        tag=entry.tag, base=entry.base, base_source=entry.base_source, python=entry.python, cuda=entry.cuda,
        pins=entry.pins, min_driver=data["min_driver"], index_url=entry.index_url, os_id=os_id(entry),
    )
    return {"Dockerfile": dockerfile, "image.json": json.dumps(data, indent=2, sort_keys=True) + "\n"}


def render_all(entries: list[Entry]) -> dict[str, dict[str, str]]:
    compat.require(entries)  # nothing is written for a matrix that breaks a rule
    return {e.tag: render_entry(e) for e in entries}


def write(rendered: dict[str, dict[str, str]], out_dir: Path = OUT_DIR) -> list[Path]:
    written = []
    for tag, files in rendered.items():
        for name, text in files.items():
            path = out_dir / tag / name
            if not path.exists() or path.read_text() != text:
                fsutil.write_atomic(path, text)
                written.append(path)
    return written


def remove_extra(matrix: Matrix, out_dir: Path = OUT_DIR) -> list[Path]:
    removed = []
    for path in extra_dirs(matrix, out_dir):
        shutil.rmtree(path)
        removed.append(path)
    return removed


def extra_dirs(matrix: Matrix, out_dir: Path = OUT_DIR) -> list[Path]:
    if not out_dir.is_dir():
        return []
    tags = {e.tag for e in matrix.entries}
    return sorted(p for p in out_dir.iterdir() if p.is_dir() and p.name not in tags)


def check(matrix: Matrix, entries: list[Entry], out_dir: Path = OUT_DIR) -> list[str]:
    """Problems between the committed tree and a fresh render (empty when up to date)."""
    problems = []
    for tag, files in render_all(entries).items():
        for name, text in files.items():
            path = out_dir / tag / name
            if not path.exists():
                problems.append(f"{path}: missing — run `python -m builder render {tag}`")
            elif path.read_text() != text:
                problems.append(f"{path}: stale (differs from a fresh render) — run `python -m builder render {tag}`")
    for path in extra_dirs(matrix, out_dir):
        problems.append(f"{path}: no matrix entry has this tag — remove it or run `python -m builder render`")
    return problems


# --- the tool --------------------------------------------------------------------------------------------

NAME = "render"
HELP = "render dockerfiles/<tag>/ (and the README table)"
NEEDS_MATRIX = True


@dataclass(frozen=True)
class Options:
    tags: tuple = ()
    check: bool = False


def add_arguments(p) -> None:
    p.add_argument("tags", nargs="*", metavar="TAG", help="tags or globs; default: every entry and the README table")
    p.add_argument("--check", action="store_true", help="fail if committed files are stale or extra directories exist")


def main(options: Options, m: Matrix) -> int:
    from builder.steps import readme

    entries = select(m, list(options.tags) or None)
    if options.check:
        problems = check(m, entries)
        if not options.tags:
            problems += readme.check(m)
        if problems:
            raise UserError("\n".join(problems), "re-render and commit the result")
        log.info(f"{len(entries)} rendered entries up to date")
        return 0
    written = write(render_all(entries))
    removed = remove_extra(m) if not options.tags else []
    if not options.tags:
        written += readme.write(m)
    for path in written:
        log.info(f"wrote {path}")
    for path in removed:
        log.info(f"removed {path} (no matrix entry)")
    log.info(f"{len(entries)} entries rendered, {len(written)} files changed")
    return 0
