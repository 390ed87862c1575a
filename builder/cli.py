"""`python -m builder VERB`: parses arguments, loads the matrix once, selects entries, builds each step's
frozen options, runs it, and is the only place that prints errors and picks exit codes. Every verb is a
step or a tool module under builder/steps/ (builder/steps/__init__.py describes both shapes).

Nothing under builder/ imports this module (tests/unit/test_layering.py keeps it so).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from builder import flags, fsutil, log, runner
from builder.errors import BuilderError, Terminated
from builder.model import compat, matrix
from builder.steps import VERBS, Verb


def options_from(args: argparse.Namespace, cls):
    """The verb's frozen options from the parsed arguments: argparse objects stop here. A nested field (a
    step's `inputs`, builder/model/inputs.py) is built here once from the same flags."""
    return flags.values(cls, lambda name: getattr(args, name))


def add_flags(p: argparse.ArgumentParser, cls) -> None:
    """The arguments the fields of `cls` declare (builder/flags.py), in field order."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name, flag in flags.declared(cls):
        if flag.exclusive and flag.exclusive not in groups:
            groups[flag.exclusive] = p.add_mutually_exclusive_group()
        into = groups[flag.exclusive] if flag.exclusive else p
        kwargs = {**flag.kwargs, **({"default": flag.default_from()} if flag.default_from else {})}
        if flag.names:
            into.add_argument(*flag.names, dest=name, **kwargs)
        else:
            into.add_argument(name, **kwargs)
        if flag.negation:
            into.add_argument(flag.negation[0], dest=name, action="store_false", help=flag.negation[1])


def run_step(verb: Verb, module, args, m: matrix.Matrix) -> int:
    selection = options_from(args, matrix.Selection)
    entries = matrix.choose(m, selection.tags, selection.all, default_all=verb.default_all)
    # Steps that make an image also need the recipe to cover the entry: what it cannot build is exit 3.
    compat.require(entries, recipe=verb.name in compat.RECIPE_STEPS)
    options = options_from(args, module.Options)
    options = module.prepare(entries, options) or options  # prepare may fill in what it read (a password)
    # A step that only reads (lock --check) says so: it takes no per-tag lock (runner.py).
    locked = getattr(module, "needs_tag_lock", lambda _options: True)(options)
    outcomes = runner.run(verb.name, entries, lambda entry: module.run(entry, options), lock=locked)
    for outcome in outcomes:
        if outcome.error is not None:
            _print_error(outcome.error, prefix="" if outcome.error.message.startswith(outcome.tag) else
                         f"{outcome.tag}: ")
    return runner.exit_code(outcomes)


def run_tool(verb: Verb, module, args, m: matrix.Matrix | None) -> int:
    return module.main(options_from(args, module.Options), m)


# --- parser ------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """No abbreviated flags (`--password` must not pass for `--password-stdin`), and an unknown argument is
    named without the values around it: a user who typed `--password S3cret` must not find it in a CI log."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            flags_given = " ".join(a.split("=", 1)[0] for a in extras if a.startswith("-")) or "a value"
            self.error(f"unrecognized arguments: {flags_given} (values not shown)")
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        # argparse checks `choices` only for values typed on the command line, not for a default taken from the
        # environment: GITHUB_EVENT_NAME=pull_request_target must not pass for a push.
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            if action.choices and action.option_strings and value is not None and value not in action.choices:
                self.error(f"argument {action.option_strings[-1]}: {str(value)[:60]!r} (its default from the "
                           f"environment) is not one of {', '.join(map(str, action.choices))}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m builder", description="Build, gate and publish reproducible GPU training images.")
    parser.add_argument("--matrix", default=os.environ.get("BUILDER_MATRIX", "matrix.yaml"),
                        help="matrix file (default: matrix.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_Parser)
    for verb in VERBS:
        module = importlib.import_module(f"builder.steps.{verb.module}")
        p = sub.add_parser(verb.name, help=verb.help, description=verb.help)
        if verb.per_tag:  # a tool whose Options extends matrix.Selection declares the same two arguments itself
            add_flags(p, matrix.Selection)
        add_flags(p, module.Options)
        p.set_defaults(handler=functools.partial(run_step if verb.per_tag else run_tool, verb, module),
                       needs_matrix=True if verb.per_tag else verb.matrix)
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
    except BrokenPipeError:
        # The reader went away (`builder list | head -1`): what it did not read is not an error of ours. Python's
        # advice: point stdout at devnull, so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
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
