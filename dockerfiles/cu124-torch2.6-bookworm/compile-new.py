"""Bytecode for what one install step added, run by the Dockerfile as `python -S compile-new.py SITE BEFORE`.

BEFORE lists site-packages' entries before the step. Every dist-info that is new since then (a new package or a
new version of an old one) has its RECORD read, and each .py file it lists is compiled: hash-checked (no mtime
inside, so two builds write the same bytes), forced (a timestamped .pyc that an import wrote during the step is
replaced), in parallel. Not `uv --compile-bytecode`: it recompiles all of site-packages and so copies torch's
files into every layer above torch's. Not "the new top-level directories": an upgraded package (setuptools over
the venv's own) keeps its directory and would keep a stale .pyc. Like pip, a file that does not compile (a
Python 2 example, a template) stays source-only. -S: no .pth is processed, so nothing is imported from
site-packages while it is being compiled.
"""

import compileall
import csv
import os
import py_compile
import sys
from concurrent.futures import ProcessPoolExecutor


def files(site: str, before: set) -> list:
    out = []
    for entry in sorted(os.listdir(site)):
        record = os.path.join(site, entry, "RECORD")
        if entry.endswith(".dist-info") and entry not in before and os.path.isfile(record):
            with open(record, newline="", encoding="utf-8") as f:
                out += [os.path.join(site, row[0]) for row in csv.reader(f)
                        if row and row[0].endswith(".py") and not row[0].startswith("..")]
    return sorted(set(out))


def compile_one(path: str) -> bool:
    return bool(compileall.compile_file(path, quiet=2, force=True,
                                        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH))


def main() -> None:
    site, before_file = sys.argv[1], sys.argv[2]
    with open(before_file, encoding="utf-8") as f:
        before = set(f.read().split("\n"))
    todo = files(site, before)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = list(pool.map(compile_one, todo, chunksize=64))
    print(f"bytecode: {sum(done)} of {len(todo)} files compiled (hash-checked)")


if __name__ == "__main__":
    main()
