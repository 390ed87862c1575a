"""HTTP for the builder's own questions: PyPI metadata, a wheel's sha256, does a host answer at all.

Every call has a time limit (connect, and each read) and every body a size bound, so a stalled or endless
answer ends as a one-line `Failed`, never a hang. `Failed` is an OSError: what could not be fetched is the
network's or the publisher's state, and callers treat it like any other unreachable file.
TLS trusts what pip and uv trust here: REQUESTS_CA_BUNDLE or SSL_CERT_FILE (an intercepting proxy's CA),
else the system's CA bundle (not only certifi's).
"""

from __future__ import annotations

import hashlib
import os
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import builder

if TYPE_CHECKING:
    import requests

TIMEOUT_S = 30
MAX_BYTES = 64 << 20  # JSON and metadata: PyPI's whole torch project is a few MB
MAX_DOWNLOAD = 4 << 30  # a file that is hashed, never kept: the biggest flash-attn wheel is under 1 GB
CHUNK = 1 << 20
USER_AGENT = f"train-image-builder/{builder.__version__}"


class Failed(OSError):
    """No answer, or one that is not a success: `status` is the HTTP status when there was one."""

    def __init__(self, url: str, reason: str, status: int | None = None):
        super().__init__(reason)
        self.url, self.reason, self.status = url, reason, status

    def __str__(self) -> str:
        return self.reason


class TooLarge(Failed):
    """The answer went past its size bound: the remote sends more than anything it should ever send."""


@dataclass(frozen=True)
class Answer:
    """A whole answer of any status, its body already read within the bound (empty for HEAD)."""

    status: int
    headers: Mapping[str, str]  # case-insensitive (requests' CaseInsensitiveDict)
    body: bytes
    url: str  # where it came from after redirects


def session() -> requests.Session:
    """A session for a client that talks to one service many times (connection reuse). requests drops the
    Authorization header whenever a redirect leaves the original host, so credentials set per request stay home."""
    import requests

    sess = requests.Session()
    sess.headers["User-Agent"] = USER_AGENT
    sess.verify = _trusted()
    return sess


def fetch(sess: requests.Session, method: str, url: str, *, headers: Mapping[str, str] | None = None,
          data: bytes | None = None, timeout: float = TIMEOUT_S, limit: int = MAX_BYTES) -> Answer:
    """Any answer (the caller reads the status) with its body bounded; Failed on no answer, TooLarge past `limit`."""
    with _answer(url, method, timeout, headers, ok_only=False, sess=sess, data=data) as resp:
        body = b"" if method == "HEAD" else b"".join(_body(resp, url, limit))
        return Answer(resp.status_code, resp.headers, body, resp.url)


def get(url: str, *, timeout: float = TIMEOUT_S, limit: int = MAX_BYTES,
        headers: Mapping[str, str] | None = None) -> bytes:
    """The body of a successful GET; Failed on no answer, a non-2xx status or a body over `limit` bytes."""
    with _answer(url, "GET", timeout, headers) as resp:
        return b"".join(_body(resp, url, limit))


def sha256(url: str, *, timeout: float = 60, limit: int = MAX_DOWNLOAD) -> str:
    """sha256 of the file at `url`, streamed (never held in memory); Failed when it cannot be fetched."""
    digest = hashlib.sha256()
    with _answer(url, "GET", timeout) as resp:
        for chunk in _body(resp, url, limit):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest, *, timeout: float = 60, limit: int = MAX_DOWNLOAD) -> str:
    """Stream the file at `url` into the open binary file `dest`; its sha256. Failed when it cannot be fetched."""
    digest = hashlib.sha256()
    with _answer(url, "GET", timeout) as resp:
        for chunk in _body(resp, url, limit):
            digest.update(chunk)
            dest.write(chunk)
    return digest.hexdigest()


def probe(url: str, timeout: float = 10) -> str | None:
    """None when the host answered anything (401 from a registry, 404, 405 to HEAD), else why not."""
    try:
        with _answer(url, "HEAD", timeout, ok_only=False):
            return None
    except Failed as exc:
        return exc.reason


@contextmanager
def _answer(url: str, method: str, timeout: float, headers: Mapping[str, str] | None = None,
            ok_only: bool = True, sess: requests.Session | None = None,
            data: bytes | None = None) -> Iterator[requests.Response]:
    import requests  # here, not at the top: a quarter second that most verbs never need

    try:
        resp = (sess or requests).request(method, url, headers={"User-Agent": USER_AGENT, **(headers or {})},
                                          data=data, stream=True, timeout=timeout, verify=_trusted(),
                                          allow_redirects=True)
    except requests.RequestException as exc:
        raise Failed(url, _reason(exc)) from None
    with resp:
        if ok_only and not resp.ok:
            raise Failed(url, f"HTTP {resp.status_code} {resp.reason or ''}".strip(), resp.status_code)
        yield resp


def _body(resp: requests.Response, url: str, limit: int) -> Iterator[bytes]:
    import requests

    total = 0
    try:
        for chunk in resp.iter_content(CHUNK):
            total += len(chunk)
            if total > limit:
                raise TooLarge(url, f"the answer is larger than {limit >> 20} MiB; refused")
            yield chunk
    except requests.RequestException as exc:
        raise Failed(url, _reason(exc)) from None


def _trusted() -> str | bool:
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(name):
            return os.environ[name]
    system = ssl.get_default_verify_paths().cafile
    return system if system and os.path.isfile(system) else True


def _reason(exc: requests.RequestException) -> str:
    """One line: requests nests the cause (`… Max retries exceeded … (Caused by NameResolutionError(…))`)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    inner = text.rsplit("(Caused by ", 1)[-1].removesuffix(")") if "(Caused by " in text else text
    kind = "timed out" if "Timeout" in type(exc).__name__ else type(exc).__name__
    return f"{kind}: {inner[:200]}"
