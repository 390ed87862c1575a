"""Bytecode for what one install step added, run by the Dockerfile as `python -S compile-new.py SITE BEFORE`.

BEFORE lists site-packages' entries before the step. Every dist-info that is new since then (a new package or a
new version of an old one) has its RECORD read, and each .py file it lists is compiled: hash-checked (no mtime
inside, so two builds write the same bytes), forced (a timestamped .pyc that an import wrote during the step is
replaced), in parallel. Not `uv --compile-bytecode`: it recompiles all of site-packages and so copies torch's
files into every layer above torch's. Not "the new top-level directories": an upgraded package (setuptools over
the venv's own) keeps its directory and would keep a stale .pyc. Like pip, a file that does not compile (a
Python 2 example, a template) stays source-only. -S: no .pth is processed, so nothing is imported from
site-packages while it is being compiled.

`python -S compile-new.py SITE BEFORE CACHE` also keeps each .pyc in CACHE (a BuildKit cache mount), under the
SHA-256 of what it is made from: the interpreter's magic number, the file's path (which the .pyc records) and its
source bytes. A later step with the same source at the same path copies those bytes instead of compiling: a pin
change reinstalls every pin, and compiling transformers' ~3,200 files again took 5 of its 18 s (2 cores, measured
2026-12-06). A hit writes what the compile wrote (same bytes, same mode); an entry whose header does not name this
interpreter and this source's hash is ignored and compiled over.

`python -S compile-new.py --warm SITE FINAL CACHE` fills CACHE for files installed under a prefix (SITE, laid out
as the venv) that a later step copies to FINAL: each is compiled as if at its FINAL path (the path the .pyc
records), so that step takes every .pyc from the cache. The pins stage runs it on the small OS layer beside
torch's download, off the cold build's critical path, where the python stage's last step compiled ~3,200 files
(4 s on 2 cores, measured 2026-12-07).
"""

import compileall
import csv
import hashlib
import importlib.util
import os
import py_compile
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial


def recorded(site: str, before: set) -> list:
    """The .py files (as RECORD names them, relative to `site`) of every dist-info not in `before`."""
    out = []
    for entry in sorted(os.listdir(site)):
        record = os.path.join(site, entry, "RECORD")
        if entry.endswith(".dist-info") and entry not in before and os.path.isfile(record):
            with open(record, newline="", encoding="utf-8") as f:
                out += [row[0] for row in csv.reader(f)
                        if row and row[0].endswith(".py") and not row[0].startswith("..")]
    return sorted(set(out))


def files(site: str, before: set) -> list:
    return [os.path.join(site, name) for name in recorded(site, before)]


def _kept(cache: str, path: str, source: bytes) -> str:
    """The cache entry for `source` compiled at `path` (which the .pyc records)."""
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + path.encode() + b"\0" + source).hexdigest()
    return os.path.join(cache, key[:2], key + ".pyc")


def _valid(data: bytes, source: bytes) -> bool:
    # A checked-hash .pyc: magic, flags 0b11, then the source's hash (PEP 552).
    return (data[:4] == importlib.util.MAGIC_NUMBER and data[4:8] == b"\3\0\0\0"
            and data[8:16] == importlib.util.source_hash(source))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _keep(kept: str, write) -> bool:
    """Store an entry whole (builds that share the cache may write the same key at once); a failure to keep one
    fails nothing: the cache only saves time."""
    part = f"{kept}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        write(part)
        os.replace(part, kept)
        return True
    except OSError:
        return False


def warm_one(pair: tuple, cache: str) -> str:
    """"kept" (compiled into the cache), "cached" (there already), or "" (it does not compile, or was not kept)."""
    installed, final = pair
    source = _read(installed)
    kept = _kept(cache, final, source)
    if _valid(_read(kept), source):
        return "cached"

    def compile_to(part: str) -> None:
        py_compile.compile(installed, cfile=part, dfile=final, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    try:
        return "kept" if _keep(kept, compile_to) else ""
    except py_compile.PyCompileError:  # like pip and compileall: a file that does not compile stays source-only
        return ""


def compile_one(path: str, cache=None) -> str:
    """"compiled", "cached" (the bytes came from `cache`), or "" where the file does not compile."""
    if not cache:
        return "compiled" if _compile(path) else ""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError:  # a RECORDed file that is not there: compileall's answer, as without a cache
        return "compiled" if _compile(path) else ""
    kept = _kept(cache, path, source)
    pyc = importlib.util.cache_from_source(path)
    data = _read(kept)
    if _valid(data, source):
        _write_like_py_compile(path, pyc, data)
        return "cached"
    if not _compile(path):
        return ""

    def copy(part: str) -> None:
        with open(pyc, "rb") as src, open(part, "wb") as dst:
            dst.write(src.read())
    _keep(kept, copy)
    return "compiled"


def _compile(path: str) -> bool:
    return bool(compileall.compile_file(path, quiet=2, force=True,
                                        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH))


def _write_like_py_compile(source: str, pyc: str, data: bytes) -> None:
    """What py_compile does with the bytes: the __pycache__ directory, a file with the source's mode plus owner
    write, less the execute bits (importlib's _calc_mode and _write_atomic), written whole."""
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    mode = (os.stat(source).st_mode | 0o200) & 0o666
    part = f"{pyc}.{os.getpid()}"
    fd = os.open(part, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode)
    with open(fd, "wb") as f:
        f.write(data)
    os.replace(part, pyc)


def warm(site: str, final: str, cache: str) -> None:
    todo = [(os.path.join(site, name), os.path.join(final, name)) for name in recorded(site, set())]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = list(pool.map(partial(warm_one, cache=cache), todo, chunksize=64))
    print(f"bytecode: {len(todo) - done.count('')} of {len(todo)} files in the cache for {final}, "
          f"{done.count('cached')} of them there already")


def main() -> None:
    if sys.argv[1] == "--warm":
        warm(*sys.argv[2:5])
        return
    site, before_file = sys.argv[1], sys.argv[2]
    cache = sys.argv[3] if len(sys.argv) > 3 else None
    with open(before_file, encoding="utf-8") as f:
        before = set(f.read().split("\n"))
    todo = files(site, before)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = list(pool.map(partial(compile_one, cache=cache), todo, chunksize=64))
    cached = f", {done.count('cached')} of them from the cache" if cache else ""
    print(f"bytecode: {len(todo) - done.count('')} of {len(todo)} files compiled (hash-checked){cached}")


if __name__ == "__main__":
    main()
