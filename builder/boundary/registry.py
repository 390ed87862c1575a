"""Registry references and the Registry HTTP API v2 calls publish and verify need.

Digests are read back over the API (`HEAD /v2/<name>/manifests/<ref>`), not taken from the push output, so a
publish is only reported when the registry itself serves the manifest. Attestations are blobs and manifests
pushed beside the image as OCI referrers (the referrers API, else the fallback tag) and read back the same way.
Credentials come from the Docker config the docker CLI uses (`auths`, `credHelpers`, `credsStore`), never
from arguments: https://github.com/docker/cli/blob/master/docs/reference/commandline/login.md
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from builder.boundary import process
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.model.reference import PATH_COMPONENT

# Docker image manifests first (what `docker push` writes), then OCI, then lists/indexes: without these
# Accept headers a v2 registry may answer with a converted schema-1 manifest and another digest.
ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
))
# Matched with fullmatch (`$` would accept a trailing newline). Namespace parts follow Docker's path-component
# grammar (builder/model/reference.py), so "..", "." or "a//b" never become part of a repository.
REGISTRY_RE = re.compile(r"(?P<host>[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:]+\])(?::(?P<port>[0-9]{1,5}))?"
                         rf"(?P<ns>(?:/{PATH_COMPONENT})*)")
DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")
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
    m = REGISTRY_RE.fullmatch(registry.strip().rstrip("/"))
    if not m or "@" in registry:
        raise UserError(f"--registry {registry[:100]!r} is not HOST[:PORT][/NAMESPACE]",
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
    try:  # not echoed: the helper's answer is the credential itself, and a missing helper just means none
        proc = process.run([f"docker-credential-{helper}", "get"], input=host, timeout=30, echo=False)
    except EnvironmentProblem:
        return None
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout or "{}")
    return (data.get("Username", ""), data.get("Secret", "")) if data.get("Secret") else None


# --- HTTP ----------------------------------------------------------------------------------------------


def _request(url: str, headers: dict, method: str = "HEAD", body: bytes | None = None):
    req = urllib.request.Request(url, method=method, headers=headers, data=body)
    try:
        return urllib.request.urlopen(req, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        return exc
    except (urllib.error.URLError, OSError) as exc:
        raise Transient(f"registry {url.split('/v2/')[0]} does not answer ({getattr(exc, 'reason', exc)})") from None


def _bearer(challenge: str, creds: tuple[str, str] | None) -> str:
    """Token auth (ghcr.io, Docker Hub): fetch a token for the scope the registry names in its challenge."""
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


def call(repo: Repository, method: str, path: str, config: Path | None = None, headers: dict | None = None,
         body: bytes | None = None, ok: tuple[int, ...] = (200,)):
    """One registry API call on repo (`path` below /v2/<name>/ or an absolute URL the registry gave), answering
    a 401 challenge with the Docker config's credentials. 404 → None; 5xx/429 → Transient."""
    url = path if path.startswith(("http://", "https://")) else f"{repo.base_url}/v2/{repo.name}/{path}"
    headers = dict(headers or {})
    resp = _request(url, headers, method, body)
    if resp.status == 401:
        creds = credentials(repo.host, config)
        challenge = resp.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("bearer"):
            headers["Authorization"] = _bearer(challenge, creds)
        elif creds:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        else:
            raise StepFailed(f"{repo.host} needs credentials for {repo.name}",
                             f"`docker login {repo.host}`, or pass --username U --password-stdin")
        resp = _request(url, headers, method, body)
    if resp.status == 404:
        return None
    if resp.status == 429 or resp.status >= 500:
        raise Transient(f"{repo.host} answered {resp.status} for {method} {repo.name}/{path.split('?')[0][:80]}")
    if resp.status not in ok:
        raise StepFailed(f"{repo.host} answered {resp.status} for {method} {repo.name}/{path.split('?')[0][:80]}")
    return resp


def manifest_digest(repo: Repository, reference: str, config: Path | None = None) -> str | None:
    """The digest the registry serves for repo:reference (None when it has no such tag)."""
    resp = call(repo, "HEAD", f"manifests/{reference}", config, {"Accept": ACCEPT})
    if resp is None:
        return None
    digest = resp.headers.get("Docker-Content-Digest", "")
    if not DIGEST_RE.fullmatch(digest):
        raise StepFailed(f"{repo.host} sent no usable Docker-Content-Digest for {repo.name}:{reference}")
    return digest


def descriptor(repo: Repository, reference: str, config: Path | None = None) -> dict | None:
    """The OCI descriptor (mediaType, digest, size) of repo:reference, as the registry serves it."""
    resp = call(repo, "HEAD", f"manifests/{reference}", config, {"Accept": ACCEPT})
    if resp is None:
        return None
    return {"mediaType": resp.headers.get("Content-Type", "").split(";")[0],
            "digest": resp.headers.get("Docker-Content-Digest", ""), "size": int(resp.headers.get("Content-Length", 0))}


def manifest(repo: Repository, reference: str, config: Path | None = None) -> tuple[dict, str, str] | None:
    """(manifest, media type, digest) for repo:reference, None when absent; the digest is checked."""
    resp = call(repo, "GET", f"manifests/{reference}", config, {"Accept": ACCEPT})
    if resp is None:
        return None
    raw = resp.read()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    if reference.startswith("sha256:") and digest != reference:
        raise StepFailed(f"{repo.host} served a manifest whose digest is {digest}, not {reference}")
    return json.loads(raw), resp.headers.get("Content-Type", ""), digest


def blob(repo: Repository, digest: str, config: Path | None = None) -> bytes | None:
    resp = call(repo, "GET", f"blobs/{digest}", config)
    if resp is None:
        return None
    data = resp.read()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise StepFailed(f"{repo.host} served blob {digest[:19]} with other content")
    return data


def config_labels(repo: Repository, reference: str, config: Path | None = None) -> dict | None:
    """The labels of the image repo:reference (linux/amd64 of an index), None when it is not there."""
    found = manifest(repo, reference, config)
    if found is None:
        return None
    data, _, _ = found
    if "manifests" in data:  # an index: the linux/amd64 image
        child = next((m for m in data["manifests"] if (m.get("platform") or {}).get("architecture") == "amd64"), None)
        if child is None:
            return None
        found = manifest(repo, child["digest"], config)
        data = found[0]
    raw = blob(repo, data["config"]["digest"], config)
    return (json.loads(raw or b"{}").get("config") or {}).get("Labels") or {}


def put_blob(repo: Repository, data: bytes, config: Path | None = None) -> str:
    """Upload `data` as a blob (monolithic: POST then PUT); returns its digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if call(repo, "HEAD", f"blobs/{digest}", config) is not None:
        return digest  # already there
    start = call(repo, "POST", "blobs/uploads/", config, ok=(202,))
    location = start.headers.get("Location", "")
    if not location.startswith(("http://", "https://")):
        location = f"{repo.base_url}{location}"
    sep = "&" if "?" in location else "?"
    call(repo, "PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", config,
         {"Content-Type": "application/octet-stream"}, data, ok=(201,))
    return digest


def put_manifest(repo: Repository, reference: str, data: bytes, media_type: str, config: Path | None = None) -> str:
    resp = call(repo, "PUT", f"manifests/{reference}", config, {"Content-Type": media_type}, data, ok=(201,))
    return resp.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(data).hexdigest()


# --- referrers (OCI 1.1): artifacts about an image, stored beside it -----------------------------------

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_CONFIG = {"mediaType": "application/vnd.oci.empty.v1+json",
                "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2}


def fallback_tag(digest: str) -> str:
    """The referrers tag schema (OCI distribution 1.1, and cosign's habit) for registries without the API."""
    return digest.replace(":", "-")


def push_referrer(repo: Repository, subject: dict, artifact_type: str, payload: bytes,
                  annotations: dict | None = None, config: Path | None = None) -> str:
    """Store `payload` as an artifact whose `subject` is the image (a descriptor: mediaType, digest, size).
    Registries with the referrers API index it by itself; for the others the fallback tag's index lists it."""
    put_blob(repo, b"{}", config)
    layer = {"mediaType": artifact_type, "digest": put_blob(repo, payload, config), "size": len(payload)}
    manifest_doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                    "config": EMPTY_CONFIG, "layers": [layer], "subject": subject,
                    "annotations": dict(sorted((annotations or {}).items()))}
    raw = json.dumps(manifest_doc, sort_keys=True, separators=(",", ":")).encode()
    digest = put_manifest(repo, "sha256:" + hashlib.sha256(raw).hexdigest(), raw, OCI_MANIFEST, config)
    if _referrers_api(repo, subject["digest"], config) is None:
        _add_to_fallback_index(repo, subject["digest"], {"mediaType": OCI_MANIFEST, "digest": digest,
                                                         "size": len(raw), "artifactType": artifact_type,
                                                         "annotations": manifest_doc["annotations"]}, config)
    return digest


def _referrers_api(repo: Repository, digest: str, config: Path | None) -> dict | None:
    resp = call(repo, "GET", f"referrers/{digest}", config, {"Accept": OCI_INDEX}, ok=(200, 400, 405))
    if resp is None or resp.status != 200 or OCI_INDEX not in resp.headers.get("Content-Type", ""):
        return None  # no referrers API here (distribution 2.x answers 404)
    return json.loads(resp.read() or b"{}")


def _add_to_fallback_index(repo: Repository, subject: str, descriptor: dict, config: Path | None) -> None:
    found = manifest(repo, fallback_tag(subject), config)
    index = found[0] if found else {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    index["manifests"] = [m for m in index.get("manifests", []) if m.get("digest") != descriptor["digest"]]
    index["manifests"].append(descriptor)
    put_manifest(repo, fallback_tag(subject), json.dumps(index, sort_keys=True).encode(), OCI_INDEX, config)


def referrers(repo: Repository, subject: str, config: Path | None = None) -> list[dict]:
    """Descriptors of the artifacts that refer to `subject`: the referrers API, else the fallback tag."""
    index = _referrers_api(repo, subject, config)
    if index is None:
        found = manifest(repo, fallback_tag(subject), config)
        index = found[0] if found else {}
    return list(index.get("manifests") or [])


def referrer_payload(repo: Repository, descriptor: dict, subject: str, config: Path | None = None) -> bytes | None:
    """The artifact's content, after checking it really names `subject` (a stray index entry proves nothing)."""
    found = manifest(repo, descriptor["digest"], config)
    if found is None:
        return None
    doc = found[0]
    if (doc.get("subject") or {}).get("digest") != subject or not doc.get("layers"):
        return None
    return blob(repo, doc["layers"][0]["digest"], config)
