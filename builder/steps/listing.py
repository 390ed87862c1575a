"""`list`: the matrix entries as a table, with how far each tag is proven (read from images.json)."""

from __future__ import annotations

from builder import log
from builder.model import matrix, proof

Options = matrix.Selection  # tags and --all only
HEADERS = ("tag", "torch", "CUDA", "Python", "transformers", "deepspeed", "flash-attn", "proven")


def main(options: matrix.Selection, m: matrix.Matrix) -> int:
    known = proof.levels()
    rows = [[e.tag, e.torch, e.cuda, e.python, e.pins["transformers"], e.pins["deepspeed"],
             e.pins["flash-attn"] or "—", proof.phrase(e, known)] for e in options.entries(m)]
    log.out(log.table(HEADERS, rows))
    return 0
