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
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from builder.boundary import process, web
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.model import yamlread
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


MAX_CONFIG = 4 << 20  # a Docker config is kilobytes; a FIFO, a device or a huge file there is not read
HELPER_TIMEOUT_S = 30.0  # a credential helper that waits (a locked keychain asking no one) ends as an error


def config_dir() -> Path | None:
    """$DOCKER_CONFIG, else ~/.docker; None when there is no home directory (HOME unset and a UID with no passwd
    entry, as in a container run with an arbitrary --user): then there is no Docker config either."""
    if os.environ.get("DOCKER_CONFIG"):
        return Path(os.environ["DOCKER_CONFIG"])
    try:
        return Path.home() / ".docker"
    except (RuntimeError, KeyError):  # pathlib: "Could not determine home directory"
        return None


def read_config(path: Path, host: str) -> dict | None:
    """The Docker config at `path` as a JSON object; None when there is none. Anything else is a UserError
    naming the file (exit 2): the user fixes or removes it."""
    if not os.path.lexists(path):
        return None
    fix = f"fix it, or remove it and run `docker login {host}` again"
    try:
        raw = yamlread.read_bounded(path, MAX_CONFIG, what="Docker config")
    except UserError as exc:
        raise UserError(exc.message, fix) from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError included
        raise UserError(f"{path} is not JSON", fix) from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object", fix)
    return data


def credentials(host: str, config: Path | None = None) -> tuple[str, str] | None:
    """(username, secret) for `host` from the Docker config or its credential helper, or None."""
    directory = config or config_dir()
    if directory is None:
        return None
    path = directory / "config.json"
    data = read_config(path, host)
    if data is None:
        return None
    helper = _get(data, "credHelpers").get(host) or data.get("credsStore")
    if isinstance(helper, str) and helper:
        found = _from_helper(helper, host, path)
        if found:
            return found
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        auth = _get(_get(data, "auths"), key).get("auth")
        if auth:
            return _basic_pair(auth, path, key)
    return None


def _get(data: dict, key: str) -> dict:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _basic_pair(auth, path: Path, key: str) -> tuple[str, str]:
    """`auths[key].auth` is base64 of user:password, as `docker login` writes it."""
    try:
        user, sep, secret = base64.b64decode(auth, validate=True).decode().partition(":")
    except (TypeError, ValueError):  # binascii.Error and UnicodeDecodeError are ValueErrors
        user, sep, secret = "", "", ""
    if not sep:
        raise UserError(f"{path}: auths[{key!r}].auth is not base64 of user:password",
                        f"run `docker login {key}` again")
    return user, secret


def _from_helper(helper: str, host: str, path: Path) -> tuple[str, str] | None:
    """Ask `docker-credential-<helper> get`, as Docker does. A missing helper or its "credentials not found"
    means none; any other failure, an answer of the wrong shape or no answer in time is an error (exit 3)."""
    name = f"docker-credential-{helper}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", helper):
        raise UserError(f"{path}: credential helper {helper[:40]!r} is not a helper name",
                        "e.g. \"credsStore\": \"pass\" (docker-credential-pass on PATH)")
    try:  # not echoed: the helper's answer is the credential itself, and a missing helper just means none
        proc = process.run([name, "get"], input=host, timeout=HELPER_TIMEOUT_S, echo=False)
    except process.NotRunnable:
        return None
    except process.TimedOut:
        raise EnvironmentProblem(f"{name} did not answer for {host} within {HELPER_TIMEOUT_S:g} s",
                                 f"unlock or fix that credential helper (try `echo {host} | {name} get`)") from None
    if proc.returncode != 0:
        if "credentials not found" in (proc.stdout + proc.stderr).lower():
            return None
        # never quote its output: it may hold the secret
        raise EnvironmentProblem(f"{name} failed for {host} (exit {proc.returncode})",
                                 f"fix that credential helper (try `echo {host} | {name} get`)")
    try:
        data = json.loads(proc.stdout or "{}")
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not all(isinstance(data.get(k, ""), str) for k in ("Username", "Secret")):
        # never quote the answer: it may be the secret itself
        raise EnvironmentProblem(f"{name} answered something other than "
                                 '{"Username": …, "Secret": …} for ' + host, "check that credential helper")
    return (data.get("Username", ""), data["Secret"]) if data.get("Secret") else None


# --- HTTP ----------------------------------------------------------------------------------------------
#
# One requests session for the process. Credentials are set per request and only on URLs of the registry's
# own host; requests strips Authorization on a redirect to another host (blob reads redirected to a CDN), so
# neither the token nor the basic password leaves the registry. Token realms get the basic credentials, as
# Docker's client does (the realm is named by the registry: auth.docker.io for Docker Hub), but only over
# HTTPS or to loopback. Each Authorization that worked is reused for that repository until a 401 asks again.

MAX_BODY = 64 << 20  # manifests, image configs, attestations: all far smaller
_session = None
_accepted: dict[str, str] = {}  # "host/name" -> the Authorization the registry last accepted


class BadAnswer(StepFailed):
    """The registry (or its token service) answered something unusable: not JSON, the wrong shape, too large,
    headers that disagree with the body. The remote misbehaved, not this machine: exit 1 (the README's codes)."""


def _send(url: str, method: str, headers: dict, body: bytes | None = None) -> web.Answer:
    global _session
    if _session is None:
        _session = web.session()
    try:
        return web.fetch(_session, method, url, headers=headers, data=body, timeout=TIMEOUT_S, limit=MAX_BODY)
    except web.TooLarge:
        raise BadAnswer(f"{_origin(url)} sent more than {MAX_BODY >> 20} MiB for {method} "
                        f"{urllib.parse.urlsplit(url).path[:80]}; refused") from None
    except web.Failed as exc:
        raise Transient(f"registry {_origin(url)} does not answer ({exc.reason})") from None


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def _basic(creds: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()


def _parse(raw: bytes, what: str):
    try:
        return json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise BadAnswer(f"{what} is not JSON") from None


def _bearer(challenge: str, creds: tuple[str, str] | None) -> str:
    """Token auth (ghcr.io, Docker Hub): fetch a token for the scope the registry names in its challenge."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    parts = urllib.parse.urlsplit(realm)
    local = (parts.hostname or "") in ("localhost", "::1") or (parts.hostname or "").startswith("127.")
    if parts.scheme not in ("https", "http") or not parts.hostname or (parts.scheme == "http" and not local):
        raise BadAnswer(f"registry asks for token auth with an unusable realm {realm[:100]!r}",
                        "a token service must be HTTPS (plain HTTP only on loopback)")
    resp = _send(f"{realm}{'&' if parts.query else '?'}{urllib.parse.urlencode(params)}", "GET",
                 {"Authorization": _basic(creds)} if creds else {})
    if resp.status != 200:
        raise StepFailed(f"token service {_origin(realm)} refused ({resp.status})",
                         "check `docker login` for this registry")
    body = _parse(resp.body, f"the answer of token service {_origin(realm)}")
    token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
    if not isinstance(token, str) or not token or not token.isprintable():
        raise BadAnswer(f"token service {_origin(realm)} answered without a usable token")
    return "Bearer " + token


def call(repo: Repository, method: str, path: str, config: Path | None = None, headers: dict | None = None,
         body: bytes | None = None, ok: tuple[int, ...] = (200,)) -> web.Answer | None:
    """One registry API call on repo (`path` below /v2/<name>/ or an absolute URL the registry gave), answering
    a 401 challenge with the Docker config's credentials. 404 → None; 5xx/429 → Transient."""
    url = path if path.startswith(("http://", "https://")) else f"{repo.base_url}/v2/{repo.name}/{path}"
    home = urllib.parse.urlsplit(url).netloc == repo.host  # an upload URL may point elsewhere: no credentials
    headers = dict(headers or {})
    key = repo.ref
    if home and key in _accepted:
        headers["Authorization"] = _accepted[key]
    resp = _send(url, method, headers, body)
    if resp.status == 401:
        if not home:
            raise StepFailed(f"{_origin(url)} asks for credentials; they belong to {repo.host} and are not sent")
        headers["Authorization"] = _authorization(repo, resp.headers.get("WWW-Authenticate", ""), config)
        resp = _send(url, method, headers, body)
        if resp.status != 401:
            _accepted[key] = headers["Authorization"]
    what = f"{method} {repo.name}/{path.split('?')[0][:80]}"
    if resp.status == 404:
        return None
    if resp.status == 429 or resp.status >= 500:
        raise Transient(f"{repo.host} answered {resp.status} for {what}")
    if resp.status not in ok:
        raise StepFailed(f"{repo.host} answered {resp.status} for {what}")
    return resp


def _authorization(repo: Repository, challenge: str, config: Path | None) -> str:
    creds = credentials(repo.host, config)
    if challenge.lower().startswith("bearer"):
        return _bearer(challenge, creds)
    if creds:
        return _basic(creds)
    raise StepFailed(f"{repo.host} needs credentials for {repo.name}",
                     f"`docker login {repo.host}`, or pass --username U --password-stdin")


def _digest(value, what: str) -> str:
    """A digest from a registry's answer, before it is used in a URL or compared: sha256:<64 hex> or refused."""
    if not isinstance(value, str) or not DIGEST_RE.fullmatch(value):
        raise BadAnswer(f"{what} names the digest {str(value)[:80]!r}, not sha256:<64 hex>")
    return value


def manifest_digest(repo: Repository, reference: str, config: Path | None = None) -> str | None:
    """The digest the registry serves for repo:reference (None when it has no such tag). A HEAD answer: publish
    then reads that digest's manifest by GET (served_compression, attest's subject), where the bytes must hash
    to it and every header must agree with them (_manifest_bytes), before the alias moves."""
    found = descriptor(repo, reference, config)
    return found["digest"] if found else None


def descriptor(repo: Repository, reference: str, config: Path | None = None) -> dict | None:
    """The OCI descriptor (mediaType, digest, size) of repo:reference, as the registry serves it."""
    resp = call(repo, "HEAD", f"manifests/{reference}", config, {"Accept": ACCEPT})
    if resp is None:
        return None
    size = resp.headers.get("Content-Length", "0")
    if not size.isdigit():
        raise BadAnswer(f"{repo.host} sent Content-Length {size[:40]!r} for {repo.name}:{reference}")
    return {"mediaType": resp.headers.get("Content-Type", "").split(";")[0],
            "digest": _digest(resp.headers.get("Docker-Content-Digest"), f"{repo.host}'s answer for {reference}"),
            "size": int(size)}


def manifest(repo: Repository, reference: str, config: Path | None = None) -> tuple[dict, str, str] | None:
    """(manifest, media type, digest) for repo:reference, None when absent; the digest is checked."""
    found = _manifest_bytes(repo, reference, config)
    if found is None:
        return None
    doc, resp, digest = found
    return doc, resp.headers.get("Content-Type", ""), digest


def _manifest_bytes(repo: Repository, reference: str, config: Path | None) -> tuple[dict, web.Answer, str] | None:
    resp = call(repo, "GET", f"manifests/{reference}", config, {"Accept": ACCEPT})
    if resp is None:
        return None
    digest = "sha256:" + hashlib.sha256(resp.body).hexdigest()
    if reference.startswith("sha256:") and digest != reference:
        raise StepFailed(f"{repo.host} served a manifest whose digest is {digest}, not {reference}")
    doc = _parse(resp.body, f"the manifest {repo.ref}:{reference[:80]}")
    if not isinstance(doc, dict):
        raise BadAnswer(f"the manifest {repo.ref}:{reference[:80]} is not a JSON object")
    wrong = _disagreement(resp, doc, digest)
    if wrong:
        raise BadAnswer(f"{repo.host} answered {repo.name}:{reference[:80]} with headers that contradict the "
                        f"manifest it sent: {wrong}", "nothing was moved; investigate the registry (or a proxy)")
    return doc, resp, digest


def _disagreement(resp: web.Answer, doc: dict, digest: str) -> str | None:
    """The first header that says something else than the body does: the digest, the length (of an unencoded
    body), the media type. Each is what another client (docker pull, a scanner) believes."""
    named = resp.headers.get("Docker-Content-Digest")
    if named is not None and named != digest:
        return f"Docker-Content-Digest {str(named)[:80]!r}, the bytes hash to {digest}"
    length = resp.headers.get("Content-Length")
    encoded = resp.headers.get("Content-Encoding", "identity").lower() not in ("", "identity")
    if length is not None and not encoded and (not length.strip().isdigit() or int(length) != len(resp.body)):
        return f"Content-Length {length[:40]!r}, the body has {len(resp.body)} bytes"
    media = resp.headers.get("Content-Type", "").split(";")[0].strip()
    if isinstance(doc.get("mediaType"), str) and media and media != doc["mediaType"]:
        return f"Content-Type {media[:80]!r}, the manifest says {doc['mediaType'][:80]!r}"
    return None


def checked_descriptor(repo: Repository, digest: str, config: Path | None = None) -> dict | None:
    """The descriptor (mediaType, digest, size) of repo@digest computed from the manifest's own bytes, whose
    sha256 must be `digest`: what attestations name as their subject. descriptor() is the registry's HEAD
    answer (headers it may get wrong, or lie in); this takes nothing from headers the bytes can say."""
    found = _manifest_bytes(repo, _digest(digest, f"the subject in {repo.ref}"), config)
    if found is None:
        return None
    doc, resp, _ = found
    media = doc.get("mediaType") if isinstance(doc.get("mediaType"), str) else None
    return {"mediaType": media or resp.headers.get("Content-Type", "").split(";")[0], "digest": digest,
            "size": len(resp.body)}


def blob(repo: Repository, digest: str, config: Path | None = None) -> bytes | None:
    resp = call(repo, "GET", f"blobs/{_digest(digest, repo.ref)}", config)
    if resp is None:
        return None
    if "sha256:" + hashlib.sha256(resp.body).hexdigest() != digest:
        raise StepFailed(f"{repo.host} served blob {digest[:19]} with other content")
    return resp.body


def config_labels(repo: Repository, reference: str, config: Path | None = None) -> dict | None:
    """The labels of the image repo:reference (linux/amd64 of an index), None when it is not there."""
    found = manifest(repo, reference, config)
    if found is None:
        return None
    try:
        data = found[0]
        if "manifests" in data:  # an index: the linux/amd64 image
            child = next((m for m in data["manifests"] if (m.get("platform") or {}).get("architecture") == "amd64"),
                         None)
            if child is None:
                return None
            found = manifest(repo, _digest(child["digest"], f"the index {repo.ref}:{reference}"), config)
            if found is None:
                return None
            data = found[0]
        raw = blob(repo, _digest(data["config"]["digest"], f"the manifest {repo.ref}:{reference}"), config)
        labels = (_parse(raw, f"the image config of {repo.ref}:{reference}").get("config") or {}).get("Labels") or {}
    except (KeyError, TypeError, AttributeError):
        raise BadAnswer(f"the manifest or image config of {repo.ref}:{reference} has the wrong shape") from None
    if not isinstance(labels, dict):
        raise BadAnswer(f"the labels of {repo.ref}:{reference} are not a JSON object")
    return labels


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
    return _digest(resp.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(data).hexdigest(),
                   f"{repo.host}'s answer to the push of {reference}")


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
    index = _parse(resp.body, f"the referrers of {repo.ref}@{digest}")
    return index if isinstance(index, dict) else {}


def _add_to_fallback_index(repo: Repository, subject: str, descriptor: dict, config: Path | None) -> None:
    found = manifest(repo, fallback_tag(subject), config)
    index = found[0] if found else {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    index["manifests"] = [m for m in _descriptors(index) if m["digest"] != descriptor["digest"]]
    index["manifests"].append(descriptor)
    put_manifest(repo, fallback_tag(subject), json.dumps(index, sort_keys=True).encode(), OCI_INDEX, config)


def referrers(repo: Repository, subject: str, config: Path | None = None) -> list[dict]:
    """Descriptors of the artifacts that refer to `subject`: the referrers API, else the fallback tag."""
    index = _referrers_api(repo, subject, config)
    if index is None:
        found = manifest(repo, fallback_tag(subject), config)
        index = found[0] if found else {}
    return _descriptors(index)


def _descriptors(index: dict) -> list[dict]:
    """The index's entries that are descriptors with a real digest: a stray entry is skipped, never followed."""
    entries = index.get("manifests") if isinstance(index, dict) else None
    return [m for m in entries if isinstance(m, dict) and isinstance(m.get("digest"), str)
            and DIGEST_RE.fullmatch(m["digest"])] if isinstance(entries, list) else []


def referrer_payload(repo: Repository, descriptor: dict, subject: str, config: Path | None = None) -> bytes | None:
    """The artifact's content, after checking it really names `subject` (a stray index entry proves nothing)."""
    found = manifest(repo, _digest(descriptor.get("digest"), f"a referrer of {repo.ref}@{subject}"), config)
    if found is None:
        return None
    doc = found[0]
    layers = doc.get("layers")
    if not isinstance(doc.get("subject"), dict) or doc["subject"].get("digest") != subject or not layers:
        return None
    if not isinstance(layers, list) or not isinstance(layers[0], dict):
        raise BadAnswer(f"the referrer {descriptor['digest']} of {repo.ref} has the wrong shape")
    return blob(repo, _digest(layers[0].get("digest"), f"the referrer {descriptor['digest']}"), config)
