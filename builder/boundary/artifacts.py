"""Published files (wheels, sdists) fetched once, checked against the sha256 the index states, and kept.

What compat knows about a package version is read from its own files (its API, the GPU code in its binaries);
`refresh-compat` asks for the same few hundred files again and again, so each is cached under its hash:
`$XDG_CACHE_HOME/train-images/artifacts/<sha256>/<filename>` (default ~/.cache). A file is used only after its
bytes matched the digest PyPI publishes; a partial download never takes the final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from builder.boundary import web
from builder.errors import EnvironmentProblem

_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILENAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "train-images" / "artifacts"


def cached(sha256: str, filename: str) -> Path | None:
    path = cache_root() / sha256 / filename
    return path if path.is_file() else None


def fetch(url: str, sha256: str, filename: str, *, timeout: float = 120) -> Path:
    """The file at `url`, whose sha256 must be `sha256`, from the cache or downloaded into it."""
    if not _SHA256.fullmatch(sha256) or not _FILENAME.fullmatch(filename):
        raise EnvironmentProblem(f"{url}: the index gave no usable sha256 or file name ({filename!r})",
                                 "refresh against an index that publishes sha256 digests (PyPI does)")
    hit = cached(sha256, filename)
    if hit is not None:
        return hit
    folder = cache_root() / sha256
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            got = web.download(url, out, timeout=timeout)
        if got != sha256:
            raise EnvironmentProblem(f"{url}: sha256 {got} is not the {sha256} the index states; not used",
                                     "a proxy or mirror altered the file: fetch it from the index itself")
        os.replace(tmp, folder / filename)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / filename


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
