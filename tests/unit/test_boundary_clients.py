"""The boundary's small clients, with the wire replaced (no network, no process in a unit test): HTTP (web),
git, uv, apt in a base image, a Docker credential helper. What the steps rely on: a time limit and a size bound
on every answer, one-line failures, None where git or a helper is not there."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
import requests

from builder.boundary import apt, engine, git, process, registry, uv, web
from builder.errors import EnvironmentProblem, UserError


def _answer(status: int = 200, body: bytes = b"", reason: str = "OK") -> requests.Response:
    resp = requests.Response()
    resp.status_code, resp.reason, resp.raw = status, reason, io.BytesIO(body)
    return resp


@pytest.fixture
def wire(monkeypatch):
    """requests.request answered from a script: each call's arguments are kept."""
    calls = []

    def use(answer):
        def request(method, url, **kwargs):
            calls.append({"method": method, "url": url, **kwargs})
            if isinstance(answer, Exception):
                raise answer
            return answer

        monkeypatch.setattr(requests, "request", request)
        return calls

    return use


def test_get_returns_the_body_with_a_time_limit_and_our_agent(wire):
    calls = wire(_answer(body=b'{"releases": {}}'))
    assert web.get("https://pypi.org/pypi/torch/json") == b'{"releases": {}}'
    assert calls[0]["timeout"] == web.TIMEOUT_S and calls[0]["stream"] is True
    assert calls[0]["headers"]["User-Agent"].startswith("train-image-builder/")


def test_an_answer_over_the_size_bound_is_refused(wire):
    wire(_answer(body=b"x" * (3 << 20)))
    with pytest.raises(web.Failed, match="larger than 2 MiB; refused"):
        web.get("https://pypi.org/pypi/torch/json", limit=2 << 20)


def test_a_status_that_is_not_success_is_a_failure_with_its_code(wire):
    wire(_answer(404, reason="Not Found"))
    with pytest.raises(OSError) as caught:  # an OSError: callers treat it as an unreachable file
        web.get("https://files.example/torch.whl.metadata")
    assert caught.value.status == 404 and str(caught.value) == "HTTP 404 Not Found"


def test_no_answer_is_one_line_naming_the_cause(wire):
    wire(requests.ConnectionError("HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded with url: "
                                  "/pypi/torch/json (Caused by NameResolutionError(\"Failed to resolve 'pypi.org'\"))"))
    with pytest.raises(web.Failed) as caught:
        web.get("https://pypi.org/pypi/torch/json")
    assert str(caught.value) == "ConnectionError: NameResolutionError(\"Failed to resolve 'pypi.org'\")"
    assert caught.value.status is None


def test_a_read_time_out_says_so(wire):
    wire(requests.ReadTimeout("read timed out"))
    assert web.probe("https://index.example/simple/") == "timed out: read timed out"


@pytest.mark.parametrize("status", [200, 401, 404, 405])
def test_any_answer_means_the_host_is_reachable(wire, status):
    calls = wire(_answer(status))
    assert web.probe("https://registry-1.docker.io/v2/") is None
    assert calls[0]["method"] == "HEAD" and calls[0]["timeout"] == 10


def test_sha256_of_a_streamed_download(wire):
    body = b"wheel" * 300_000
    wire(_answer(body=body))
    assert web.sha256("https://github.com/x/flash_attn.whl") == hashlib.sha256(body).hexdigest()


def test_tls_trusts_the_proxy_ca_that_pip_and_uv_are_given(wire, monkeypatch, tmp_path):
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "proxy-ca.pem"))
    calls = wire(_answer())
    web.get("https://pypi.org/simple/")
    assert calls[0]["verify"] == str(tmp_path / "proxy-ca.pem")


# --- git ----------------------------------------------------------------------------------------------


@pytest.fixture
def runs(monkeypatch):
    """process.run answered from a script (argv prefix -> Result or exception); each argv is kept."""
    asked = []

    def use(answers: dict):
        def run(argv, **kwargs):
            asked.append((list(argv), kwargs))
            for prefix, answer in answers.items():
                if " ".join(argv).startswith(prefix):
                    if isinstance(answer, Exception):
                        raise answer
                    return answer
            return process.Result(1, "", "unexpected", "")

        monkeypatch.setattr(process, "run", run)
        return asked

    return use


def _ok(stdout: str) -> process.Result:
    return process.Result(0, stdout, "", "")


def test_git_answers_time_revision_and_dirty(runs, tmp_path):
    asked = runs({"git log": _ok("1700000000\n"), "git rev-parse": _ok("a94488e0\n"), "git status": _ok(" M x\n")})
    assert git.last_commit_time([tmp_path]) == 1700000000
    assert git.revision([tmp_path]) == "a94488e0-dirty"
    assert all(kwargs["echo"] is False and kwargs["timeout"] for _, kwargs in asked), "quiet, and limited"


def test_without_git_or_history_the_answers_are_neutral(runs, tmp_path):
    runs({"git": process.NotRunnable("cannot run git: No such file or directory")})
    assert git.last_commit_time([tmp_path]) is None
    assert git.revision([tmp_path]) == "unknown"
    assert git.show("/clone", "v2.8.3", "setup.py") is None


def test_git_show_reads_a_file_at_a_tag(runs):
    asked = runs({"git -C /clone show v2.8.3:setup.py": _ok("setup(key=lambda v: v)\n")})
    assert git.show("/clone", "v2.8.3", "setup.py") == "setup(key=lambda v: v)\n"
    assert asked[0][0] == ["git", "-C", "/clone", "show", "v2.8.3:setup.py"]


# --- uv, apt, credential helpers ------------------------------------------------------------------------


def test_uv_compile_reads_requirements_on_stdin_and_ignores_stray_config(runs, monkeypatch):
    monkeypatch.setattr(uv, "binary", lambda: "/venv/bin/uv")
    asked = runs({"/venv/bin/uv pip compile -": _ok("torch==2.13.0\n")})
    assert uv.pip_compile(["--no-header"], ["torch==2.13.0", "ninja"], "t").stdout == "torch==2.13.0\n"
    argv, kwargs = asked[0]
    assert argv == ["/venv/bin/uv", "pip", "compile", "-", "--no-header"]
    assert kwargs["input"] == "torch==2.13.0\nninja\n" and kwargs["env"]["UV_NO_CONFIG"] == "1"
    assert kwargs["timeout"] == uv.TIMEOUT_S


def test_a_resolution_past_its_time_names_the_tag(runs, monkeypatch):
    monkeypatch.setattr(uv, "binary", lambda: "/venv/bin/uv")
    runs({"/venv/bin/uv": process.TimedOut("`uv pip compile -` did not finish within 600 s and was stopped")})
    with pytest.raises(EnvironmentProblem) as caught:
        uv.pip_compile([], ["torch"], "cu130")
    assert caught.value.message == "cu130: resolution took over 10 minutes" and caught.value.exit_code == 3


def test_apt_simulates_in_the_base_with_extra_components(monkeypatch):
    seen = []
    monkeypatch.setattr(engine, "run_container", lambda image, command, **kw: seen.append((image, command, kw))
                        or (0, "Inst nvidia-cuda-toolkit (12.4.131~12.4.1-1 Debian:12.12/stable [amd64])\n"))
    code, out = apt.simulate("debian:bookworm-slim", ["nvidia-cuda-toolkit"], "contrib non-free")
    image, command, kw = seen[0]
    assert (code, image, kw) == (0, "debian:bookworm-slim", {"timeout": 300, "network": "host"})
    script = command[2]
    assert script.startswith("rm -f /etc/apt/apt.conf.d/docker-clean; sed -i -E ")
    assert r"s/^(Components: .*main)$/\1 contrib non-free/" in script
    assert script.endswith("apt-get install -s --no-install-recommends nvidia-cuda-toolkit")


def test_apt_without_components_changes_no_source_list(monkeypatch):
    seen = []
    monkeypatch.setattr(engine, "run_container", lambda image, command, **kw: seen.append(command) or (0, ""))
    apt.simulate("debian:bookworm-slim", ["python3.11", "g++"])
    assert "sed" not in seen[0][2] and seen[0][2].endswith("--no-install-recommends python3.11 g++")


def test_a_credential_helper_answers_quietly(runs, tmp_path):
    (tmp_path / "config.json").write_text('{"credsStore": "pass"}')
    asked = runs({"docker-credential-pass get": _ok('{"Username": "bob", "Secret": "tok-123"}')})
    assert registry.credentials("ghcr.io", tmp_path) == ("bob", "tok-123")
    assert asked[0][1]["input"] == "ghcr.io" and asked[0][1]["echo"] is False, "the answer is the secret: no echo"


def test_a_missing_credential_helper_means_no_credentials(runs, tmp_path):
    (tmp_path / "config.json").write_text('{"credsStore": "gone"}')
    runs({"docker-credential-gone": process.NotRunnable("cannot run docker-credential-gone: not found")})
    assert registry.credentials("ghcr.io", tmp_path) is None


@pytest.mark.parametrize("auth", ["not base64!", "bm9jb2xvbg==", "//79"])  # garbage; "nocolon"; not UTF-8
def test_a_docker_config_auth_that_is_not_base64_of_user_password_is_one_line(tmp_path, auth):
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"ghcr.io": {"auth": auth}}}))
    with pytest.raises(UserError) as err:
        registry.credentials("ghcr.io", tmp_path)
    assert "auths['ghcr.io'].auth is not base64 of user:password" in str(err.value) and "\n" not in str(err.value)
    assert "docker login ghcr.io" in str(err.value)


@pytest.mark.parametrize("text", ["{oops", "[]", '{"auths": 5, "credHelpers": []}'])
def test_a_docker_config_that_is_broken_or_the_wrong_shape(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    if text.startswith("{\""):
        assert registry.credentials("ghcr.io", tmp_path) is None, "wrong-shaped sections are no credentials"
        return
    with pytest.raises(UserError) as err:
        registry.credentials("ghcr.io", tmp_path)
    assert str(tmp_path / "config.json") in str(err.value)


@pytest.mark.parametrize("answer", ["hunter2-not-json", '["a"]', '{"Username": "u", "Secret": 5}'])
def test_a_credential_helper_answering_garbage_is_one_line_exit_3(runs, tmp_path, answer):
    (tmp_path / "config.json").write_text('{"credHelpers": {"ghcr.io": "pass"}}')
    runs({"docker-credential-pass get": _ok(answer)})
    with pytest.raises(EnvironmentProblem) as err:
        registry.credentials("ghcr.io", tmp_path)
    assert "docker-credential-pass answered" in str(err.value) and "hunter2" not in str(err.value)
    assert err.value.exit_code == 3


@pytest.mark.parametrize("answer, none", [
    (process.Result(1, "credentials not found in native keychain\n", "", ""), True),  # Docker's "no entry"
    (process.Result(1, "", "gpg: decryption failed: hunter2\n", ""), False),  # broken: before, silently none
    (process.TimedOut("`docker-credential-pass get` did not finish within 30 s and was stopped"), False),
], ids=["not-found", "exit-1", "hangs"])
def test_a_failing_credential_helper_is_one_line_exit_3_unless_it_has_no_entry(runs, tmp_path, answer, none):
    (tmp_path / "config.json").write_text('{"credHelpers": {"ghcr.io": "pass"}}')
    runs({"docker-credential-pass get": answer})
    if none:
        assert registry.credentials("ghcr.io", tmp_path) is None
        return
    with pytest.raises(EnvironmentProblem) as err:
        registry.credentials("ghcr.io", tmp_path)
    assert err.value.exit_code == 3 and "\n" not in str(err.value) and "hunter2" not in str(err.value)
    assert str(err.value).startswith("docker-credential-pass ") and "ghcr.io" in str(err.value)


def test_a_credential_helper_name_cannot_become_a_path(runs, tmp_path):
    (tmp_path / "config.json").write_text('{"credsStore": "../../tmp/evil"}')
    asked = runs({})
    with pytest.raises(UserError, match="is not a helper name"):
        registry.credentials("ghcr.io", tmp_path)
    assert asked == []


@pytest.mark.parametrize("make, needle", [
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),  # before: read_text() waited forever
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b"\xff\xfe{"), "is not JSON"),
    (lambda p: p.write_text("[" * 100_000), "is not JSON"),  # before: RecursionError
], ids=["fifo", "directory", "not-utf8", "deep"])
def test_a_docker_config_that_is_not_a_json_file_is_one_line_exit_2(tmp_path, make, needle):
    make(tmp_path / "config.json")
    with pytest.raises(UserError) as err:
        registry.credentials("ghcr.io", tmp_path)
    assert err.value.exit_code == 2 and needle in str(err.value) and "\n" not in str(err.value)
    assert "docker login ghcr.io" in str(err.value)


def test_no_home_directory_means_no_docker_config(monkeypatch):
    """HOME unset and a UID with no passwd entry (a container's arbitrary --user): before, a RuntimeError."""
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setattr("pwd.getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(f"getpwuid(): uid not found: {uid}")))
    assert registry.config_dir() is None
    assert registry.credentials("ghcr.io") is None
