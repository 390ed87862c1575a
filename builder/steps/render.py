"""Render each entry into dockerfiles/<tag>/ (step 4): Dockerfile, image.json (the facts file), build-tools.lock.

render is the only writer of dockerfiles/ (lock writes locks/): a rendered tag directory holds exactly what
was rendered. Everything is rendered in memory first; the whole new tree is staged beside dockerfiles/
and swapped in whole (builder/treeswap.py), so a failure, a signal or a kill -9 leaves either the old tree or
the new one, never a mix across tags; the next run finishes or removes what an interrupted one left.
Concurrent renders are serialised by a flock beside the tree. `check` compares the committed tree with a
fresh render (stale or extra files, extra directories).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from builder import fsutil, log, treeswap
from builder.errors import EnvironmentProblem, UserError
from builder.flags import arg, switch
from builder.model import compat, paths
from builder.model.matrix import TAG_RE, Entry, Matrix, select

OUT_DIR = paths.DOCKERFILES
FACTS_SCHEMA = 1
BUILD_TOOLS_LOCK = "build-tools.lock"
COMPILE_NEW = "compile-new.py"
# The start-up hook for an arbitrary UID and an unwritable home (docs/image-environment.md).
ANY_USER = "train_image_env.py"
ANY_USER_PTH = "train-image-env.pth"  # the .pth line that imports it at every start (site's standard hook)


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
    tc = compat.toolchain(entry)
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
        "deepspeed_ops": [op["name"] for op in tc["ops"]],
        "ops": {"arch_list": tc["arch_list"], "gpus": tc["gpus"],
                "modules": {o["name"]: o["module"] for o in tc["ops"]},
                "builders": {o["name"]: o["builder"] for o in tc["ops"]},
                "cuda_ops": [o["name"] for o in tc["ops"] if o["cuda"]], "cpu_target": tc["cpu_target"]["march"],
                "nvcc": tc["nvcc"]["kind"],
                # DeepSpeed's CPU-accelerator ops, prebuilt in their own wheel (compat.cpu_accelerator); None: JIT.
                "cpu_accelerator": {"dir": tc["cpu_accelerator"]["dir"],
                                    "modules": {o["name"]: o["module"] for o in tc["cpu_accelerator"]["ops"]},
                                    "builders": {o["name"]: o["builder"] for o in tc["cpu_accelerator"]["ops"]}}
                if tc["cpu_accelerator"] else None},
        "gpu_capability": {g: compat.rules()["toolchain"]["gpus"]["capability"][g] for g in tc["gpus"]},
        "nvcc_in_image": tc["nvcc_in_image"],
        "index_url": entry.index_url,
    }


def render_entry(entry: Entry) -> dict[str, str]:
    data = facts(entry)
    template = _environment().get_template("Dockerfile.j2")
    dockerfile = template.render(
        tag=entry.tag, base=entry.base, base_source=entry.base_source, python=entry.python, cuda=entry.cuda,
        pins=entry.pins, min_driver=data["min_driver"], index_url=entry.index_url, os_id=os_id(entry),
        tc=compat.toolchain(entry), sp=f"/opt/venv/lib/python{entry.python}/site-packages",
    )
    return {"Dockerfile": dockerfile, "image.json": json.dumps(data, indent=2, sort_keys=True) + "\n",
            BUILD_TOOLS_LOCK: build_tools_lock(), COMPILE_NEW: _data(COMPILE_NEW), ANY_USER: _data(ANY_USER),
            ANY_USER_PTH: _data(ANY_USER_PTH)}


def build_tools_lock() -> str:
    """uv, hash-locked, for the Dockerfile's throwaway `uv` stage (package data; `make build-tools-lock`)."""
    return _data(BUILD_TOOLS_LOCK)


def _data(name: str) -> str:
    """A build helper shipped in the package and rendered beside each Dockerfile (bind-mounted, never copied)."""
    return (resources.files("builder") / "data" / name).read_text(encoding="utf-8")


def render_all(entries: list[Entry]) -> dict[str, dict[str, str]]:
    compat.require(entries, recipe=True)  # nothing is written that breaks a rule or that the recipe cannot build
    return {e.tag: render_entry(e) for e in entries}


# --- writing the tree: staged beside dockerfiles/, then swapped in ------------------------------------


def tag_dir(root: Path, tag: str) -> Path:
    """dockerfiles/<tag>: a validated tag is one path component, never '.', '..' or anything with '/'."""
    if not TAG_RE.fullmatch(tag):
        raise UserError(f"refusing to render tag {tag!r}: not a valid tag", "tags are lowercase a-z 0-9 . _ -")
    path = root / tag
    if path.parent != root or os.path.normpath(path) != str(path):
        raise UserError(f"refusing to render tag {tag!r}: it would leave {root}/")
    return path


def _refuse_links(out_dir: Path) -> None:
    """Render replaces dockerfiles/ and every dockerfiles/<tag>/ wholesale: it never writes through a link."""
    if out_dir.is_symlink():
        raise UserError(f"{out_dir} is a symbolic link (to {os.readlink(out_dir)}); render will not write through it",
                        f"replace {out_dir} with a real directory inside the repository")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UserError(f"{out_dir} exists but is not a directory", f"move it away; render creates {out_dir}/")
    for root, dirs, files in os.walk(out_dir):
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink():
                raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}); render will not write or copy "
                                "through links", f"replace it with a real {'directory' if name in dirs else 'file'}")
            if not (path.is_dir() or path.is_file()):
                raise UserError(f"{path} is not a regular file or directory", "remove it")


def _same(path: Path, text: str) -> bool:
    try:
        return path.is_file() and path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def _plan(rendered: dict[str, dict[str, str]], out_dir: Path, keep: set[str] | None) -> tuple[list, list]:
    """(files whose content changes or that render no longer writes, tag directories to remove).
    keep=None: keep every directory."""
    changed = []
    for tag, files in rendered.items():
        base = tag_dir(out_dir, tag)
        changed += [base / name for name, text in files.items() if not _same(base / name, text)]
        changed += sorted(p for p in base.iterdir() if p.name not in files) if base.is_dir() else []
    removed = []
    if keep is not None and out_dir.is_dir():
        removed = sorted(p for p in out_dir.iterdir() if p.is_dir() and p.name not in keep)
    return changed, removed


def _stage(rendered: dict[str, dict[str, str]], out_dir: Path, staging: Path, removed: list[Path]) -> None:
    """The whole new tree in `staging`: tags not rendered now copied as they are, rendered ones written."""
    staging.mkdir()
    for source in sorted(out_dir.iterdir()) if out_dir.is_dir() else []:
        if source in removed or source.name in rendered:
            continue
        if source.is_dir():
            (staging / source.name).mkdir()
        for path in sorted(source.iterdir()) if source.is_dir() else [source]:
            target = staging / path.relative_to(out_dir)
            if path.is_dir():
                shutil.copytree(path, target, copy_function=fsutil.copy_file)
            else:
                fsutil.copy_file(path, target)
    for tag, files in rendered.items():
        base = tag_dir(staging, tag)
        base.mkdir()
        for name, text in files.items():
            old = tag_dir(out_dir, tag) / name
            if _same(old, text):
                fsutil.copy_file(old, base / name)  # unchanged: keep its mtime
            else:
                fsutil.write_file(base / name, text)


def apply(rendered: dict[str, dict[str, str]], matrix: Matrix | None = None, prune: bool = False,
          out_dir: Path = OUT_DIR) -> tuple[list[Path], list[Path]]:
    """Make out_dir hold `rendered` (and, with prune, only the matrix's tags): all of it or none of it.

    Serialised with other writers by a flock; a failure or signal leaves the old tree untouched.
    Returns (files changed, directories removed)."""
    out_dir = Path(out_dir)
    keep = {e.tag for e in matrix.entries} if prune and matrix is not None else None
    staging = treeswap.staging_dir(out_dir)
    try:
        with fsutil.tree_lock(out_dir, on_wait=log.info):
            for note in treeswap.recover(out_dir):
                log.info(f"render: {note}")
            _refuse_links(out_dir)
            changed, removed = _plan(rendered, out_dir, keep)
            if not changed and not removed:
                return [], []
            treeswap.refuse_pinned(out_dir)
            try:
                _stage(rendered, out_dir, staging, removed)
                treeswap.swap(out_dir, staging)
            except BaseException:
                if staging.exists() and not treeswap.ready_marker(out_dir).exists():
                    shutil.rmtree(staging, ignore_errors=True)
                raise
            return changed, removed
    except OSError as exc:
        where = exc.filename or out_dir
        raise EnvironmentProblem(f"{where}: cannot write ({exc.strerror or exc}); {out_dir}/ was left as it was",
                                 "free disk space or fix the permissions, then render again") from None


def write(rendered: dict[str, dict[str, str]], out_dir: Path = OUT_DIR) -> list[Path]:
    """Render into out_dir without removing other tags' directories."""
    return apply(rendered, None, prune=False, out_dir=out_dir)[0]


def extra_dirs(matrix: Matrix, out_dir: Path = OUT_DIR) -> list[Path]:
    if not out_dir.is_dir():
        return []
    tags = {e.tag for e in matrix.entries}
    return sorted(p for p in out_dir.iterdir() if p.is_dir() and p.name not in tags)


def check(matrix: Matrix, entries: list[Entry], out_dir: Path = OUT_DIR) -> list[str]:
    """Problems between the committed tree and a fresh render (empty when up to date)."""
    problems = []
    for tag, files in render_all(entries).items():
        folder = tag_dir(out_dir, tag)
        problems += [f"{p}: render does not write this file (locks live in {paths.LOCKS}/{tag}/) — remove it or run "
                     f"`python -m builder render {tag}`" for p in (sorted(folder.iterdir()) if folder.is_dir() else [])
                     if p.name not in files]
        for name, text in files.items():
            path = tag_dir(out_dir, tag) / name
            try:
                current = path.read_text(encoding="utf-8") if path.exists() else None
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{path}: unreadable ({getattr(exc, 'strerror', None) or exc.__class__.__name__})"
                                f" — run `python -m builder render {tag}`")
                continue
            if current is None:
                problems.append(f"{path}: missing — run `python -m builder render {tag}`")
            elif current != text:
                problems.append(f"{path}: stale (differs from a fresh render) — run `python -m builder render {tag}`")
    for path in extra_dirs(matrix, out_dir):
        problems.append(f"{path}: no matrix entry has this tag — remove it or run `python -m builder render`")
    return problems


# --- the tool --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    tags: tuple = arg(nargs="*", default=(), metavar="TAG",
                      help="tags or globs; default: every entry and the README table")
    check: bool = switch("--check", help="fail if committed files are stale or extra directories exist")


def main(options: Options, m: Matrix) -> int:
    from builder import readme

    entries = select(m, list(options.tags) or None)
    if options.check:
        problems = check(m, entries)
        if not options.tags:
            problems += readme.check(m)
        if problems:
            raise UserError("\n".join(problems), "re-render and commit the result")
        log.info(f"{len(entries)} rendered entries up to date")
        return 0
    # One transaction: changed files and removed tag directories are swapped in together.
    written, removed = apply(render_all(entries), m, prune=not options.tags)
    if not options.tags:
        written += readme.write(m)
    for path in written:
        log.info(f"wrote {path}")
    for path in removed:
        log.info(f"removed {path} (no matrix entry)")
    log.info(f"{len(entries)} entries rendered, {len(written)} files changed")
    return 0
