"""Faults of the machine, without an engine: the engine going away, a full disk, in a build's output,
in `docker save`, in the files the builder writes. Each is exit 3 with one line naming it and a hint; nothing
half-written is left. The real faults, against a private engine: tests/integration/test_faults_engine.py."""

from __future__ import annotations

import errno
import io
import json

import pytest

from builder import fsutil, reports, runner
from builder.boundary import buildkit, engine, imagesave, process
from builder.errors import EnvironmentProblem, UserError
from builder.model import manifest, matrix
from builder.steps import Done
from tests.unit.test_manifest import LOWER, fake_save

RUN_LINES = "#5 [2/2] RUN sleep 20\n#5 sha256:9777e3b75f\n#5 0.081 started\n"
ENGINE_GONE = {
    "unexpected EOF": RUN_LINES + "unexpected EOF\n",
    "EOF": RUN_LINES + "EOF\n",
    "buildx": RUN_LINES + "ERROR: failed to solve: rpc error: code = Unavailable desc = error reading from server: EOF\n",
    # buildx 0.13 (Debian 13) against a dockerd stopped with SIGTERM mid-RUN:
    "buildx 0.13": RUN_LINES + "ERROR: failed to solve: Unavailable: error reading from server: EOF\n",
    "buildx 0.29": RUN_LINES + "ERROR: failed to build: failed to solve: Unavailable: error reading from server: EOF\n",
    "cannot connect": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
                      "running?\n",
    "error during connect": "error during connect: Post \"http://%2Fvar%2Frun%2Fdocker.sock/v1.41/build\": EOF\n",
    "reset": RUN_LINES + "read unix @->/var/run/docker.sock: read: connection reset by peer\n",
    "refused": "dial unix /tmp/x/d.sock: connect: connection refused\n",
    "transport closing": RUN_LINES + "rpc error: code = Unavailable desc = transport is closing\n",
}


@pytest.mark.parametrize("output", ENGINE_GONE.values(), ids=ENGINE_GONE.keys())
def test_the_engine_going_away_is_environmental(output, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/own.sock")
    message, hint, environmental = buildkit.explain_failure(output)
    assert environmental, message
    assert message.startswith("the Docker engine at unix:///tmp/own.sock stopped answering during the build (")
    assert "\n" not in message and "restart" in hint and "re-run" in hint


NOT_THE_ENGINE = {
    # A RUN step's own output (`#N seconds text`) is the build's business, whatever it says.
    "pip download cut short": RUN_LINES + "#5 3.2 unexpected EOF\n#5 3.2 EOF\n"
                              "#5 ERROR: executor failed running [/bin/sh -c pip download x]: exit code: 1\n"
                              "executor failed running [/bin/sh -c pip download x]: exit code: 1\n",
    "reset inside the build": RUN_LINES + "#5 9.1 ConnectionResetError: [Errno 104] connection reset by peer\n"
                              "executor failed running [/bin/sh -c pip install x]: exit code: 1\n",
    "a heredoc": "executor failed running [/bin/sh -c cat <<EOF > /x\nEOF]: exit code: 2\n",
}


@pytest.mark.parametrize("output", NOT_THE_ENGINE.values(), ids=NOT_THE_ENGINE.keys())
def test_eof_inside_a_step_is_not_the_engine(output):
    message, _, environmental = buildkit.explain_failure(output)
    assert not environmental and "stopped answering" not in message


DISK_FULL = {
    # A RUN step prints strerror's capitalised words; the engine its own lower-case ones.
    "in a RUN": ("#5 1.486 head: error writing 'standard output': No space left on device\n"
                 "#5 ERROR: executor failed running [/bin/sh -c head -c 2G /dev/zero > /big]: exit code: 1\n",
                 "head: error writing 'standard output': No space left on device"),
    "in the export": ("#6 exporting layers 0.3s done\n#6 ERROR: write /var/lib/docker/image/overlay2/layerdb/tmp/"
                      "write-set-1/cache-id: no space left on device\n",
                      "write /var/lib/docker/image/overlay2/layerdb/tmp/write-set-1/cache-id: no space left on device"),
    "and the engine died of it": ("#5 0.5 cp: error writing '/x': No space left on device\nunexpected EOF\n",
                                  "cp: error writing '/x': No space left on device"),
    "quota": ("#5 0.5 tar: /x: Disk quota exceeded\n", "tar: /x: Disk quota exceeded"),
}


@pytest.mark.parametrize("output, shown", DISK_FULL.values(), ids=DISK_FULL.keys())
def test_a_full_disk_is_environmental_and_says_where(output, shown):
    message, hint, environmental = buildkit.explain_failure(output)
    assert environmental
    assert message == f"the disk is full ({shown})"
    assert "DockerRootDir" in hint and "prune" in hint


def test_the_sdk_losing_the_engine_is_exit_3(monkeypatch):
    from requests.exceptions import ConnectionError as RequestsConnectionError

    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/own.sock")
    with pytest.raises(EnvironmentProblem) as caught:
        with engine.answering("after the build"):
            raise RequestsConnectionError("('Connection aborted.', ConnectionResetError(104, 'reset by peer'))")
    assert caught.value.exit_code == 3
    assert caught.value.message.startswith("the Docker engine at unix:///tmp/own.sock stopped answering after the build")
    assert "restart" in caught.value.hint


def test_engine_address_follows_docker_host(monkeypatch):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engine.address() == "unix:///var/run/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/own.sock")
    assert engine.address() == "unix:///tmp/own.sock"


# --- files the builder writes ----------------------------------------------------------------------------

def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_report_on_a_full_disk_is_exit_3_and_the_old_one_stays(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_REPORTS", str(tmp_path))
    reports.write("t", "build", {"result": "built", "input_hash": "a" * 64, "duration_s": 1.0,
                                 "image_id": "sha256:" + "1" * 64})
    old = (tmp_path / "t.build.json").read_bytes()
    monkeypatch.setattr(fsutil.os, "replace", _no_space)  # the temp file was written, the rename fails
    with pytest.raises(EnvironmentProblem) as caught:
        reports.write("t", "build", {"result": "failed", "error": "x", "input_hash": "a" * 64, "duration_s": 1.0})
    assert caught.value.message == f"the disk is full: cannot write {tmp_path / 't.build.json'} (No space left on device)"
    assert (tmp_path / "t.build.json").read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["t.build.json"], "a temp file was left behind"


@pytest.fixture
def entries(project):
    return list(matrix.load(project / "matrix.yaml").entries)


def test_a_full_disk_in_any_step_is_exit_3(entries):
    def step(entry):
        if entry is entries[0]:
            raise OSError(errno.ENOSPC, "No space left on device", "build/context/x/Dockerfile")
        return Done("built", "fine")

    outcomes = runner.run("build", entries, step)
    assert [o.result for o in outcomes] == ["failed", "built"]
    assert isinstance(outcomes[0].error, EnvironmentProblem)
    assert "the disk is full: cannot write build/context/x/Dockerfile" in outcomes[0].detail
    assert runner.exit_code(outcomes) == 3


def test_other_os_errors_are_not_hidden(entries):
    def step(entry):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError):
        runner.run("build", entries, step)


# --- docker save (manifest's export) ---------------------------------------------------------------------

class _Saved:
    """What the one runner (process.pipe) hands over for `docker save`: its stdout, then its exit and stderr."""

    def __init__(self, stdout: bytes, code: int, stderr: str):
        self.stdout, self.code, self.stderr = io.BytesIO(stdout), code, stderr

    def finish(self) -> tuple[int, str]:
        return self.code, self.stderr

    def stop(self) -> None:
        pass


def _fake_docker_save(monkeypatch, code: int, stderr: str = "", stdout: bytes = b""):
    """`docker save` replaced at the process boundary: it writes `stdout`, then `stderr`, and exits with `code`."""
    asked = []

    def pipe(argv, **_kwargs):
        asked.append(list(argv))
        return _Saved(stdout, code, stderr)

    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    monkeypatch.setattr(process, "pipe", pipe)
    monkeypatch.setattr(imagesave, "image_id", lambda image: "sha256:" + "2" * 64)
    return asked


def test_docker_save_on_a_full_disk_is_exit_3_not_a_bad_archive(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    asked = _fake_docker_save(monkeypatch, 1, "Error response from daemon: mkdir /var/lib/docker/tmp/"
                                              "docker-export-1: no space left on device\n")
    with pytest.raises(EnvironmentProblem) as caught:
        imagesave.manifest("example/img:1")
    assert asked == [["/usr/bin/docker", "save", "sha256:" + "2" * 64]], "the image ID is saved, not the name"
    assert caught.value.message.startswith("`docker save example/img:1` failed: the disk is full (")
    assert "DockerRootDir" in caught.value.hint
    assert not (tmp_path / "build").exists(), "nothing cached from a failed export"


def test_docker_save_cut_off_by_the_engine_going_away(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    half = fake_save([LOWER])[:3000]
    _fake_docker_save(monkeypatch, 1, "unexpected EOF\n", half)
    with pytest.raises(EnvironmentProblem, match="stopped answering"):
        imagesave.manifest("example/img:1")


def test_a_failed_save_that_names_no_known_cause_is_exit_3_with_its_last_line(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _fake_docker_save(monkeypatch, 1, "some progress\nError response from daemon: reference does not exist\n")
    with pytest.raises(EnvironmentProblem) as caught:
        imagesave.manifest("example/img:1")
    assert caught.value.message == ("`docker save example/img:1` failed: Error response from daemon: reference "
                                    "does not exist")


def test_a_bad_archive_from_a_save_that_succeeded_stays_a_user_error(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _fake_docker_save(monkeypatch, 0, "", b"x" * 1024 + b"\0" * 1024)
    with pytest.raises(UserError):
        imagesave.manifest("example/img:1")


def test_a_full_disk_for_the_manifest_cache_only_warns(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    _fake_docker_save(monkeypatch, 0, "", fake_save([LOWER]))
    monkeypatch.setattr(fsutil, "write_atomic", _no_space)
    result = imagesave.manifest("example/img:1")
    assert result["files"]["bin/tool"]["type"] == "file"
    assert "warning: the manifest cache" in capsys.readouterr().err


def test_manifest_output_on_a_full_disk_is_exit_3(monkeypatch, tmp_path, capsys):
    from builder import cli

    archive = tmp_path / "img.tar"
    archive.write_bytes(fake_save([LOWER]))
    out = tmp_path / "out" / "m.json"
    out.parent.mkdir()
    real_replace = fsutil.os.replace
    monkeypatch.setattr(fsutil.os, "replace", _no_space)
    assert cli.main(["manifest", str(archive), "-o", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"error: the disk is full: cannot write {out} (No space left on device)" in err
    assert list(out.parent.iterdir()) == []
    monkeypatch.setattr(fsutil.os, "replace", real_replace)
    assert cli.main(["manifest", str(archive), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["files"]


# --- repro's rebuild ------------------------------------------------------------------------------------

@pytest.mark.parametrize("output, kind", [
    ("#5 0.4 head: error writing '/big': No space left on device\n", EnvironmentProblem),
    ("#5 0.4 started\nunexpected EOF\n", EnvironmentProblem),
    ("#5 0.4 E: Unable to locate package nope\nexecutor failed running [x]: exit code: 100\n", None),
])
def test_a_repro_rebuild_failing_for_the_machine_is_exit_3(entries, tmp_path, monkeypatch, output, kind):
    from types import SimpleNamespace

    from builder.errors import StepFailed
    from builder.steps import repro

    (tmp_path / "image.json").write_text("{}")
    existing = SimpleNamespace(id="sha256:" + "3" * 64, labels={f"{buildkit.LABEL_PREFIX}.input-hash": "h"})
    monkeypatch.setattr(engine, "image_or_none", lambda ref: existing)
    monkeypatch.setattr(repro.context, "stage", lambda entry, inputs, root: tmp_path)
    monkeypatch.setattr(buildkit, "spec", lambda entry, inputs, **kw: SimpleNamespace(ref="x:t-repro"))
    monkeypatch.setattr(buildkit, "input_hash", lambda spec: "h")
    monkeypatch.setattr(buildkit, "labels", lambda spec, facts, digest: {})
    monkeypatch.setattr(buildkit, "run", lambda spec, labels, ca: (1, output, "docker build …"))
    with pytest.raises(kind or StepFailed) as caught:
        repro.rebuild(entries[0], repro.Options())
    assert type(caught.value) is (kind or StepFailed)
    assert "the repro build failed" in caught.value.message


@pytest.mark.parametrize("damage", [
    lambda m: {k: v for k, v in m.items() if k != "totals"},  # the KeyError: 'totals' of a hostile report
    lambda m: {**m, "totals": "many"},
    lambda m: {**m, "files": {"bin/tool": "file"}},
    lambda m: {**m, "python_packages": [{"name": 1}]},
    lambda m: {**m, "format": 0},  # an older builder's entry
    lambda m: [m],
], ids=["no-totals", "totals-text", "file-text", "package-name-int", "other-format", "a-list"])
def test_a_damaged_manifest_cache_entry_is_rebuilt_not_half_trusted(monkeypatch, tmp_path, capsys, damage):
    monkeypatch.chdir(tmp_path)
    asked = _fake_docker_save(monkeypatch, 0, "", fake_save([LOWER]))
    first = imagesave.manifest("example/img:1")
    (cached,) = (tmp_path / imagesave.CACHE_DIR).glob("*.json")
    again = imagesave.manifest("example/img:1")
    assert again["stats"]["cached"] and len(asked) == 1, "a whole entry is read back without a second save"
    cached.write_text(json.dumps(damage(json.loads(cached.read_text()))))
    rebuilt = imagesave.manifest("example/img:1")
    assert not rebuilt["stats"]["cached"] and len(asked) == 2
    assert rebuilt["totals"] == first["totals"] and rebuilt["files"] == first["files"]
    assert "is not a whole manifest of this image: rebuilt" in capsys.readouterr().err
    assert manifest.well_formed(json.loads(cached.read_text())), "the rebuilt entry replaced the damaged one"
