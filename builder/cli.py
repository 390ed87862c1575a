"""`python -m builder VERB`: parses arguments, loads the matrix once, selects entries, builds each step's
frozen options, runs it, and is the only place that prints errors and picks exit codes. Every verb is a
step or a tool module under builder/steps/ (builder/steps/__init__.py describes both shapes).

Nothing under builder/ imports this module (tests/unit/test_layering.py keeps it so).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from builder import fsutil, log, runner
from builder.errors import BuilderError, Terminated
from builder.model import compat, matrix
from builder.model.inputs import Inputs
from builder.steps import STEPS, TOOLS, VERBS


def options_from(args: argparse.Namespace, cls):
    """The step's frozen options from the parsed arguments: argparse objects stop here. A step's `inputs`
    field is the one Inputs object (builder/model/inputs.py), built here once from the same flags."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    if any(f.name == "inputs" for f in dataclasses.fields(cls)):
        values["inputs"] = options_from(args, Inputs)
    return cls(**values)


def run_step(module, args, m: matrix.Matrix) -> int:
    entries = matrix.choose(m, args.tags, args.all, default_all=module.DEFAULT_ALL)
    # Steps that make an image also need the recipe to cover the entry: what it cannot build is exit 3.
    compat.require(entries, recipe=module.NAME in compat.RECIPE_STEPS)
    options = options_from(args, module.Options)
    options = module.prepare(entries, options) or options  # prepare may fill in what it read (a password)
    # A step that only reads (lock --check) says so: it takes no per-tag lock (runner.py).
    locked = getattr(module, "needs_tag_lock", lambda _options: True)(options)
    outcomes = runner.run(module.NAME, entries, lambda entry: module.run(entry, options), lock=locked)
    for outcome in outcomes:
        if outcome.error is not None:
            _print_error(outcome.error, prefix="" if outcome.error.message.startswith(outcome.tag) else
                         f"{outcome.tag}: ")
    return runner.exit_code(outcomes)


def run_tool(module, args, m: matrix.Matrix | None) -> int:
    return module.main(options_from(args, module.Options), m)


# --- parser ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builder",
                                     description="Build, gate and publish reproducible GPU training images.")
    parser.add_argument("--matrix", default=os.environ.get("BUILDER_MATRIX", "matrix.yaml"),
                        help="matrix file (default: matrix.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name in VERBS:
        module = importlib.import_module(STEPS.get(name) or TOOLS[name])
        step = name in STEPS
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if step or issubclass(module.Options, matrix.Selection):
            p.add_argument("tags", nargs="*", metavar="TAG", help="tags or globs (cu12*-torch2.*)")
            p.add_argument("--all", action="store_true", help="every entry")
        module.add_arguments(p)
        p.set_defaults(handler=functools.partial(run_step if step else run_tool, module),
                       needs_matrix=True if step else module.NEEDS_MATRIX)
    return parser


def _print_error(exc: BuilderError, prefix: str = "") -> None:
    for line in str(exc.message).rstrip("\n").split("\n"):  # not splitlines(): a CR is shown, not a line break
        log.info(f"error: {prefix}{line}")  # cleaned there: a message may quote what an engine or registry sent
    if exc.hint:
        log.info(f"hint: {exc.hint}")


def _matrix(args) -> matrix.Matrix | None:
    if args.needs_matrix == "optional":
        try:
            return matrix.load(Path(args.matrix))
        except BuilderError:
            return None  # e.g. `diff` of two image references outside a checkout
    return matrix.load(Path(args.matrix)) if args.needs_matrix else None


def _terminate(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM's default ends the process at once: a `docker build` it started would run on unowned and move the
    # tag when it finishes. Raised instead, it takes the Ctrl-C path (children stopped, exit 143).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return _run(args)
    finally:
        if main_thread and previous is not None:  # None: a handler set outside Python, left as it was found
            signal.signal(signal.SIGTERM, previous)


def _run(args) -> int:
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
    except Terminated:
        print("terminated", file=sys.stderr)
        return Terminated.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return runner.INTERRUPTED
