"""Real resolution against PyPI, and the hash locks derived from it."""

from __future__ import annotations

from builder.model import matrix
from builder.steps import lock
from tests.conftest import ROOT


def real_entry(tag: str) -> matrix.Entry:
    return matrix.load(ROOT / "matrix.yaml").by_tag()[tag]






SAMPLE = """\
filelock==3.0 \\
    --hash=sha256:aa
    # via torch
torch==2.13.0 \\
    --hash=sha256:bb
    # via
    #   -r -
    #   peft
peft==0.21.2 \\
    --hash=sha256:cc
    # via -r -
sympy==1.14 \\
    --hash=sha256:dd
    # via torch
mpmath==1.3 \\
    --hash=sha256:ee
    # via sympy
"""


def test_torch_closure_is_its_transitive_dependencies():
    blocks = lock.parse_blocks(SAMPLE)
    assert set(lock.closure_of("torch", blocks)) == {"torch", "filelock", "sympy", "mpmath"}


def test_committed_locks_have_hashes_and_match_pins():
    for e in matrix.load(ROOT / "matrix.yaml").entries:
        assert lock.all_problems(e, ROOT / "dockerfiles" / e.tag) == []


