"""The pipeline steps, one module each, all of one shape (cibuildwheel's `platforms/` habit).

A *per-tag step* (resolve, lock, build, smoke, publish, repro) is a module with:
    NAME, HELP            the verb and its one-line help
    DEFAULT_ALL           True: no tags means every entry; False: tags (or --all) are required
    Options               a frozen dataclass; the CLI builds it from its arguments (argparse stops there)
    add_arguments(p)      the verb's flags
    prepare(entries, o)   checks before any tag runs (flags sane, engine up); raises a BuilderError; may
                          return options completed with what it read (dataclasses.replace), else None
    run(entry, o) -> Done one entry; raises a BuilderError when the step fails for that entry
`builder.runner` runs a step over entries with one failure policy and one summary table.

A *tool* (validate, list, matrix, compat, render, catalog, verify, manifest, diff, audit, refresh-compat,
propose, plan, login, sign) works on the matrix or on images as a whole:
    NAME, HELP, Options, add_arguments(p), NEEDS_MATRIX, main(options, matrix) -> int
    An Options that extends `model.matrix.Selection` gets the TAG.../--all arguments of the per-tag steps
    from the CLI; `options.entries(matrix)` are the entries they name.

No step imports the CLI, nor another step except through an edge listed with its reason in
tests/unit/test_layering.py; shared pieces live in builder/model and builder/boundary. `STEPS` and `TOOLS`
name the modules; the CLI imports them lazily, in the order of `VERBS` (what `--help` lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

STEPS = {
    "resolve": "builder.steps.resolve",
    "lock": "builder.steps.lock",
    "build": "builder.steps.build",
    "smoke": "builder.steps.smoke",
    "publish": "builder.steps.publish",
    "repro": "builder.steps.repro",
}
# Tools that read only the matrix: first in `--help`, before the pipeline.
MATRIX_TOOLS = {
    "validate": "builder.steps.validate",
    "list": "builder.steps.listing",
    "matrix": "builder.steps.cimatrix",
    "compat": "builder.steps.compatreport",
}
TOOLS = {
    **MATRIX_TOOLS,
    "render": "builder.steps.render",
    "catalog": "builder.steps.catalog",
    "verify": "builder.steps.verify",
    "manifest": "builder.steps.manifest",
    "diff": "builder.steps.diff",
    "audit": "builder.steps.audit",
    "refresh-compat": "builder.steps.refresh",
    "propose": "builder.steps.propose",
    "plan": "builder.steps.plan",
    "login": "builder.steps.login",
    "sign": "builder.steps.sign",
}
VERBS = (*MATRIX_TOOLS, *STEPS, *(name for name in TOOLS if name not in MATRIX_TOOLS))


@dataclass(frozen=True)
class Done:
    """What one entry's run of a step came to: a short result word and a detail for the summary."""

    result: str
    detail: str = ""


class Step(Protocol):
    NAME: str
    HELP: str
    DEFAULT_ALL: bool
    Options: type

    def add_arguments(self, parser) -> None: ...

    def prepare(self, entries: list, options): ...

    def run(self, entry, options) -> Done: ...


class Tool(Protocol):
    NAME: str
    HELP: str
    NEEDS_MATRIX: bool
    Options: type

    def add_arguments(self, parser) -> None: ...

    def main(self, options, matrix) -> int: ...
