"""`list`: the matrix entries as a table, with how far each tag is proven (read from images.json)."""

from __future__ import annotations

from dataclasses import dataclass

from builder import log
from builder.model import matrix, proof

NAME = "list"
HELP = "table of the matrix entries"
NEEDS_MATRIX = True
TAGS = True
HEADERS = ("tag", "torch", "CUDA", "Python", "transformers", "deepspeed", "flash-attn", "proven")


@dataclass(frozen=True)
class Options:
    tags: tuple = ()
    all: bool = False


def add_arguments(p) -> None:
    pass  # tags and --all only


def main(options: Options, m: matrix.Matrix) -> int:
    known = proof.levels()
    rows = [[e.tag, e.torch, e.cuda, e.python, e.pins["transformers"], e.pins["deepspeed"],
             e.pins["flash-attn"] or "—", proof.phrase(e, known)] for e in matrix.choose(m, options.tags, options.all)]
    print(log.table(HEADERS, rows))
    return 0
