"""README.md's generated table of tags (builder/model/tagtable.py), written and checked for staleness like
the Dockerfiles: render writes it with dockerfiles/, catalog rewrites it when the proven column changes."""

from __future__ import annotations

from pathlib import Path

from builder import fsutil
from builder.errors import EnvironmentProblem
from builder.model import tagtable
from builder.model.matrix import Matrix

README = Path("README.md")


def write(m: Matrix, path: Path = README) -> list[Path]:
    if not path.exists():
        return []
    text = path.read_text()
    new = tagtable.updated(text, m)
    if new is None or new == text:
        return []
    try:
        fsutil.write_atomic(path, new)
    except OSError as exc:
        raise EnvironmentProblem(f"{path}: cannot write ({exc.strerror or exc}); dockerfiles/ is rendered, the "
                                 "README table is not",
                                 "free disk space or fix the permissions, then render again") from None
    return [path]


def check(m: Matrix, path: Path = README) -> list[str]:
    if not path.exists():
        return [f"{path}: missing"]
    text = path.read_text()
    new = tagtable.updated(text, m)
    if new is None:
        return [f"{path}: the generated tag table markers are missing"]
    return [] if new == text else [f"{path}: the table of tags is stale — run `python -m builder render`"]
