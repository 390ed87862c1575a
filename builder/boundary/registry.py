"""Registry references and the one HTTP call publish needs: what digest does the registry hold for a tag?

The digest is read back over the Registry HTTP API v2 (`HEAD /v2/<name>/manifests/<ref>`), not taken from
the push output, so a publish is only reported when the registry itself serves the manifest.
Credentials come from the Docker config the docker CLI uses (`auths`, `credHelpers`, `credsStore`), never
from arguments: https://github.com/docker/cli/blob/master/docs/reference/commandline/login.md
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from builder.errors import StepFailed, UserError

# Docker image manifests first (what `docker push` writes), then OCI, then lists/indexes: without these
# Accept headers a v2 registry may answer with a converted schema-1 manifest and another digest.
ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
))
REGISTRY_RE = re.compile(r"^(?P<host>[a-z0-9.-]+|\[[0-9a-f:]+\])(?::(?P<port>[0-9]{1,5}))?(?P<ns>(?:/[a-z0-9._-]+)*)$")
DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
TIMEOUT_S = 30


class Transient(StepFailed):
    """The registry did not answer or answered 5xx/429: worth another try."""


@dataclass(frozen=True)
class Repository:
    host: str  # host[:port], what `docker login` and the config's `auths` key use
    name: str  # path inside the registry, e.g. team/train

    @property
    def ref(self) -> str:
        return f"{self.host}/{self.name}"

    @property
    def loopback(self) -> bool:
        bare = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else self.host.split("]")[0] + "]"
        return bare in ("localhost", "[::1]") or bare.startswith("127.")

    @property
    def base_url(self) -> str:
        # Docker itself talks plain HTTP to loopback registries without configuration; so do we.
        return f"{'http' if self.loopback else 'https'}://{self.host}"


def repository(registry: str, image: str) -> Repository:
    """`--registry HOST[:PORT][/NAMESPACE]` plus the last path part of the matrix image name."""
    m = REGISTRY_RE.match(registry.strip().rstrip("/"))
    if not m:
        raise UserError(f"--registry {registry!r} is not HOST[:PORT][/NAMESPACE]",
                        "e.g. ghcr.io/acme or 127.0.0.1:5000")
    host = m.group("host") + (f":{m.group('port')}" if m.group("port") else "")
    namespace = m.group("ns").strip("/")
    base = image.rsplit("/", 1)[-1]
    return Repository(host, f"{namespace}/{base}" if namespace else base)


# --- credentials ---------------------------------------------------------------------------------------


def config_dir() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def credentials(host: str, config: Path | None = None) -> tuple[str, str] | None:
    """(username, secret) for `host` from the Docker config or its credential helper, or None."""
    path = (config or config_dir()) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    helper = (data.get("credHelpers") or {}).get(host) or data.get("credsStore")
    if helper:
        found = _from_helper(helper, host)
        if found:
            return found
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        auth = ((data.get("auths") or {}).get(key) or {}).get("auth")
        if auth:
            user, _, secret = base64.b64decode(auth).decode().partition(":")
            return user, secret
    return None


def _from_helper(helper: str, host: str) -> tuple[str, str] | None:
    try:
        proc = subprocess.run([f"docker-credential-{helper}", "get"], input=host, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout or "{}")
    return (data.get("Username", ""), data.get("Secret", "")) if data.get("Secret") else None


# --- HTTP ----------------------------------------------------------------------------------------------


def _request(url: str, headers: dict, method: str = "HEAD"):
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        return urllib.request.urlopen(req, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        return exc
    except (urllib.error.URLError, OSError) as exc:
        raise Transient(f"registry {url.split('/v2/')[0]} does not answer ({getattr(exc, 'reason', exc)})") from None


def _bearer(challenge: str, creds: tuple[str, str] | None) -> str:
    """Token auth (ghcr.io, Docker Hub): fetch a pull token from the realm the registry names."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise StepFailed(f"registry asks for token auth with an unusable realm {realm!r}")
    headers = {}
    if creds:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
    resp = _request(f"{realm}?{urllib.parse.urlencode(params)}", headers, method="GET")
    if resp.status != 200:
        raise StepFailed(f"token service {realm} refused ({resp.status})", "check `docker login` for this registry")
    body = json.loads(resp.read() or b"{}")
    return "Bearer " + (body.get("token") or body.get("access_token") or "")


def manifest_digest(repo: Repository, reference: str, config: Path | None = None) -> str | None:
    """The digest the registry serves for repo:reference (None when it has no such tag)."""
    url = f"{repo.base_url}/v2/{repo.name}/manifests/{reference}"
    headers = {"Accept": ACCEPT}
    resp = _request(url, headers)
    if resp.status == 401:
        creds = credentials(repo.host, config)
        challenge = resp.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("bearer"):
            headers["Authorization"] = _bearer(challenge, creds)
        elif creds:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        else:
            raise StepFailed(f"{repo.host} needs credentials to read {repo.name}",
                             f"`docker login {repo.host}`, or pass --username U --password-stdin")
        resp = _request(url, headers)
    if resp.status == 404:
        return None
    if resp.status in (429,) or resp.status >= 500:
        raise Transient(f"{repo.host} answered {resp.status} for {repo.name}:{reference}")
    if resp.status != 200:
        raise StepFailed(f"{repo.host} answered {resp.status} for {repo.name}:{reference}")
    digest = resp.headers.get("Docker-Content-Digest", "")
    if not DIGEST_RE.match(digest):
        raise StepFailed(f"{repo.host} sent no usable Docker-Content-Digest for {repo.name}:{reference}")
    return digest
