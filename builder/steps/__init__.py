"""The pipeline steps, one module each, all of one shape (cibuildwheel's `platforms/` habit).

`VERBS` is the CLI's table: each verb's name, module, one-line help and kind, in the order `--help` lists
them. The CLI imports a verb's module only through it; a module does not repeat its own name or help.

A *per-tag step* (resolve, lock, build, smoke, publish, repro: `Verb.default_all` is set) is a module with:
    Options               a frozen dataclass whose fields declare the verb's flags (builder/flags.py); the CLI
                          makes its arguments from them and builds it from what was parsed (argparse stops there)
    prepare(entries, o)   checks before any tag runs (flags sane, engine up); raises a BuilderError; may
                          return options completed with what it read (dataclasses.replace), else None
    run(entry, o) -> Done one entry; raises a BuilderError when the step fails for that entry
`builder.runner` runs a step over entries with one failure policy and one summary table.

A *tool* (the others) works on the matrix or on images as a whole:
    Options, main(options, matrix) -> int
    An Options that extends `model.matrix.Selection` declares the TAG.../--all arguments of the per-tag steps;
    `options.entries(matrix)` are the entries they name.

No step imports the CLI, nor another step except through an edge listed with its reason in
tests/unit/test_layering.py; shared pieces live in builder/model and builder/boundary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verb:
    name: str
    module: str  # under builder.steps
    help: str
    # A per-tag step: does no TAG mean every entry (True) or an error (False: building every entry by accident
    # costs hours)? None: a tool.
    default_all: bool | None = None
    # A tool: does it read matrix.yaml (True), never (False), or where one is there ("optional": a tag names
    # its local image; image references work without one)? A step always does.
    matrix: bool | str = True

    @property
    def per_tag(self) -> bool:
        return self.default_all is not None


def _step(name: str, help: str, default_all: bool) -> Verb:
    return Verb(name, name, help, default_all=default_all)


VERBS = (
    # Tools that read only the matrix: first, before the pipeline.
    Verb("validate", "validate", "check the matrix schema and compatibility rules"),
    Verb("list", "listing", "table of the matrix entries"),
    Verb("matrix", "cimatrix", "the GitHub Actions strategy.matrix JSON"),
    Verb("compat", "compatreport", "explain the compatibility rules for entries: outcome, evidence, derived facts"),
    _step("resolve", "prove each entry's packages resolve (uv pip compile against its index)", default_all=True),
    _step("lock", "hash-locked requirements (and apt pins) into locks/<tag>/", default_all=True),
    _step("build", "build images with BuildKit, verify them, write build reports", default_all=False),
    _step("smoke", "run the smoke gate in a built image; write the smoke report", default_all=False),
    _step("publish", "push images that passed the gate; move the alias last", default_all=False),
    _step("repro", "rebuild from scratch beside the image and compare the two by content", default_all=False),
    Verb("render", "render", "render dockerfiles/<tag>/ (and the README table)"),
    Verb("catalog", "catalog", "write IMAGES.md and images.json from the reports"),
    Verb("verify", "verify", "re-verify a pulled image on this host (host checks + gate)", matrix=False),
    Verb("manifest", "manifest", "content manifest of an image (files, Python and OS packages)", matrix=False),
    Verb("diff", "diff", "what changed between two images (tags or image refs)", matrix="optional"),
    Verb("diagnose-nccl", "nccldiag", "what an NCCL_DEBUG=INFO log says: the network between nodes (RDMA, a TCP "
         "fallback and why, sockets only, one node) and each failure explained with its source", matrix=False),
    Verb("audit", "audit", "known vulnerabilities of an image's packages, against waivers.yaml", matrix="optional"),
    Verb("refresh-compat", "refresh", "diff compat.yaml against PyPI metadata and flash-attn release files "
         "(--write applies)", matrix=False),
    Verb("propose", "propose", "propose a matrix entry for the newest torch and stack releases on PyPI (appends "
         "it to matrix.yaml)"),
    Verb("plan", "plan", "which tags the workflow's image jobs build for this event (GitHub outputs)"),
    Verb("login", "login", "store registry credentials (password from stdin) in the Docker config, before any "
         "registry read", matrix=False),
    Verb("sign", "sign", "sign a published image's digest and its attestations with cosign (keyless in CI, or "
         "--key)", matrix=False),
)


@dataclass(frozen=True)
class Done:
    """What one entry's run of a step came to: a short result word and a detail for the summary."""

    result: str
    detail: str = ""

