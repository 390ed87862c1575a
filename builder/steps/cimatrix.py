"""`matrix`: the GitHub Actions strategy.matrix JSON for the selected entries.

`--changed-against REGISTRY` leaves out entries whose published alias there was built from exactly these
inputs (its input-hash label), so CI rebuilds only what changed; an alias that cannot be read is rebuilt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from builder.boundary import published
from builder.model import matrix, plan

NAME = "matrix"
HELP = "the GitHub Actions strategy.matrix JSON"
NEEDS_MATRIX = True


@dataclass(frozen=True)
class Options(matrix.Selection):
    format: str = "github"
    runner: str | None = None
    changed_against: str | None = None


def add_arguments(p) -> None:
    p.add_argument("--format", choices=["github"], default="github")
    p.add_argument("--runner", choices=["gpu", "hosted"], help="only entries gated on GPU runners, or on hosted ones")
    p.add_argument("--changed-against", metavar="REGISTRY",
                   help="leave out entries whose published alias there was built from exactly these inputs")


def main(options: Options, m: matrix.Matrix) -> int:
    entries = options.entries(m)
    if options.runner:
        entries = [e for e in entries if plan.needs_gpu_gate(e) == (options.runner == "gpu")]
    if options.changed_against:
        entries = [e for e in entries if not published.is_current(e, options.changed_against)]
    print(json.dumps(plan.github_matrix(entries), sort_keys=True))
    return 0
