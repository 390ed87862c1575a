"""`python -m builder VERB`: parses arguments, loads the matrix once, selects entries, builds each step's
frozen options, runs it, and is the only place that prints errors and picks exit codes.

Nothing under builder/ imports this module (tests/unit/test_layering.py keeps it so).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

from builder import fsutil, log, runner
from builder.errors import BuilderError, UserError
from builder.model import compat, matrix, plan, proof
from builder.model.inputs import Inputs
from builder.steps import STEPS, TOOLS

HEADERS = ("tag", "torch", "CUDA", "Python", "transformers", "deepspeed", "flash-attn", "proven")


def options_from(args: argparse.Namespace, cls):
    """The step's frozen options from the parsed arguments: argparse objects stop here. A step's `inputs`
    field is the one Inputs object (builder/model/inputs.py), built here once from the same flags."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    if any(f.name == "inputs" for f in dataclasses.fields(cls)):
        values["inputs"] = options_from(args, Inputs)
    return cls(**values)


def select(args, m: matrix.Matrix, default_all: bool = True) -> list[matrix.Entry]:
    tags, every = getattr(args, "tags", None), getattr(args, "all", False)
    if tags and every:
        raise UserError("give tags or --all, not both")
    if not tags and not every and not default_all:
        raise UserError("which image? name tags (or globs), or pass --all", f"e.g. {m.default.tag}")
    return matrix.select(m, None if every else tags)


# --- verbs of the CLI itself ------------------------------------------------------------------------------


def cmd_validate(args, m: matrix.Matrix) -> int:
    entries = select(args, m)
    compat.require(entries)
    if args.strict:
        problems = matrix.strict_problems(m)
        if problems:
            raise UserError("\n".join(problems))
    log.info(f"{m.path}: {len(entries)} entries valid{' (strict)' if args.strict else ''}")
    return 0


def cmd_list(args, m: matrix.Matrix) -> int:
    known = proof.levels()
    rows = [[e.tag, e.torch, e.cuda, e.python, e.pins["transformers"], e.pins["deepspeed"],
             e.pins["flash-attn"] or "—", proof.phrase(e, known)] for e in select(args, m)]
    print(log.table(HEADERS, rows))
    return 0


def cmd_matrix(args, m: matrix.Matrix) -> int:
    entries = select(args, m)
    if args.runner:
        entries = [e for e in entries if plan.needs_gpu_gate(e) == (args.runner == "gpu")]
    if args.changed_against:
        from builder.steps.plan import current  # the workflow's own plan step decides the same way

        entries = [e for e in entries if not current(e, args.changed_against)]
    print(json.dumps(plan.github_matrix(entries), sort_keys=True))
    return 0


def cmd_compat(args, m: matrix.Matrix) -> int:
    """Every rule checked for the entries, with outcome and evidence, and the facts derived from them."""
    from builder.model import explain

    entries = select(args, m)
    print("\n\n".join(explain.report(e) for e in entries))
    broken = [e.tag for e in entries if compat.check(e)]
    if broken:
        raise UserError(f"{', '.join(broken)} break(s) compatibility rules (table above)",
                        "change the entry or, if a rule is wrong, fix compat.yaml with a source")
    return 0


def run_step(module, args, m: matrix.Matrix) -> int:
    entries = select(args, m, default_all=module.DEFAULT_ALL)
    compat.require(entries)
    options = options_from(args, module.Options)
    options = module.prepare(entries, options) or options  # prepare may fill in what it read (a password)
    outcomes = runner.run(module.NAME, entries, lambda entry: module.run(entry, options))
    for outcome in outcomes:
        if outcome.error is not None:
            _print_error(outcome.error, prefix="" if outcome.error.message.startswith(outcome.tag) else
                         f"{outcome.tag}: ")
    return runner.exit_code(outcomes)


# --- parser ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builder",
                                     description="Build, gate and publish reproducible GPU training images.")
    parser.add_argument("--matrix", default=os.environ.get("BUILDER_MATRIX", "matrix.yaml"),
                        help="matrix file (default: matrix.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help_text: str, tags: bool) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if tags:
            p.add_argument("tags", nargs="*", metavar="TAG", help="tags or globs (cu12*-torch2.*)")
            p.add_argument("--all", action="store_true", help="every entry")
        return p

    p = verb("validate", "check the matrix schema and compatibility rules", tags=True)
    p.add_argument("--strict", action="store_true", help="also require every base pinned by digest with its source")
    p.set_defaults(handler=cmd_validate, needs_matrix=True)
    verb("list", "table of the matrix entries", tags=True).set_defaults(handler=cmd_list, needs_matrix=True)
    p = verb("matrix", "the GitHub Actions strategy.matrix JSON", tags=True)
    p.add_argument("--format", choices=["github"], default="github")
    p.add_argument("--runner", choices=["gpu", "hosted"], help="only entries gated on GPU runners, or on hosted ones")
    p.add_argument("--changed-against", metavar="REGISTRY",
                   help="leave out entries whose published alias there was built from exactly these inputs")
    p.set_defaults(handler=cmd_matrix, needs_matrix=True)
    verb("compat", "explain the compatibility rules for entries: outcome, evidence, derived facts",
         tags=True).set_defaults(handler=cmd_compat, needs_matrix=True)
    for name, path in STEPS.items():
        module = importlib.import_module(path)
        p = verb(name, module.HELP, tags=True)
        module.add_arguments(p)
        p.set_defaults(handler=lambda args, m, module=module: run_step(module, args, m), needs_matrix=True)
    for name, path in TOOLS.items():
        module = importlib.import_module(path)
        p = verb(name, module.HELP, tags=False)
        module.add_arguments(p)
        p.set_defaults(handler=lambda args, m, module=module: module.main(options_from(args, module.Options), m),
                       needs_matrix=module.NEEDS_MATRIX)
    return parser


def _print_error(exc: BuilderError, prefix: str = "") -> None:
    for line in str(exc.message).splitlines() or [""]:
        print(f"error: {prefix}{line}", file=sys.stderr)
    if exc.hint:
        print(f"hint: {exc.hint}", file=sys.stderr)


def _matrix(args) -> matrix.Matrix | None:
    if args.needs_matrix == "optional":
        try:
            return matrix.load(Path(args.matrix))
        except BuilderError:
            return None  # e.g. `diff` of two image references outside a checkout
    return matrix.load(Path(args.matrix)) if args.needs_matrix else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args, _matrix(args))
    except BuilderError as exc:
        if args.verbose:
            raise
        _print_error(exc)
        return exc.exit_code
    except OSError as exc:
        if args.verbose or exc.errno not in fsutil.FULL:
            raise
        problem = fsutil.write_failed(exc.filename, exc)
        _print_error(problem)
        return problem.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return runner.INTERRUPTED
