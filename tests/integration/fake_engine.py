"""A fake Docker engine: a small HTTP server on a unix socket that answers the Engine API the way a broken or
hostile engine would. DOCKER_HOST=unix://<socket> points the builder (the Docker SDK) at it; no real engine,
no image, nothing outside the test's directory is touched.

`answers` maps a route (the path without its /v1.NN prefix and query, e.g. "/version", "/images/*/json": a
glob, tried after the exact routes) to what to send: a dict or list (sent as JSON), bytes (sent as they are), an (status, body) pair, or a callable
taking the request handler (for endless bodies and the like). A route not in `answers` gets a 404 JSON answer,
which the SDK reads as "no such image/container".
"""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import re
import socketserver
import tarfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

API = "1.41"
VERSION = {"Version": "20.10.24", "ApiVersion": API, "MinAPIVersion": "1.12", "Os": "linux", "Arch": "amd64"}
INFO = {"ServerVersion": "20.10.24", "OperatingSystem": "Fake Linux", "Runtimes": {"runc": {}}}
IMAGE_ID = "sha256:" + "ab" * 32
_PREFIX = re.compile(r"^/v[0-9]+\.[0-9]+")


def image(labels: dict, image_id: str = IMAGE_ID, tags=("ghcr.io/train-images/train:x",)) -> dict:
    """An image inspect answer (GET /images/NAME/json) carrying `labels`."""
    return {"Id": image_id, "RepoTags": list(tags), "RepoDigests": [], "Size": 1000,
            "Config": {"Labels": labels}}


def endless(h: BaseHTTPRequestHandler) -> None:
    """An answer that never ends (no length, bytes until the client hangs up)."""
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    h.close_connection = True
    try:
        while True:
            h.wfile.write(b"[" * 65536)
    except OSError:  # the client stopped reading: what it should do
        pass


def archive(files: dict[str, bytes]) -> bytes:
    """A tar as GET /containers/ID/archive sends it (the copied path's base name at the top)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def with_facts(facts: dict, locks: dict[str, bytes] | None = None, **more) -> dict:
    """Answers for an engine whose one image carries `facts` as /opt/train-image/image.json (and `locks`):
    create a container, copy the files out (every copy gets them all, the facts first), remove the container."""
    return {"/containers/create": (201, {"Id": "c0ffee", "Warnings": []}),
            "/containers/c0ffee/json": {"Id": "c0ffee", "Name": "/fake", "State": {}, "Config": {}},
            "/containers/c0ffee/archive": archive({"image.json": json.dumps(facts).encode(), **(locks or {})}),
            "/containers/c0ffee": (204, b""), **more}


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeEngine:
    def __init__(self, directory: Path, answers: dict):
        self.path = directory / "engine.sock"
        self.answers = {"/_ping": b"OK", "/version": VERSION, "/info": INFO, **answers}
        self.seen: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                route = _PREFIX.sub("", self.path.split("?", 1)[0])
                engine.seen.append(f"{self.command} {route}")
                engine.answer(self, engine.find(route))

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *_args):
                pass

        self.server = _Server(str(self.path), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def find(self, route: str):
        if route in self.answers:
            return self.answers[route]
        globs = (what for pattern, what in self.answers.items() if "*" in pattern and fnmatch.fnmatch(route, pattern))
        return next(globs, (404, {"message": f"no such thing: {route}"}))

    @property
    def host(self) -> str:
        return f"unix://{self.path}"

    @staticmethod
    def answer(h: BaseHTTPRequestHandler, what) -> None:
        if callable(what):
            what(h)
            return
        status, body = what if isinstance(what, tuple) else (200, what)
        kind = "application/x-tar" if isinstance(body, bytes) and body[257:262] == b"ustar" else "application/json"
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", kind)
        h.send_header("Api-Version", API)
        if kind == "application/x-tar":  # the SDK decodes it with every copy out of a container
            h.send_header("X-Docker-Container-Path-Stat", base64.b64encode(b'{"name": "x", "size": 0}').decode())
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)  # the next engine may listen at the same path
