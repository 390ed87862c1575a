"""The one process runner (builder/boundary/process.py): what it echoes, streams and hands back is masked, a
time-out or a missing program is one line with exit 3, and no child outlives the builder. Popen is replaced by
a scripted stand-in (a unit test starts no process); the real children are in
tests/integration/test_process_real.py."""

from __future__ import annotations

import io
import socket
import subprocess

import pytest

from builder import cli
from builder.boundary import buildkit, engine, process
from builder.errors import EnvironmentProblem, StepFailed
from tests.unit.conftest import ForbiddenInUnitTests

REAL_RUN_CLI = engine.run_cli  # taken before the autouse guard replaces it for every test
TOKEN = "s3cr3t-T0ken"
INDEX = f"https://user:{TOKEN}@index.example/simple"


class Child:
    """A scripted child: its output lines, its exit code, or a hang (TimeoutExpired) on wait/communicate."""

    def __init__(self, output: str = "", code: int = 0, err: str = "", hangs: bool = False,
                 interrupt: bool = False):
        self.output, self.code, self.err, self.hangs, self.interrupt = output, code, err, hangs, interrupt
        self.started: list[dict] = []
        self.killed = False

    def __call__(self, argv, **popen):
        self.started.append({"argv": argv, **popen})
        self.popen = popen
        self.stdout = io.StringIO(self.output) if not popen.get("stdout") or popen.get("text") else None
        self.stdin = io.StringIO()
        self.returncode = None
        return self

    def _end(self, timeout):
        if self.interrupt:
            raise KeyboardInterrupt
        if self.hangs and not self.killed:
            raise subprocess.TimeoutExpired("x", timeout)
        self.returncode = -9 if self.killed else self.code
        return self.returncode

    def communicate(self, input=None, timeout=None):
        self.stdin.write(input or "")
        self._end(timeout)
        return self.output, self.err

    def wait(self, timeout=None):
        return self._end(timeout)

    def kill(self):
        self.killed = True


@pytest.fixture
def child(monkeypatch):
    def make(**script) -> Child:
        fake = Child(**script)
        monkeypatch.setattr(subprocess, "Popen", fake)
        return fake

    return make


def test_the_echoed_command_line_masks_secret_values_and_url_credentials(child, capsys):
    child()
    result = process.run(["tool", "--password", "hunter2-pw", "--index-url", INDEX], timeout=5,
                         secrets=["hunter2-pw"])
    err = capsys.readouterr().err
    assert err == "+ tool --password **** --index-url https://****@index.example/simple\n"
    assert result.shown == "tool --password **** --index-url https://****@index.example/simple"
    assert "hunter2" not in result.shown and TOKEN not in result.shown


def test_captured_output_hides_the_secrets_and_keeps_data_intact(child):
    """The output may be data (a compiled lock, a file from git): secret values go, the URL patterns don't apply
    (they would turn `pykey==1.0` into `pykey=****`)."""
    child(output=f"pykey==1.0\nsorted(x, key=lambda v: v)\nuser {TOKEN}\n", err=f"warning: {TOKEN}\n")
    result = process.run(["uv", "pip", "compile", "-"], timeout=5, secrets=[TOKEN])
    assert result.stdout == "pykey==1.0\nsorted(x, key=lambda v: v)\nuser ****\n"
    assert result.stderr == "warning: ****\n"


def test_streamed_lines_are_masked_as_they_reach_the_log(child, capsys):
    """The secret is the whole PIP_INDEX_URL; its token alone is masked too, wherever a tool prints it."""
    child(output=f"#5 Looking in indexes: {INDEX}\n#5 token={TOKEN}\n#6 done\n")
    result = process.run(["docker", "build", "."], timeout=5, stream=True, secrets=[INDEX])
    err = capsys.readouterr().err
    assert TOKEN not in err and TOKEN not in result.stdout
    assert "  #5 Looking in indexes: ****\n" in err and "  #5 token=****\n" in err and "  #6 done\n" in err
    assert result.stdout.splitlines()[2] == "#6 done", "the whole output comes back, in order"


def test_streaming_merges_stderr_and_a_failure_is_returned_not_raised(child):
    fake = child(output="step 1\nERROR: boom\n", code=1)
    result = process.run(["docker", "build", "."], timeout=5, stream=True)
    assert fake.popen["stderr"] is subprocess.STDOUT
    assert (result.returncode, result.stdout, result.stderr) == (1, "step 1\nERROR: boom\n", "")


def test_input_env_and_cwd_reach_the_child(child, tmp_path):
    fake = child()
    process.run(["docker", "login", "--password-stdin"], timeout=5, input="pw\n", env={"A": "1"}, cwd=tmp_path)
    assert fake.stdin.getvalue() == "pw\n"
    assert fake.popen["env"] == {"A": "1"} and fake.popen["cwd"] == tmp_path
    assert fake.popen["stdin"] is subprocess.PIPE


def test_no_input_means_no_terminal_to_wait_on(child):
    fake = child()
    process.run(["git", "status"], timeout=5, echo=False)
    assert fake.popen["stdin"] is subprocess.DEVNULL


@pytest.mark.parametrize("stream", [False, True], ids=["captured", "streamed"])
def test_a_time_out_kills_the_child_and_is_exit_3_in_one_line(child, stream):
    fake = child(hangs=True)
    with pytest.raises(process.TimedOut) as caught:
        process.run(["docker", "push", INDEX], timeout=7, stream=stream)
    assert fake.killed
    assert caught.value.exit_code == 3 and "\n" not in caught.value.message
    assert caught.value.message == "`docker push https://****@index.example/simple` did not finish within 7 s " \
                                   "and was stopped"


def test_ctrl_c_while_a_command_runs_kills_it(child):
    fake = child(interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        process.run(["docker", "build", "."], timeout=None, stream=True)
    assert fake.killed


@pytest.mark.parametrize("error", [FileNotFoundError(2, "No such file or directory"),
                                   PermissionError(13, "Permission denied")], ids=["missing", "not-executable"])
def test_a_program_that_cannot_run_is_exit_3_naming_it(monkeypatch, error):
    def popen(argv, **_kwargs):
        raise error

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(process.NotRunnable) as caught:
        process.run(["docker-credential-nope", "get"], timeout=5)
    assert caught.value.exit_code == 3
    assert caught.value.message == f"cannot run docker-credential-nope: {error.strerror}"
    assert "PATH" in caught.value.hint


def test_a_missing_program_through_the_cli_is_exit_3_without_a_traceback(monkeypatch, project, capsys):
    """`resolve` with uv gone from the venv: one line, exit 3, what to do."""
    def popen(argv, **_kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr("builder.boundary.uv.binary", lambda: "/gone/uv")
    assert cli.main(["resolve", "cu130-torch2.13-bookworm"]) == 3
    err = capsys.readouterr().err
    assert "cannot run /gone/uv: No such file or directory" in err and "Traceback" not in err


def test_a_pipe_hands_back_exit_code_and_masked_stderr(monkeypatch):
    class Proc:
        stdout = io.BytesIO(b"tar bytes")
        stderr = io.BytesIO(f"denied for {TOKEN}\n".encode())

        def wait(self):
            return 1

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: started.append((argv, kw)) or Proc())
    pipe = process.pipe(["docker", "save", "x"], secrets=[TOKEN])
    assert pipe.stdout.read() == b"tar bytes"
    assert pipe.finish() == (1, "denied for ****\n")
    assert started[0][1]["stderr"] is subprocess.PIPE and "text" not in started[0][1], "bytes, not text"


# --- the build: a private index token never reaches the log, the report or the command shown --------------


def test_a_private_index_token_is_masked_while_the_build_streams(child, monkeypatch, capsys, tmp_path):
    from builder.model.inputs import Inputs
    from tests.unit.test_build_unit import _spec

    monkeypatch.setenv("PIP_INDEX_URL", INDEX)
    monkeypatch.delenv("PIP_CERT", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    monkeypatch.setattr(engine, "run_cli", REAL_RUN_CLI)
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    child(output=f"#7 0.5 Looking in indexes: {INDEX}\n#7 1.0 pip says {TOKEN}\n", code=1)
    inputs = Inputs().resolved()  # takes PIP_INDEX_URL from the environment, as a build does
    code, output, shown = buildkit.run(_spec(tmp_path), {"io.train-images.tag": "t"}, inputs)
    log = capsys.readouterr().err
    assert code == 1 and "#7 1.0 pip says ****" in output and "pip says ****" in log
    for text in (log, output, shown):
        assert TOKEN not in text


def test_docker_login_never_shows_the_password(child, monkeypatch, capsys):
    from builder.steps import publish

    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    monkeypatch.setattr(engine, "run_cli", REAL_RUN_CLI)
    fake = child(code=1, err="Error response from daemon: login attempt with password pw-S3cret failed\n")
    options = publish.Options(registry="127.0.0.1:5000", username="bob", password_stdin=True, password="pw-S3cret")
    with pytest.raises(StepFailed) as caught:
        with publish.docker_config(options, "127.0.0.1:5000"):
            pass
    assert fake.stdin.getvalue() == "pw-S3cret", "the password goes in on stdin, never in argv"
    assert "pw-S3cret" not in " ".join(fake.started[0]["argv"])
    assert "pw-S3cret" not in caught.value.message + capsys.readouterr().err
    assert "login attempt with password **** failed" in caught.value.message


# --- the guard itself ------------------------------------------------------------------------------------


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(ForbiddenInUnitTests) as caught:
        subprocess.run(["git", "status"])
    assert str(caught.value).startswith("a unit test tried to start a process ['git', 'status']: stub the boundary")
    assert str(caught.value).endswith("or move the test to tests/integration/")


def test_a_unit_test_cannot_reach_the_network():
    with pytest.raises(ForbiddenInUnitTests, match="network"):
        socket.create_connection(("127.0.0.1", 9))
    with socket.socket() as s, pytest.raises(ForbiddenInUnitTests, match="move the test to tests/integration/"):
        s.connect(("127.0.0.1", 9))


def test_a_unit_test_cannot_exec_or_fork():
    import os

    for call in (lambda: os.system("true"), lambda: os.execv("/bin/true", ["true"]), os.fork):
        with pytest.raises(ForbiddenInUnitTests):
            call()


def test_environment_problems_from_the_runner_are_the_projects_family():
    assert issubclass(process.TimedOut, EnvironmentProblem) and issubclass(process.NotRunnable, EnvironmentProblem)
