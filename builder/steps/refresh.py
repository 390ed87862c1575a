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
from builder.derive import api_index, pypi_signals
from builder.derive import archs as derive_archs
from builder.errors import UserError
from builder.flags import arg, switch
from builder.model import archs, compat, knowledge, names
from builder.model import signals as signals_model

RAW = "https://raw.githubusercontent.com/Dao-AILab/flash-attention/v{version}/{path}"
FLASH_FILES = (".github/workflows/publish.yml", "setup.py")
FLASH_SINCE = "2.5.8"  # older releases are not in compat.yaml and not worth tracking
TIMEOUT_S = 30


DIFFERENCES_EXIT = 1  # compat.yaml differs from what the releases say (and --write was not given)


@dataclass(frozen=True)
class Options:
    write: bool = switch("--write", help="apply the changes to builder/data/compat.yaml")
    flash_attn_git: str | None = arg("--flash-attn-git", default=None, metavar="DIR",
                                     help="a clone of Dao-AILab/flash-attention to read release workflows from "
                                          "(GitHub itself may be unreachable)")
    since: str = arg("--since", default="2.0", help="oldest torch minor to compare (default 2.0)")
    compat_file: str | None = arg("--compat-file", default=None, metavar="PATH",
                                  help="the compat.yaml to compare and write (default: the one shipped in the package)")
    api: bool = switch("--api", help="re-read the names index (data/knowledge/api: what each release imports from "
                                     "the others, and which releases lack it) from the packages' published files")
    archs: bool = switch("--archs", help="re-read the GPU arch lists (data/knowledge/archs.yaml) from torch's "
                                         "PyPI wheels (libtorch_cuda.so) and flash-attn's sdists (setup.py)")
    signals: bool = switch("--signals", help="re-read PyPI's signals (data/knowledge/pypi: yanks, Requires-Python, "
                                             "Requires-Dist, wheel tags) for every release of the stack's packages")
    release: tuple = arg("--release", nargs="+", default=(), metavar="PKG==VERSION",
                         help="with --api: read only these releases and add them to the index (default: every "
                              "release since each package's floor in data/knowledge/surface.yaml)")
    knowledge_dir: str | None = arg("--knowledge-dir", default=None, metavar="DIR",
                                    help="the data/knowledge directory to compare and write (default: the package's)")


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


def _knowledge_dir(args) -> Path:
    return Path(args.knowledge_dir) if args.knowledge_dir else Path(str(resources.files("builder").joinpath(
        "data/knowledge")))


def _releases(args) -> dict[str, list[str]] | None:
    if not args.release:
        return None
    wanted: dict[str, list[str]] = {}
    known = api_index.surface()
    for item in args.release:
        name, sep, version = item.partition("==")
        if not sep or name not in known or not version:
            raise UserError(f"--release {item!r}: expected PKG==VERSION with PKG one of {', '.join(known)}",
                            "e.g. --release accelerate==1.2.0")
        wanted.setdefault(name, []).append(version)
    return wanted


def api_texts(args) -> dict[str, str]:
    """The names index as `--api` re-reads it: {path under data/knowledge: text}."""
    folder = _knowledge_dir(args) / "api"
    only = _releases(args)
    index = api_index.Index.load(folder) if only is not None else api_index.Index()
    projects: dict[str, dict] = {}

    def project(name: str) -> dict:
        if name not in projects:
            projects[name] = pypi.project(name)
        return projects[name]

    with log.step("names index from the published files") as note:
        try:
            api_index.refresh(index, pypi.fetch_file, project, only, progress=log.info)
        except ValueError as exc:
            raise UserError(str(exc), "name a final release that PyPI lists") from None
        note["result"] = f"{sum(len(r) for r in index.releases.values())} releases of {len(index.releases)} packages"
    return {f"api/{name}": text for name, text in index.texts().items()}


def knowledge_main(args: Options) -> int:
    """--api (and the other generated sources): compare what the artifacts say with data/knowledge; --write writes."""
    root = _knowledge_dir(args)
    texts = api_texts(args) if args.api else {}
    if args.archs:
        with log.step("GPU arch lists from the published binaries") as note:
            data = derive_archs.refresh(since=args.since, log=log.info)
            note["result"] = f"{len(data['torch'])} torch minors, {len(data['flash_attn'])} flash-attn releases"
        texts["archs.yaml"] = derive_archs.render(data)
    if args.signals:
        with log.step("PyPI signals of the stack's releases") as note:
            docs = pypi_signals.refresh()
            count = sum(len(d.get("releases", {})) for d in docs.values())
            note["result"] = f"{count} releases of {len(docs)} packages"
        texts.update({f"pypi/{name}.json": pypi_signals.render(doc) for name, doc in docs.items()})
    changed = [rel for rel, text in texts.items() if not (root / rel).is_file() or
               (root / rel).read_text(encoding="utf-8") != text]
    if not changed:
        log.info(f"{root}: {len(texts)} files agree with the published artifacts")
        return 0
    for rel in changed:
        log.out(f"{'changed' if (root / rel).is_file() else 'new'}: {root / rel}")
    if not args.write:
        log.info(f"{len(changed)} files differ; review with --write and git diff")
        return DIFFERENCES_EXIT
    for rel in changed:
        fsutil.write_atomic(root / rel, texts[rel])
    for cached in (names.index, archs.data, signals_model.load):
        cached.cache_clear()
    log.info(f"wrote {len(changed)} files under {root}; run the unit tests (tests/unit/test_names.py)")
    return 0


def main(args: Options, m=None) -> int:
    if args.api or args.archs or args.signals:
        return knowledge_main(args)
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
    if not changes:
        log.info(f"{path} agrees with PyPI" + (" and the release files" if args.flash_attn_git else ""))
        return 0
    for c in changes:
        log.out(c.render())
    if not args.write:
        # Non-zero so a scheduled job notices that compat.yaml fell behind the releases.
        log.info(f"{len(changes)} differences; review them, then run with --write to apply them to {path}")
        return DIFFERENCES_EXIT
    applicable = [c for c in changes if c.old is not None or isinstance(c.new, dict)]
    fsutil.write_atomic(path, knowledge.apply_text(text, applicable, lambda c: _source(c, args)))
    compat.rules.cache_clear()
    compat.constraint_rules.cache_clear()
    log.info(f"wrote {path}: {len(applicable)} changes ({len(changes) - len(applicable)} need a person: "
             "releases without wheel data); re-run `validate --strict` and the unit tests")
    return 0
