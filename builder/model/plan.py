"""The GitHub Actions matrix: one include row per tag, with the runner labels its jobs need."""

from __future__ import annotations

from builder.model.matrix import Entry


def github_matrix(entries: list[Entry]) -> dict:
    return {"include": [{
        "tag": e.tag,
        "runner": list(e.runner),
        # ci entries build and gate on a hosted runner (CPU gate); the rest need a GPU runner.
        "gpu": not e.ci,
        "torch": e.torch,
        "cuda": e.cuda,
        "python": e.python,
    } for e in entries]}
