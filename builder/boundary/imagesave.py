"""`docker save IMAGE` as a stream the caller parses while it runs (the manifest reads each layer once)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from builder.boundary import buildkit, engine, process
from builder.errors import EnvironmentProblem

CHUNK = 1 << 20


@contextmanager
def stream(image: str, name: str | None = None) -> Iterator[BinaryIO]:
    """The tar stream of `docker save image`. A save that failed (a full disk, the engine gone) is exit 3 in the
    engine's own words, and wins over whatever the caller made of the cut-off stream: an empty or truncated
    archive is what a failed save looks like, never "not a docker save archive". `name`: the image as the user
    called it, for messages."""
    c = engine.client()
    pipe = process.pipe([c.binary, "save", image], env=c.env(), bufsize=CHUNK)
    try:
        yield pipe.stdout
    except Exception:
        while pipe.stdout.read(CHUNK):  # to its end, so a save that did not fail is not killed by a closed pipe
            pass
        pipe.stdout.close()
        _check(pipe, name or image)
        raise
    except BaseException:  # Ctrl-C: no export outlives the builder
        pipe.stop()
        raise
    finally:
        pipe.stdout.close()
    _check(pipe, name or image)


def _check(pipe: process.Pipe, name: str) -> None:
    """Raise EnvironmentProblem (exit 3) when `docker save` exited non-zero, naming why in one line."""
    code, err = pipe.finish()
    if code == 0:
        return
    message, hint, environmental = buildkit.explain_failure(err)
    if environmental:
        raise EnvironmentProblem(f"`docker save {name}` failed: {message}", hint)
    last = ([line.strip() for line in err.splitlines() if line.strip()] or ["no output"])[-1]
    raise EnvironmentProblem(f"`docker save {name}` failed: {last[-300:]}",
                             "check the engine (`docker info`) and that the image is still there, then re-run")
