"""Real resolution against PyPI, and the hash locks derived from it."""

from __future__ import annotations

from builder.model import lockfile, matrix
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
        assert lockfile.problems(e, ROOT / "locks" / e.tag) == []




def test_a_relock_prefers_the_versions_locked_now_unless_upgrade(tmp_path, monkeypatch):
    seen = []

    def fake_compile(entry, hashes, lines=None, prefer=None):
        seen.append(prefer)
        return SAMPLE + "deepspeed==0.19.8 \\\n    --hash=sha256:ff\n    # via -r -\n"

    monkeypatch.setattr(lock, "compile_requirements", fake_compile)
    monkeypatch.setattr(lock.compat, "nvcc_source", lambda e: None)
    (tmp_path / lock.TORCH_LOCK).write_text("torch==2.13.0 \\\n    --hash=sha256:bb\nfilelock==3.0 \\\n")
    entry = real_entry("cu130-torch2.13-bookworm")
    lock.lock(entry, tmp_path)
    assert seen[-1] == ["filelock==3.0", "torch==2.13.0"]
    lock.lock(entry, tmp_path, upgrade=True)
    assert seen[-1] is None


def test_apt_lock_keeps_its_snapshot_date_while_no_version_moves(tmp_path, monkeypatch):
    """A new snapshot date alone would change apt.lock and rebuild every layer although nothing moved."""
    from builder.boundary import engine

    versions = {"python3.11": "3.11.2-6+deb12u6"}
    monkeypatch.setattr(engine, "run_container", lambda *a, **k: (0, "".join(
        f"Inst {name} ({version} Debian:12.12/oldstable [amd64])\n" for name, version in versions.items())))
    monkeypatch.setattr(lock.compat, "nvcc_source", lambda e: None)
    entry = real_entry("cu130-torch2.13-bookworm")
    lock.lock_apt(entry, tmp_path, "debian:bookworm-slim")
    first = (tmp_path / lock.APT_LOCK).read_text()
    monkeypatch.setattr(lock.time, "gmtime", lambda when=None: lock.time.struct_time((2031, 1, 1, 0, 0, 0, 0, 1, 0)))
    lock.lock_apt(entry, tmp_path, "debian:bookworm-slim")
    assert (tmp_path / lock.APT_LOCK).read_text() == first, "same versions: the file (and its date) stays"
    versions["python3.11"] = "3.11.2-6+deb12u7"
    lock.lock_apt(entry, tmp_path, "debian:bookworm-slim")
    moved = (tmp_path / lock.APT_LOCK).read_text()
    assert "python3.11=3.11.2-6+deb12u7" in moved and "20310101T000000Z" in moved
