"""A real registry on 127.0.0.1: Debian's `docker-registry` (CNCF distribution 2.8), started per test.

Docker talks plain HTTP to loopback registries without configuration, so no TLS is needed. Every
instance listens on a free port; a stopped one can be started again on the same port with the same
storage, which is how the "registry died mid-publish" test checks what survived.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

BINARY = "/usr/bin/docker-registry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, root: Path, users: dict[str, str] | None = None):
        self.root = root
        self.port = free_port()
        self.users = users or {}
        self.proc: subprocess.Popen | None = None
        root.mkdir(parents=True, exist_ok=True)
        auth = ""
        if self.users:
            # bcrypt (-B): distribution's htpasswd backend accepts nothing else.
            lines = [subprocess.run(["htpasswd", "-Bbn", u, p], check=True, capture_output=True,
                                    text=True).stdout.strip() for u, p in self.users.items()]
            (root / "htpasswd").write_text("\n".join(lines) + "\n")
            auth = f"auth:\n  htpasswd:\n    realm: test-registry\n    path: {root / 'htpasswd'}\n"
        (root / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + auth)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        log = open(self.root / "registry.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen([BINARY, "serve", str(self.root / "config.yml")], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.root / 'registry.log').read_text()[-500:]}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                return self
            except urllib.error.HTTPError:
                return self  # 401 from an auth registry: it answers
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"docker-registry did not answer on {self.host}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def digest(self, name: str, reference: str, user: str | None = None) -> str | None:
        """What the registry serves for name:reference (None on 404), read without our own client code."""
        accept = ("application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json, "
                  "application/vnd.oci.image.index.v1+json")
        req = urllib.request.Request(f"http://{self.host}/v2/{name}/manifests/{reference}", method="HEAD",
                                     headers={"Accept": accept})
        if user:
            token = base64.b64encode(f"{user}:{self.users[user]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            return urllib.request.urlopen(req, timeout=5).headers["Docker-Content-Digest"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


def available() -> bool:
    return Path(BINARY).exists() and shutil.which("htpasswd") is not None
