"""`matrix`: the GitHub Actions strategy.matrix JSON for the selected entries.

`--changed-against REGISTRY` leaves out entries whose published alias there was built from exactly these
inputs (its input-hash label), so CI rebuilds only what changed; an alias that cannot be read is rebuilt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from builder.boundary import published
from builder.flags import arg
from builder.model import matrix, plan


@dataclass(frozen=True)
class Options(matrix.Selection):
    format: str = arg("--format", default="github", choices=["github"])
    runner: str | None = arg("--runner", default=None, choices=["gpu", "hosted"],
                             help="only entries gated on GPU runners, or on hosted ones")
    changed_against: str | None = arg(
        "--changed-against", default=None, metavar="REGISTRY",
        help="leave out entries whose published alias there was built from exactly these inputs")


def main(options: Options, m: matrix.Matrix) -> int:
    entries = options.entries(m)
    if options.runner:
        entries = [e for e in entries if plan.needs_gpu_gate(e) == (options.runner == "gpu")]
    if options.changed_against:
        entries = [e for e in entries if not published.is_current(e, options.changed_against)]
    print(json.dumps(plan.github_matrix(entries), sort_keys=True))
    return 0
