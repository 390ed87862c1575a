"""`refresh-compat`: compare compat.yaml's release data with what the publishers say now, and show the diff.

Read here (network): PyPI's JSON API for torch (release files, then one Linux wheel's PEP 658 core
metadata per minor) and for flash-attn (which releases exist), and flash-attention's release workflow
and setup.py per tag -- from GitHub when reachable, or from a local clone (`--flash-attn-git DIR`).
The parsing and the diff are pure (builder.model.knowledge). Nothing is written unless `--write`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from builder import fsutil, log
from builder.boundary import git, pypi, web
from builder.errors import UserError
from builder.flags import arg, switch
from builder.model import compat, knowledge

RAW = "https://raw.githubusercontent.com/Dao-AILab/flash-attention/v{version}/{path}"
FLASH_FILES = (".github/workflows/publish.yml", "setup.py")
FLASH_SINCE = "2.5.8"  # older releases are not in compat.yaml and not worth tracking
TIMEOUT_S = 30


DIFFERENCES_EXIT = 1  # compat.yaml differs from what the releases say (and --write was not given)
# Packages whose declared minimums `--declared` reads, and the first release with core metadata to read.
DECLARED_SINCE = {"transformers": "4.33", "accelerate": "0.24"}


@dataclass(frozen=True)
class Options:
    write: bool = switch("--write", help="apply the changes to builder/data/compat.yaml")
    flash_attn_git: str | None = arg("--flash-attn-git", default=None, metavar="DIR",
                                     help="a clone of Dao-AILab/flash-attention to read release workflows from "
                                          "(GitHub itself may be unreachable)")
    since: str = arg("--since", default="2.0", help="oldest torch minor to compare (default 2.0)")
    declared: bool = switch("--declared", help="also compare the `declared:` minimums with the core metadata of "
                                               "every transformers and accelerate release (one request per release)")
    compat_file: str | None = arg("--compat-file", default=None, metavar="PATH",
                                  help="the compat.yaml to compare and write (default: the one shipped in the package)")


def _get(url: str) -> bytes:
    return web.get(url, timeout=TIMEOUT_S)


def torch_from_pypi(since: str) -> dict[str, dict]:
    """{minor: facts} for the newest release of each torch minor on PyPI."""
    project = pypi.project("torch")
    out = {}
    for minor, version in knowledge.latest_per_minor(project["releases"], since).items():
        files = project["releases"][version]
        wheels = knowledge.linux_wheels(files)
        metadata = None
        for wheel in wheels[:3]:  # metadata is per file; a few tries cover partly backfilled releases
            try:
                metadata = pypi.wheel_metadata("torch", wheel)
                break
            except OSError as exc:
                reason = getattr(exc, "status", None) or exc
        else:
            if wheels:
                log.info(f"note: torch {version}: no core metadata ({reason}); its CUDA build and cuDNN are "
                         "not compared")
        out[minor] = knowledge.torch_facts(version, files, metadata)
    return out


def declared_metadata(name: str, since: str) -> dict[str, list[str]]:
    """{release: its Requires-Dist and Requires-Python lines} for the final releases of `name` since `since`."""
    project = pypi.project(name)
    out = {}
    for raw, files in project.get("releases", {}).items():
        try:
            version = Version(raw)
        except InvalidVersion:
            continue
        wheels = [f for f in files if f.get("filename", "").endswith(".whl") and not f.get("yanked")]
        if version.is_prerelease or version < Version(since) or not wheels:
            continue
        try:
            text = pypi.wheel_metadata(name, wheels[0])
        except OSError:  # web.Failed is an OSError
            continue  # releases uploaded before PEP 658 have no separate metadata file
        out[raw] = [ln.split(":", 1)[1].strip() for ln in text.splitlines()
                    if ln.startswith(("Requires-Dist:", "Requires-Python:"))]
    return out


def _flash_versions() -> list[str]:
    project = pypi.project("flash-attn")
    found = []
    for raw in project["releases"]:
        try:
            v = Version(raw)
        except InvalidVersion:
            continue
        if not v.is_prerelease and v >= Version(FLASH_SINCE):
            found.append(raw)
    return sorted(found, key=Version)


def flash_attn_releases(clone: str | None) -> tuple[dict[str, dict | None], list[str]]:
    """{version: wheel matrix or None when its release files could not be read}, notes for the user."""
    notes, out = [], {}
    versions = _flash_versions()
    github = clone is None
    for version in versions:
        texts = []
        for path in FLASH_FILES:
            if clone:
                texts.append(git.show(clone, f"v{version}", path))
            elif github:
                try:
                    texts.append(_get(RAW.format(version=version, path=path)).decode())
                except OSError as exc:
                    github = False
                    notes.append(f"GitHub not reachable ({exc}): flash-attn wheel lists "
                                 "not refreshed; pass --flash-attn-git DIR (a clone) to read them")
                    texts.append(None)
            else:
                texts.append(None)
        if None in texts:
            out[version] = None
            continue
        try:
            out[version] = knowledge.flash_attn_release(*texts)
        except ValueError as exc:
            notes.append(f"flash-attn {version}: release files not understood ({exc}); left as is")
            out[version] = None
    return out, notes


def _compat_path(args) -> Path:
    return Path(args.compat_file) if args.compat_file else Path(str(resources.files("builder").joinpath(
        "data/compat.yaml")))


def _source(change: knowledge.Change, args) -> str:
    today = date.today().isoformat()
    if change.section == "torch":
        return f"https://pypi.org/pypi/torch/json and the wheels' core metadata (refresh-compat {today})"
    where = "a clone" if args.flash_attn_git else "GitHub"  # no local paths in shipped data
    return (f"https://github.com/Dao-AILab/flash-attention/blob/v{change.key}/.github/workflows/publish.yml "
            f"(matrix, minv/maxv) and setup.py (get_wheel_url), read from {where} by refresh-compat {today}")


def main(args: Options, m=None) -> int:
    path = _compat_path(args)
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        current_torch, current_flash = data["torch"], data["flash_attn"]["releases"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a readable compat.yaml ({exc})", "point --compat-file at a compat.yaml") from exc
    if args.flash_attn_git and not Path(args.flash_attn_git, ".git").exists() and not Path(
            args.flash_attn_git, "HEAD").exists():
        raise UserError(f"--flash-attn-git {args.flash_attn_git}: not a git repository",
                        "clone https://github.com/Dao-AILab/flash-attention there (tags included)")
    with log.step("torch releases on PyPI") as note:
        torch = torch_from_pypi(args.since)
        note["result"] = f"{len(torch)} minors ({', '.join(torch)})"
    with log.step("flash-attn releases") as note:
        flash, notes = flash_attn_releases(args.flash_attn_git)
        note["result"] = f"{len(flash)} releases on PyPI, {sum(v is not None for v in flash.values())} wheel lists read"
    for line in notes:
        log.info(f"note: {line}")
    changes = knowledge.diff_torch(current_torch, torch) + knowledge.diff_flash_attn(current_flash, flash)
    if args.declared:
        with log.step("declared minimums in package metadata") as note:
            fetched = [row for name, since in DECLARED_SINCE.items() for row in
                       knowledge.declared_rows(name, declared_metadata(name, since))]
            note["result"] = f"{len(fetched)} version ranges"
        changes += knowledge.diff_declared(data.get("declared", []), fetched)
    if not changes:
        log.info(f"{path} agrees with PyPI" + (" and the release files" if args.flash_attn_git else ""))
        return 0
    for c in changes:
        log.out(c.render())
    if not args.write:
        # Non-zero so a scheduled job notices that compat.yaml fell behind the releases.
        log.info(f"{len(changes)} differences; review them, then run with --write to apply them to {path}")
        return DIFFERENCES_EXIT
    # `declared:` rows are proposed, not written: a person checks the range boundaries against the rules.
    applicable = [c for c in changes if c.section != "declared" and (c.old is not None or isinstance(c.new, dict))]
    fsutil.write_atomic(path, knowledge.apply_text(text, applicable, lambda c: _source(c, args)))
    compat.rules.cache_clear()
    compat.constraint_rules.cache_clear()
    log.info(f"wrote {path}: {len(applicable)} changes ({len(changes) - len(applicable)} need a person: "
             "releases without wheel data); re-run `validate --strict` and the unit tests")
    return 0
