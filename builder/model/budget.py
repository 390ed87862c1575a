"""Size budgets: how large an entry's image may be before its build fails (AWS's deep learning containers fail a
release above 1.2 × the baseline). The budget is the entry's `size_budget` in the matrix, or else 1.2 × the size
of its last published release; an entry with neither has none. Pure: the build step compares, and names the
packages that grew with `builder diff` (builder/steps/diff.py).
"""

from __future__ import annotations

import re

GROWTH = 1.2  # over the previous release, when the matrix sets no budget
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMG]i?B|B)", re.IGNORECASE)


def parse(value, fail) -> int:
    """A matrix size: bytes as an integer, or a number with a unit (6.5 GB, 6000 MiB). fail(message, hint)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        fail(f"expected a size, got {type(value).__name__}", "write bytes or a size with a unit, e.g. 6.5 GB")
    if isinstance(value, int):
        size = value
    else:
        found = SIZE_RE.fullmatch(value.strip())
        if not found:
            fail(f"{value[:40]!r} is not a size", "write bytes or a number with B, KB, MB, GB, KiB, MiB or GiB, "
                                                  "e.g. 6.5 GB")
        size = int(float(found.group(1)) * UNITS[found.group(2).upper()])
    if size <= 0:
        fail(f"{value!r} is not a positive size", "e.g. 6.5 GB")
    return size


def limit(matrix_budget: int | None, where: str, published: dict | None) -> tuple[int, str] | None:
    """(bytes, where the number comes from), or None when the entry has no budget."""
    if matrix_budget:
        return matrix_budget, where
    if published and published.get("size_bytes"):
        return int(published["size_bytes"] * GROWTH), (f"{GROWTH} × the last release "
                                                        f"{published.get('full_tag') or published.get('image_id')}")
    return None


def gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def message(size: int, budget: tuple[int, str], grown: list[str] | None, baseline: str | None) -> str:
    """The one-line failure: how far over, whose budget, and what grew since the baseline image."""
    head = f"the image is {gb(size)}, above its size budget of {gb(budget[0])} ({budget[1]})"
    if grown is None:
        return f"{head}; no earlier image of this tag is here to compare with (`builder diff OLD NEW` names what grew)"
    return f"{head}; since {baseline[:19] if baseline else '?'}: " + ("; ".join(grown) or "no package changed")
