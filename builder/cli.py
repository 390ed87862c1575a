"""`python -m builder VERB`: the only place that prints errors and chooses exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from builder import log
from builder.errors import BuilderError, EnvironmentProblem, UserError
from builder.model import compat, matrix

HEADERS = ("tag", "torch", "CUDA", "Python", "transformers", "deepspeed", "flash-attn")


def _load(args) -> matrix.Matrix:
    return matrix.load(Path(args.matrix))


def _selected(args, m: matrix.Matrix | None = None) -> list[matrix.Entry]:
    m = m or _load(args)
    return matrix.select(m, getattr(args, "tags", None))


def table_rows(entries) -> list[list[str]]:
    return [[e.tag, e.torch, e.cuda, e.python, e.pins["transformers"], e.pins["deepspeed"],
             e.pins["flash-attn"] or "—"] for e in entries]


# --- verbs ---------------------------------------------------------------------------------------------


def cmd_validate(args) -> int:
    m = _load(args)
    entries = _selected(args, m)
    compat.require(entries)
    if args.strict:
        problems = matrix.strict_problems(m)
        if problems:
            raise UserError("\n".join(problems))
    log.info(f"{m.path}: {len(entries)} entries valid{' (strict)' if args.strict else ''}")
    return 0


def cmd_list(args) -> int:
    print(log.table(HEADERS, table_rows(_selected(args))))
    return 0


def cmd_matrix(args) -> int:
    from builder.model import plan

    print(json.dumps(plan.github_matrix(_selected(args)), sort_keys=True))
    return 0


def cmd_resolve(args) -> int:
    from builder.steps import resolve

    entries = _selected(args)
    compat.require(entries)
    rows = []
    for e in entries:
        with log.step(f"resolve {e.tag}") as note:
            pins = resolve.resolve(e)
            note["result"] = f"{len(pins)} packages from {e.index_url}"
        rows.append([e.tag, len(pins), pins.get("torch"), pins.get("nvidia-nccl-cu13") or pins.get(
            "nvidia-nccl-cu12") or "—"])
    log.summary("Resolution", ("tag", "packages", "torch", "nccl"), rows)
    return 0


def cmd_lock(args) -> int:
    from builder.boundary import baseimage
    from builder.steps import lock, render

    entries = _selected(args)
    compat.require(entries)
    if args.check:
        problems = [p for e in entries for p in lock.check(e, render.OUT_DIR / e.tag)]
        problems += [p for e in entries if args.strict for p in lock.apt_problems(e, render.OUT_DIR / e.tag)]
        if problems:
            raise UserError("\n".join(problems))
        log.info(f"{len(entries)} locks satisfy their entries")
        return 0
    rows = []
    for e in entries:
        with log.step(f"lock {e.tag}") as note:
            summary = lock.lock(e, render.OUT_DIR / e.tag)
            if not args.no_apt:
                try:
                    ref = baseimage.reference(e, local=args.local_base)
                    summary["apt"] = lock.lock_apt(e, render.OUT_DIR / e.tag, ref)
                except EnvironmentProblem as exc:
                    lock.write_unpinned_apt(e, render.OUT_DIR / e.tag, exc.message)
                    summary["apt"] = "unpinned"
                    log.info(f"warning: {e.tag}: apt packages left unpinned: {exc.message}")
            note["result"] = f"{summary['packages']} Python packages ({summary['torch_layer']} in the torch layer)"
        rows.append([e.tag, summary["packages"], summary["torch_layer"], summary.get("apt", "—"),
                     summary["flash_attn"] or "—"])
    log.summary("Locks", ("tag", "python pkgs", "torch layer", "apt pkgs", "flash-attn"), rows)
    return 0


def cmd_render(args) -> int:
    from builder.steps import readme, render

    m = _load(args)
    entries = _selected(args, m)
    if args.check:
        problems = render.check(m, entries)
        if not args.tags:
            problems += readme.check(m)
        if problems:
            raise UserError("\n".join(problems), "re-render and commit the result")
        log.info(f"{len(entries)} rendered entries up to date")
        return 0
    written = render.write(render.render_all(entries))
    removed = render.remove_extra(m) if not args.tags else []
    if not args.tags:
        written += readme.write(m)
    for path in written:
        log.info(f"wrote {path}")
    for path in removed:
        log.info(f"removed {path} (no matrix entry)")
    log.info(f"{len(entries)} entries rendered, {len(written)} files changed")
    return 0


def _not_yet(name: str):
    def handler(args) -> int:
        raise UserError(f"`{name}` is not available yet in this version")

    return handler


# --- parser --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builder",
                                     description="Build, gate and publish reproducible GPU training images.")
    parser.add_argument("--matrix", default=os.environ.get("BUILDER_MATRIX", "matrix.yaml"),
                        help="matrix file (default: matrix.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, handler, help_text: str, tags: bool = True):
        p = sub.add_parser(name, help=help_text, description=help_text)
        if tags:
            p.add_argument("tags", nargs="*", metavar="TAG", help="tags or globs (cu12*-torch2.*); default: all")
        p.set_defaults(handler=handler)
        return p

    verb("validate", cmd_validate, "check the matrix schema and compatibility rules").add_argument(
        "--strict", action="store_true", help="also require every base pinned by digest with its source")
    verb("list", cmd_list, "table of the matrix entries")
    verb("matrix", cmd_matrix, "the GitHub Actions strategy.matrix JSON").add_argument(
        "--format", choices=["github"], default="github")
    verb("resolve", cmd_resolve, "prove each entry's packages resolve (uv pip compile against its index)")
    p = verb("lock", cmd_lock, "hash-locked requirements (and apt pins) into dockerfiles/<tag>/")
    p.add_argument("--check", action="store_true", help="offline: do committed locks satisfy the entries?")
    p.add_argument("--strict", action="store_true", help="with --check: also require a complete apt lock")
    p.add_argument("--no-apt", action="store_true", help="skip the apt lock (needs the base image)")
    p.add_argument("--local-base", action="store_true", help="prefer a local image named like the base")
    verb("render", cmd_render, "render dockerfiles/<tag>/ (and the README table)").add_argument(
        "--check", action="store_true", help="fail if committed files are stale or extra directories exist")
    register_later_verbs(verb)
    return parser


def register_later_verbs(verb) -> None:
    """Verbs of later pipeline steps; each module has `add_arguments(parser)` and `main(args)`."""
    import importlib

    for name, module, help_text, tags in (
        ("build", "builder.steps.build", "build images with BuildKit, verify them, write build reports", True),
        ("smoke", "builder.steps.smoke", "run the smoke gate in a built image; write the smoke report", True),
        ("publish", "builder.steps.publish", "push images that passed the gate; move the alias last", True),
        ("catalog", "builder.steps.catalog", "write IMAGES.md and images.json from the reports", False),
        ("verify", "builder.steps.verify", "re-verify a pulled image on this host (host checks + gate)", False),
        ("manifest", "builder.steps.manifest", "content manifest of an image (files, Python and OS packages)", False),
        ("repro", "builder.steps.repro", "rebuild from scratch and compare manifests", True),
        ("diff", "builder.steps.diff", "what changed between two images (tags or image refs)", False),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            verb(name, _not_yet(name), f"{help_text} (not available yet)", tags=tags)
            continue
        mod.add_arguments(verb(name, mod.main, help_text, tags=tags))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BuilderError as exc:
        if args.verbose:
            raise
        lines = str(exc.message).splitlines() or [""]
        for line in lines:
            print(f"error: {line}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
