"""What each entry needs from CI: the GitHub Actions matrix and the gate level an entry must reach.

The workflow maps `gpu` to runner labels from its own allowlist: matrix.yaml (which a pull request can
change) never chooses the machine a job runs on.
"""

from __future__ import annotations

import os

from builder.errors import UserError
from builder.model.matrix import Entry


def needs_gpu_gate(entry: Entry) -> bool:
    """An entry built on GPU runners must pass the gate on a GPU before it is published."""
    return "gpu" in entry.runner


def github_matrix(entries: list[Entry]) -> dict:
    return {"include": [{
        "tag": e.tag,
        "gpu": needs_gpu_gate(e),
        "torch": e.torch,
        "cuda": e.cuda,
        "python": e.python,
    } for e in entries]}


def default_registry(environ=os.environ) -> str:
    """Where the workflow publishes: $REGISTRY (its variable), else ghcr.io/<repository owner, lower case>."""
    where = environ.get("REGISTRY") or ""
    if where:
        return where
    owner = environ.get("GITHUB_REPOSITORY_OWNER", "")
    if not owner:
        raise UserError("no registry: pass --registry, or set REGISTRY (the workflow's variable)")
    return f"ghcr.io/{owner.lower()}"
