"""A hostile registry on loopback: the registry client keeps credentials home and turns every bad answer
into one line with the right exit code (1: the remote misbehaved; 3 is for what this machine lacks). No Docker engine: small HTTP servers on 127.0.0.1 and 127.0.0.2
(all of 127.0.0.0/8 is loopback on Linux, and to the client they are two different hosts)."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.boundary import registry
from builder.errors import BuilderError

USER, PASSWORD = "alice", "s3cret-pass"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
TOKEN = "tok-abc123"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Server:
    """One loopback HTTP server; `route(handler)` answers every request, `seen` records (method, path, headers)."""

    def __init__(self, address: str, route: Callable[[BaseHTTPRequestHandler, Server], None]):
        self.seen: list[tuple[str, str, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.body = self.rfile.read(length) if length else b""
                server.seen.append((self.command, self.path, dict(self.headers)))
                route(self, server)

            do_GET = do_HEAD = do_PUT = do_POST = _any

            def log_message(self, *_args):
                pass

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"{address}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def auth_headers(self) -> list[str | None]:
        return [h.get("Authorization") for _, _, h in self.seen]


def reply(h: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None) -> None:
    h.send_response(status)
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


@pytest.fixture
def servers():
    started = []

    def start(address: str, route) -> Server:
        started.append(Server(address, route))
        return started[-1]

    registry._session, registry._accepted = None, {}  # every test starts with no session and no token
    yield start
    for s in started:
        s.httpd.shutdown()
        s.httpd.server_close()


@pytest.fixture
def login(tmp_path):
    """A Docker config with `docker login` credentials for a host."""

    def write(host: str):
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        (tmp_path / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        return tmp_path

    return write


def one_line(exc: BuilderError, code: int) -> str:
    assert exc.exit_code == code, (type(exc).__name__, str(exc))
    assert "\n" not in str(exc) and "Traceback" not in str(exc)
    assert PASSWORD not in str(exc) and TOKEN not in str(exc)
    return str(exc)


# --- redirects and auth realms ----------------------------------------------------------------------------


def _cdn(data: bytes):
    return lambda h, _s: reply(h, 200, data, {"Content-Type": "application/octet-stream"})


def test_a_blob_redirected_to_another_host_gets_no_basic_password(servers, login):
    data = b'{"config": {"Labels": {"a": "b"}}}'
    cdn = servers("127.0.0.2", _cdn(data))

    def reg(h, _s):
        if h.headers.get("Authorization") != BASIC:
            return reply(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        reply(h, 307, headers={"Location": f"http://{cdn.host}/cdn/blob?sig=1"})

    home = servers("127.0.0.1", reg)
    repo = registry.Repository(home.host, "team/train")
    assert registry.blob(repo, sha(data), login(home.host)) == data
    assert BASIC in home.auth_headers(), "the registry itself got the credentials"
    assert cdn.seen and cdn.auth_headers() == [None], "the password never reached the redirect target"


def test_a_bearer_token_stays_home_on_a_redirected_manifest_and_is_reused(servers, login):
    doc = json.dumps({"schemaVersion": 2, "config": {"digest": sha(b"{}")}}).encode()
    cdn = servers("127.0.0.2", _cdn(doc))
    tokens = []

    def reg(h, s):
        if h.path.startswith("/token"):
            tokens.append(h.headers.get("Authorization"))
            return reply(h, 200, json.dumps({"token": TOKEN}).encode())
        if h.headers.get("Authorization") != f"Bearer {TOKEN}":
            return reply(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://{s.host}/token",'
                                                                f'service="reg",scope="repository:t:pull"'})
        reply(h, 307, headers={"Location": f"http://{cdn.host}/m"})

    home = servers("127.0.0.1", reg)
    repo, config = registry.Repository(home.host, "t"), login(home.host)
    for _ in range(3):
        assert registry.manifest(repo, sha(doc), config)[2] == sha(doc)
    assert tokens == [BASIC], "one token for the session, fetched with the basic credentials as Docker does"
    assert cdn.auth_headers() == [None, None, None], "neither token nor password reached the CDN"


def test_a_token_realm_on_another_host_gets_the_basic_credentials_like_docker(servers, login):
    """Docker sends `docker login` credentials to whatever realm the registry names (auth.docker.io for
    Docker Hub): the registry chooses its token service. We do the same, but only over HTTPS or to loopback."""
    auth = servers("127.0.0.2", lambda h, _s: reply(h, 200, json.dumps({"access_token": TOKEN}).encode()))

    def reg(h, _s):
        if h.headers.get("Authorization") != f"Bearer {TOKEN}":
            return reply(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://{auth.host}/t",service="s"'})
        reply(h, 200, headers={"Docker-Content-Digest": sha(b"x")})

    home = servers("127.0.0.1", reg)
    assert registry.manifest_digest(registry.Repository(home.host, "t"), "v1", login(home.host)) == sha(b"x")
    assert auth.auth_headers() == [BASIC]
    assert auth.seen[0][1] == "/t?service=s"


def test_a_plain_http_realm_on_a_remote_host_gets_nothing(servers, login):
    home = servers("127.0.0.1", lambda h, _s: reply(
        h, 401, headers={"WWW-Authenticate": 'Bearer realm="http://tokens.example.invalid/t"'}))
    with pytest.raises(BuilderError) as err:
        registry.manifest_digest(registry.Repository(home.host, "t"), "v1", login(home.host))
    assert "unusable realm" in one_line(err.value, 1)


def test_an_upload_location_on_another_host_gets_no_credentials(servers, login):
    store = servers("127.0.0.2", lambda h, _s: reply(h, 201, headers={"Docker-Content-Digest": sha(b"data")}))

    def reg(h, _s):
        if h.headers.get("Authorization") != BASIC:
            return reply(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        if h.command == "HEAD":
            return reply(h, 404)
        reply(h, 202, headers={"Location": f"http://{store.host}/upload/1"})

    home = servers("127.0.0.1", reg)
    assert registry.put_blob(registry.Repository(home.host, "t"), b"data", login(home.host)) == sha(b"data")
    assert store.auth_headers() == [None]


def test_a_401_from_another_host_is_not_answered_with_our_credentials(servers, login):
    store = servers("127.0.0.2", lambda h, _s: reply(h, 401, headers={"WWW-Authenticate": 'Basic realm="x"'}))
    home = servers("127.0.0.1", lambda h, _s: reply(h, 202, headers={"Location": f"http://{store.host}/u"})
                   if h.command == "POST" else reply(h, 404))
    with pytest.raises(BuilderError) as err:
        registry.put_blob(registry.Repository(home.host, "t"), b"data", login(home.host))
    assert "not sent" in one_line(err.value, 1)
    assert store.auth_headers() == [None]


def test_matrix_changed_against_a_redirecting_registry_leaks_nothing(servers, login, project, monkeypatch, capsys):
    """The command the issue caught leaking: every entry's manifest read is redirected to another host,
    which sends an endless body. Credentials stay home; each entry is planned, with one line saying why."""
    from tests.conftest import run_cli

    cdn = servers("127.0.0.2", _endless)

    def reg(h, _s):
        if h.headers.get("Authorization") != BASIC:
            return reply(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        reply(h, 307, headers={"Location": f"http://{cdn.host}/m"})

    home = servers("127.0.0.1", reg)
    monkeypatch.setenv("DOCKER_CONFIG", str(login(home.host)))
    assert run_cli("matrix", "--all", "--changed-against", home.host) == 0
    captured = capsys.readouterr()
    assert cdn.seen and set(cdn.auth_headers()) == {None}
    assert BASIC in home.auth_headers()
    assert "more than 64 MiB" in captured.err and "Traceback" not in captured.err


# --- lies about digests -----------------------------------------------------------------------------------


def test_a_manifest_that_is_not_the_digest_asked_for_is_refused(servers):
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, b'{"schemaVersion": 2}'))
    with pytest.raises(BuilderError) as err:
        registry.manifest(registry.Repository(home.host, "t"), sha(b"other"))
    assert "not sha256:" in one_line(err.value, 1)


def test_a_blob_with_other_content_is_refused(servers):
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, b"evil"))
    with pytest.raises(BuilderError) as err:
        registry.blob(registry.Repository(home.host, "t"), sha(b"good"))
    assert "other content" in one_line(err.value, 1)


def test_an_index_naming_a_path_instead_of_a_digest_is_not_followed(servers):
    index = json.dumps({"manifests": [{"digest": "../../etc", "platform": {"architecture": "amd64"}}]}).encode()
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, index))
    with pytest.raises(BuilderError) as err:
        registry.config_labels(registry.Repository(home.host, "t"), "v1")
    assert "not sha256:<64 hex>" in one_line(err.value, 1)
    assert len(home.seen) == 1


def test_a_stray_referrer_entry_is_skipped(servers):
    good = {"digest": sha(b"a"), "artifactType": "x"}
    index = json.dumps({"manifests": [good, {"digest": "nope"}, "junk", 5]}).encode()
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, index, {"Content-Type": registry.OCI_INDEX}))
    assert registry.referrers(registry.Repository(home.host, "t"), sha(b"s")) == [good]


# --- malformed and endless bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"<html>nginx</html>", b"[1, 2]", b"\xff\xfe", b"[" * 100_000])
def test_a_manifest_that_is_not_a_json_object_is_one_line(servers, body):
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, body))
    with pytest.raises(BuilderError) as err:
        registry.manifest(registry.Repository(home.host, "t"), "v1")
    assert "manifest" in one_line(err.value, 1)


@pytest.mark.parametrize("doc", [{"config": 5}, {"config": {}}, {"manifests": 7}, {"manifests": [3]}])
def test_a_wrong_shaped_manifest_is_one_line(servers, doc):
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, json.dumps(doc).encode()))
    with pytest.raises(BuilderError) as err:
        registry.config_labels(registry.Repository(home.host, "t"), "v1")
    one_line(err.value, 1)


@pytest.mark.parametrize("answer", [b"not json", b'{"token": 5}', b'{"token": "a\\nInjected: 1"}', b"[]"])
def test_a_token_service_answering_garbage_is_one_line(servers, login, answer):
    def reg(h, s):
        if h.path.startswith("/token"):
            return reply(h, 200, answer)
        reply(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://{s.host}/token"'})

    home = servers("127.0.0.1", reg)
    with pytest.raises(BuilderError) as err:
        registry.manifest_digest(registry.Repository(home.host, "t"), "v1", login(home.host))
    assert "token" in one_line(err.value, 1)


def test_a_bad_content_length_on_head_is_one_line(servers):
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, headers={"Docker-Content-Digest": "sha256:zz"}))
    with pytest.raises(BuilderError) as err:
        registry.descriptor(registry.Repository(home.host, "t"), "v1")
    one_line(err.value, 1)


@pytest.mark.parametrize("header, value, words", [
    ("Docker-Content-Digest", sha(b"another manifest"), "Docker-Content-Digest"),
    ("Content-Type", registry.OCI_INDEX, "Content-Type"),
], ids=["digest", "media-type"])
def test_a_manifest_whose_headers_contradict_its_bytes_is_refused_before_anything_moves(servers, header, value,
                                                                                         words):
    """Publish reads the pushed manifest back by digest (its compression, attest's subject) before the alias
    moves: headers that say another digest or media type than the bytes do are a registry (or proxy) at fault,
    exit 1, never a subject described from one and pointing at the other."""
    doc = {"schemaVersion": 2, "mediaType": registry.OCI_MANIFEST, "config": registry.EMPTY_CONFIG, "layers": []}
    raw = json.dumps(doc).encode()
    headers = {"Content-Type": registry.OCI_MANIFEST, "Docker-Content-Digest": sha(raw), header: value}
    home = servers("127.0.0.1", lambda h, _s: reply(h, 200, raw, headers))
    with pytest.raises(BuilderError) as err:
        registry.checked_descriptor(registry.Repository(home.host, "t"), sha(raw))
    line = one_line(err.value, 1)
    assert words in line and "contradict" in line
    honest = servers("127.0.0.1", lambda h, _s: reply(h, 200, raw, {**headers, header: {
        "Docker-Content-Digest": sha(raw), "Content-Type": registry.OCI_MANIFEST}[header]}))
    assert registry.checked_descriptor(registry.Repository(honest.host, "t"), sha(raw)) == {
        "mediaType": registry.OCI_MANIFEST, "digest": sha(raw), "size": len(raw)}


def _endless(h, _s):
    h.protocol_version = "HTTP/1.0"  # no length: the body ends only when the server closes
    h.send_response(200)
    h.end_headers()
    chunk = b"[" * (1 << 20)
    try:
        while True:
            h.wfile.write(chunk)
    except OSError:
        pass


def test_an_endless_body_ends_as_one_line_exit_1(servers):
    home = servers("127.0.0.1", _endless)
    started = time.monotonic()
    with pytest.raises(BuilderError) as err:
        registry.manifest(registry.Repository(home.host, "t"), "v1")
    assert "more than 64 MiB" in one_line(err.value, 1)
    assert time.monotonic() - started < 20


def test_a_registry_that_stalls_ends_as_a_retryable_failure(servers, monkeypatch):
    monkeypatch.setattr(registry, "TIMEOUT_S", 1)
    home = servers("127.0.0.1", lambda h, _s: time.sleep(3))
    with pytest.raises(registry.Transient) as err:
        registry.manifest_digest(registry.Repository(home.host, "t"), "v1")
    assert "does not answer" in one_line(err.value, 1)


# --- and a real registry still works -------------------------------------------------------------------------


def test_the_client_round_trips_with_a_real_distribution_registry(servers, tmp_path, login):
    """distribution 2.8 with htpasswd auth (no Docker engine): blob upload to the Location it gives, manifest,
    labels, descriptor, a referrer through the fallback tag, and 404 as None."""
    from tests.integration.registry_fixture import Registry

    reg = Registry(tmp_path / "reg", users={USER: PASSWORD}).start()
    try:
        repo, config = registry.Repository(reg.host, "team/train"), login(reg.host)
        image_config = json.dumps({"config": {"Labels": {"k": "v"}}}).encode()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": registry.OCI_MANIFEST, "layers": [], "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json", "size": len(image_config),
            "digest": registry.put_blob(repo, image_config, config)}}).encode()
        digest = registry.put_manifest(repo, "v1", manifest, registry.OCI_MANIFEST, config)
        assert digest == sha(manifest) == registry.manifest_digest(repo, "v1", config) == reg.digest(
            "team/train", "v1", USER)
        assert registry.config_labels(repo, "v1", config) == {"k": "v"}
        subject = registry.descriptor(repo, digest, config)
        assert subject == {"mediaType": registry.OCI_MANIFEST, "digest": digest, "size": len(manifest)}
        registry.push_referrer(repo, subject, "application/x-test", b"payload", {"a": "b"}, config)
        [found] = registry.referrers(repo, digest, config)
        assert registry.referrer_payload(repo, found, digest, config) == b"payload"
        assert registry.manifest_digest(repo, "absent", config) is None
    finally:
        reg.stop()
