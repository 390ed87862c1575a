"""`propose`: the matrix entry for upstream's newest releases, appended to matrix.yaml once the rules accept it.

Read here (network, as `refresh-compat` reads it): PyPI's JSON API for torch and for each stack package the
newest CI entry pins, and the newest torch wheel's core metadata (PEP 658) for its CUDA build. The derivation
and the text edit are pure (builder.model.proposal). The proposal is judged by the rules `validate` applies
and by the recipe's limits (a proposal this recipe cannot lock or build is no pull request to open): when a
rule rejects it, nothing is written and the rule is named, exit 0. Exit 0 also when nothing is new.
The scheduled workflow run calls it, then locks and renders the tag it writes to $GITHUB_OUTPUT (`tag=`) and
opens a pull request, whose jobs build and gate it (docs/ci.md).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from builder import fsutil, log
from builder.boundary import pypi
from builder.errors import BuilderError, UserError
from builder.flags import arg, switch
from builder.model import compat, knowledge, matrix, proposal


@dataclass(frozen=True)
class Options:
    dry_run: bool = switch("--dry-run", help="print the proposal; write nothing")
    github_output: str | None = arg(
        "--github-output", default=None, default_from=lambda: os.environ.get("GITHUB_OUTPUT"), metavar="PATH",
        help="append `tag=<proposed tag>` (empty when nothing was proposed) here (default: $GITHUB_OUTPUT)")


def torch_facts() -> dict:
    project = pypi.project("torch")
    version = proposal.newest(project.get("releases") or {})
    wheels = knowledge.linux_wheels(project["releases"][version]) if version else []
    metadata = None
    if wheels:  # PEP 658 metadata; where it is missing, the project JSON's `info` has the newest release's
        try:
            metadata = pypi.wheel_metadata("torch", wheels[0])
        except OSError:
            pass
    return proposal.torch_release(project, metadata)


def stack_versions(template: matrix.Entry) -> dict[str, str]:
    out = {}
    for name in proposal.STACK:
        if template.pins.get(name):
            newest = proposal.newest(pypi.project(name).get("releases") or {})
            out[name] = newest or template.pins[name]  # no final release listed: keep what the matrix pins
    return out


def judged(text: str, where: Path, tag: str) -> tuple[matrix.Entry, list[compat.Violation]]:
    """The proposed entry as matrix.load reads the new text (schema and flags of the whole file), and every
    rule it breaks: compatibility first, then what stops this recipe from locking and building it."""
    with tempfile.TemporaryDirectory(prefix="propose-") as tmp:
        path = Path(tmp) / where.name
        path.write_text(text, encoding="utf-8")
        try:
            entry = matrix.load(path).by_tag()[tag]
        except BuilderError as exc:
            raise UserError(f"{where}: the proposed entry does not load: {exc.message}",
                            "a bug in propose or an unusual matrix.yaml layout; add the entry by hand") from exc
    return entry, compat.check(entry) or compat.recipe_limits(entry)


def _say_tag(options: Options, tag: str) -> None:
    if options.github_output:
        with open(options.github_output, "a", encoding="utf-8") as out:
            out.write(f"tag={tag}\n")


def _facts(torch: dict) -> str:
    abi = {True: "C++11 ABI", False: "pre-C++11 ABI"}.get(torch.get("cxx11abi"), "ABI unknown")
    return (f"torch {torch['release']}: CUDA {torch.get('pypi_cuda', '?')} build on PyPI, cuDNN "
            f"{torch.get('cudnn', '?')}, Python {torch.get('python', '?')}, {abi}")


def main(options: Options, m: matrix.Matrix) -> int:
    try:
        template = proposal.template(m)
    except ValueError as exc:
        raise UserError(str(exc), "mark the entry CI builds with `ci: true`") from None
    with log.step("newest releases on PyPI") as note:
        torch = torch_facts()
        stack = stack_versions(template)
        note["result"] = ", ".join(f"{k} {v}" for k, v in {"torch": torch["release"], **stack}.items())
    try:
        candidate = proposal.derive(template, torch, stack)
    except proposal.NotProposable as exc:
        log.info(f"nothing proposed: {exc}")
        _say_tag(options, "")
        return 0
    why_not = proposal.already(m, candidate)
    if why_not:
        log.info(f"nothing new: {why_not}")
        _say_tag(options, "")
        return 0
    note = [f"Proposed by `python -m builder propose` ({date.today().isoformat()}): PyPI's newest releases,",
            f"shaped like {template.tag}; its pull request's CI jobs build and gate it."]
    block = candidate.text(note)
    try:
        text = proposal.append(m.path.read_text(encoding="utf-8"), block, candidate.tag)
    except ValueError as exc:
        raise UserError(f"{m.path}: cannot append an entry ({exc})", "add the entry by hand") from None
    entry, broken = judged(text, m.path, candidate.tag)
    if broken:
        log.info(f"nothing proposed: {entry.tag} ({_facts(torch)}) is rejected by the project's rules:")
        for v in broken:
            log.info(f"  [{v.rule}] {v.reason} (source: {v.source})")
        _say_tag(options, "")
        return 0
    log.out(block, end="")  # text from PyPI's answers: cleaned like every line we print
    if options.dry_run:
        log.info(f"dry run: {entry.tag} not written to {m.path}")
        _say_tag(options, "")
        return 0
    fsutil.write_atomic(m.path, text)
    log.info(f"appended {entry.tag} to {m.path}; next: python -m builder lock {entry.tag}, then render")
    _say_tag(options, entry.tag)
    return 0
