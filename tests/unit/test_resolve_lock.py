"""Real resolution against PyPI, and the hash locks derived from it."""

from __future__ import annotations

from builder.model import matrix
from builder.steps import lock
from tests.conftest import ROOT, VALID_MATRIX, run_cli


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
        assert lock.check(e, ROOT / "dockerfiles" / e.tag) == []


def test_lock_check_names_the_broken_pin(project, capsys):
    src = ROOT / "dockerfiles" / "cu130-torch2.13-bookworm"
    dst = project / "dockerfiles" / "cu130-torch2.13-bookworm"
    dst.mkdir(parents=True)
    for name in (lock.LOCK, lock.TORCH_LOCK):
        (dst / name).write_text((src / name).read_text())
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace("peft: 0.21.2", "peft: 0.21.1"))
    assert run_cli("lock", "--check", "cu130-torch2.13-bookworm") == 1  # a stale lock is a failed check
    err = capsys.readouterr().err
    assert "pin peft==0.21.1 breaks the lock, which has peft==0.21.2" in err
    # a hash stripped from the lock is caught too
    (project / "matrix.yaml").write_text(VALID_MATRIX)
    text = (dst / lock.LOCK).read_text()
    lines = text.splitlines(keepends=True)
    first = lines.index("peft==0.21.2 \\\n")
    last = first + 1
    while lines[last].startswith("    --hash="):
        last += 1
    (dst / lock.LOCK).write_text("".join(lines[:first] + ["peft==0.21.2\n"] + lines[last:]))
    assert run_cli("lock", "--check", "cu130-torch2.13-bookworm") == 1  # a stale lock is a failed check
    assert "peft has no hash" in capsys.readouterr().err


