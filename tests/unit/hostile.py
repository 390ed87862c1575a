"""Shared checks of the hostile-input corpus (tests/unit/test_hostile_*.py).

Every refused case must: exit with the documented code, print one `error:` line naming the file or
flag and field, print no traceback and no secret, and leave every file of the project as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import run_cli

SECRET = "hunter2-S3cr3t"  # planted in hostile inputs; must never appear in any output
# Written by a render even when it refuses (the flock file beside dockerfiles/): not a project artifact.
IGNORED = {".dockerfiles.lock"}


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under root with its bytes (files), its target (links) or a marker (directories)."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if name in IGNORED or "__pycache__" in rel:
                continue
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            elif path.is_file():
                out[rel] = path.read_bytes()
            else:
                out[rel] = "special"
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return out


def assert_refused(project: Path, capsys, argv, code: int, *needles: str, secrets=(SECRET,)) -> str:
    """Run the CLI; check exit code, one clear first line, needles, no traceback, no secret, no writes."""
    before = snapshot(project)
    got = run_cli(*argv)
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    assert got == code, f"exit {got}, expected {code}: {err}"
    assert "Traceback" not in err + out
    error_lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert error_lines, f"no `error:` line in {err!r}"
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    for secret in secrets:
        if secret:
            assert secret not in err + out, f"secret echoed: {err!r}"
    assert snapshot(project) == before, "a refused command changed files"
    return err


