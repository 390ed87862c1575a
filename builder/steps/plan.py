"""The workflow's plan (`python -m builder plan`): which tags the image jobs build for this event.

One command per workflow step (docs/ci.md): the `plan` job runs it without tags and writes `hosted=` and `gpu=`
(GitHub strategy.matrix JSON) to $GITHUB_OUTPUT; an image job runs it with its own tag after a scheduled
re-lock and writes `build=true|false`, so only what moved is rebuilt, gated and published.

- pull_request, or tags named: every selected entry (a pull request publishes nothing; names are explicit).
- push, schedule, workflow_dispatch without tags: only entries whose published alias was not built from
  exactly these inputs (its input-hash label); an alias that cannot be read counts as changed.
- Entries gated on a GPU runner go to `gpu=` only where the repository says it has one (the variable
  GPU_RUNNERS=true): a fork without self-hosted GPU runners would otherwise leave those jobs queued for a day.
  Each one left out is named with how to enable it; it is neither built nor published there.
The registry is read with the Docker config's credentials: the workflow runs `builder login` first.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass

from builder import fsutil, log
from builder.boundary import published, registry
from builder.errors import BuilderError
from builder.flags import arg, switch
from builder.model import matrix, plan

EVENTS = ("pull_request", "push", "schedule", "workflow_dispatch")


@dataclass(frozen=True)
class Options:
    tags: tuple = arg(nargs="*", default=(), metavar="TAG", help="tags or globs (none: every entry, changed ones only)")
    event: str = arg("--event", default="push", default_from=lambda: os.environ.get("GITHUB_EVENT_NAME") or "push",
                     choices=EVENTS, help="the GitHub event (default: $GITHUB_EVENT_NAME)")
    registry: str | None = arg("--registry", default=None, metavar="HOST[/NAMESPACE]",
                               help="where aliases are published (default: $REGISTRY, else ghcr.io/<repository owner>)")
    github_output: str | None = arg(
        "--github-output", default=None, default_from=lambda: os.environ.get("GITHUB_OUTPUT"), metavar="PATH",
        help="append the outputs here (default: $GITHUB_OUTPUT; without it they are printed)")
    gpu_runners: bool = switch(
        "--gpu-runners", default_from=lambda: os.environ.get("GPU_RUNNERS", "").strip().lower() == "true",
        negation=("--no-gpu-runners", "leave the GPU-gated entries out whatever GPU_RUNNERS says"),
        help="this repository has self-hosted GPU runners: plan the GPU-gated entries "
             "(default: the repository variable GPU_RUNNERS is `true`)")


def planned(m: matrix.Matrix, options: Options) -> list[matrix.Entry]:
    """The schedule's plan job names every entry (each image job re-locks it, then asks again with its tag:
    only what the re-lock moved is rebuilt). Comparing before the re-lock would find nothing, ever."""
    entries = matrix.select(m, options.tags or None)
    if options.event == "pull_request" or (options.event == "schedule") != bool(options.tags):
        return entries
    where = options.registry or plan.default_registry()
    return [e for e in entries if not published.is_current(e, where)]


def previous(entry: matrix.Entry, where: str) -> str:
    """The published alias as an immutable reference (what `builder diff` compares the new image with), or ''."""
    repo = registry.repository(where, entry.image)
    try:
        digest = registry.manifest_digest(repo, entry.tag)
    except BuilderError as exc:
        log.info(f"{entry.tag}: cannot read {repo.ref}:{entry.tag} ({exc.message}): no previous image to compare")
        return ""
    return f"{repo.ref}@{digest}" if digest else ""


def outputs(m: matrix.Matrix, entries: list[matrix.Entry], options: Options) -> dict[str, str]:
    """One tag (an image job asking about itself): build=true|false and previous=; else the two matrices."""
    if len(options.tags) == 1 and "*" not in options.tags[0]:
        before = "" if options.event == "pull_request" else previous(matrix.select(m, options.tags)[0],
                                                                        options.registry or plan.default_registry())
        return {"build": "true" if entries else "false", "previous": before}
    hosted = [e for e in entries if not plan.needs_gpu_gate(e)]
    gpu = [e for e in entries if plan.needs_gpu_gate(e)]
    if gpu and not options.gpu_runners:
        for e in gpu:
            log.info(f"{e.tag}: gated on a GPU runner ({', '.join(e.runner)}), and this repository has none (the "
                     "variable GPU_RUNNERS is not `true`): not built or published here; register such a runner "
                     "and set GPU_RUNNERS=true (docs/publishing.md)")
        gpu = []
    return {"hosted": json.dumps(plan.github_matrix(hosted), sort_keys=True),
            "gpu": json.dumps(plan.github_matrix(gpu), sort_keys=True)}


def append(path: str, text: str) -> None:
    """Append in one write(2) on an O_APPEND file: plans run at once (one per image job) add whole lines
    to a shared output, never interleaved, and no temp file is involved."""
    data = text.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise fsutil.write_failed(path, exc) from None
    if written != len(data):
        raise fsutil.write_failed(path, OSError(errno.EIO, "short write"))


def main(options: Options, m: matrix.Matrix) -> int:
    entries = planned(m, options)
    found = outputs(m, entries, options)
    lines = "".join(f"{key}={value}\n" for key, value in found.items())
    if options.github_output:
        append(options.github_output, lines)
    print(lines, end="")
    log.info(f"plan ({options.event}): {', '.join(e.tag for e in entries) or 'nothing to build'}")
    return 0
