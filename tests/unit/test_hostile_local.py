"""Hostile local files and environment (issue 23): what the image's gate wrote, the Docker config and its
credential helper, no home directory. Each case: one `error:` line (or a failed check naming the file), the
right exit code, no traceback, and nothing from outside reaching a report."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from builder.boundary import engine, gate, host, inspect
from tests.conftest import run_cli

CANARY = "host-canary-7f3a9"
TAG = "cu130-torch2.13-bookworm"
VERDICT = {"passed": True, "mode": "cpu", "seconds": 20.0, "checks": [{"name": "env", "passed": True}]}
CHECK = {"name": "env", "passed": True, "mode": "cpu", "seconds": 1.0, "summary": "ok", "diagnosis": [],
         "figures": {}, "items": []}


# --- 1. the gate's output directory is the image's to write: read it as hostile -------------------------------


def _host_file(tmp_path: Path, data: dict) -> Path:
    """A host file outside the gate's directory that would pass the schema: what a link would smuggle in."""
    target = tmp_path / "host-secret.json"
    target.write_text(json.dumps(data | {"summary": CANARY}))
    return target


def _all_is_a_link(out: Path, tmp: Path) -> None:
    (out / "all.json").symlink_to(_host_file(tmp, VERDICT))


def _check_is_a_link(out: Path, tmp: Path) -> None:
    (out / "all.json").write_text(json.dumps(VERDICT))
    (out / "env.json").symlink_to(_host_file(tmp, CHECK))


def _check_is_a_fifo(out: Path, tmp: Path) -> None:
    (out / "all.json").write_text(json.dumps(VERDICT))
    os.mkfifo(out / "env.json")  # before: read_text() waited for a writer forever


def _check_is_huge(out: Path, tmp: Path) -> None:
    (out / "all.json").write_text(json.dumps(VERDICT))
    with open(out / "env.json", "wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB, sparse: before, read whole into memory


def _all_is_a_device(out: Path, tmp: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(out / "all.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: endless


@pytest.mark.parametrize("plant, needle", [
    (_all_is_a_link, "all.json: is a symbolic link; not followed"),
    (_check_is_a_link, "env.json: is a symbolic link; not followed"),
    (_check_is_a_fifo, "env.json: is a FIFO, not a regular file"),
    (_check_is_huge, "env.json: 2147483648 bytes is too large"),
    (_all_is_a_device, "all.json: is a device, not a regular file"),
], ids=["all-link", "check-link", "fifo", "huge", "device"])
def test_gate_output_is_read_as_regular_files_only(project, capsys, monkeypatch, tmp_path_factory, plant, needle):
    outside = tmp_path_factory.mktemp("host")

    def container(image, command, volumes, **_kw):
        plant(Path(next(iter(volumes))), outside)
        return 0, "✓ env [cpu] ok\n"

    monkeypatch.setattr(engine, "sdk", lambda: type("Sdk", (), {"info": lambda self: {}})())
    monkeypatch.setattr(engine, "image_or_none", lambda ref: type("Image", (), {"id": "sha256:" + "1" * 64, "labels": {}})())
    monkeypatch.setattr(engine, "run_container", container)
    assert run_cli("smoke", TAG, "--cpu", "--image", "train:x") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and CANARY not in err
    assert len([line for line in err.splitlines() if line.startswith("error: ")]) == 1
    assert f"the smoke gate failed: gate: the gate's output is unusable: {needle}" in err
    report = (project / f"build/reports/{TAG}.smoke.json").read_text()
    assert CANARY not in report and json.loads(report)["passed"] is False


def test_verify_json_never_carries_a_linked_host_file(project, capsys, monkeypatch, tmp_path_factory):
    """The same gate on a pulled image (`verify`): its verdict file must not carry the host file either."""
    outside = tmp_path_factory.mktemp("host")

    def container(image, command, volumes, **_kw):
        _check_is_a_link(Path(next(iter(volumes))), outside)
        return 0, ""

    monkeypatch.setattr(engine, "sdk", lambda: type("Sdk", (), {"info": lambda self: {"Runtimes": {}}})())
    monkeypatch.setattr(engine, "image_or_none",
                        lambda ref: type("Image", (), {"id": "sha256:" + "1" * 64, "attrs": {}, "labels": {}})())
    monkeypatch.setattr(engine, "run_container", container)
    monkeypatch.setattr(inspect, "read_facts", lambda image: {"tag": TAG, "min_driver": "525"})
    monkeypatch.setattr(host, "gpus", lambda: ([], "no nvidia-smi"))
    assert run_cli("verify", "train:x", "--no-pull", "--cpu", "--json", "verdict.json") == 1
    err = capsys.readouterr().err
    verdict = (project / "verdict.json").read_text()
    assert CANARY not in verdict + err and "Traceback" not in err
    assert "env.json: is a symbolic link; not followed" in verdict and json.loads(verdict)["passed"] is False


def test_gate_output_read_directly_refuses_a_link_even_to_a_valid_result(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _all_is_a_link(out, tmp_path)
    result, per_check, broken = gate.read_gate_output(out)
    assert result is None and per_check == {} and "symbolic link" in broken and CANARY not in broken


# --- 3. no home directory (an arbitrary UID with no passwd entry and no HOME) ---------------------------------


def test_login_without_any_home_directory_is_one_line_exit_3(project, capsys, monkeypatch):
    """`docker run --user 12345` of a CI image: HOME unset and getpwuid fails. Before, pathlib's RuntimeError
    came out as a traceback. Simulated at the pwd boundary: a real setuid child cannot import the interpreter
    here (it lives under root's 0700 home)."""
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setattr("pwd.getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(f"getpwuid(): uid not found: {uid}")))
    monkeypatch.setattr("sys.stdin", io.StringIO("hunter2\n"))
    before = sorted(p.name for p in project.iterdir())
    assert run_cli("login", "--registry", "127.0.0.1:5000", "--username", "u", "--password-stdin") == 3
    err = capsys.readouterr().err
    assert err.startswith("error: no home directory to keep the Docker config in") and "Traceback" not in err
    assert "DOCKER_CONFIG" in err and "hunter2" not in err
    assert sorted(p.name for p in project.iterdir()) == before


# --- 6. matrix YAML: anchors that reach themselves, entries written as strings (already refused: the proof) ---------


@pytest.mark.parametrize("text, needle", [
    ("defaults: &a\n  image: x/y\n  <<: *a\nentries: []\n", "matrix.yaml: line 3: alias *a is used inside &a itself"),
    ("defaults: &a\n  image: x/y\n  more: [*a]\nentries: []\n", "matrix.yaml: line 3: alias *a is used inside &a"),
    ("x: &a [*a]\ndefaults:\n  image: x/y\nentries: []\n", "matrix.yaml: line 1: alias *a is used inside &a"),
    ("defaults:\n  image: x/y\nentries: [cu121-torch2.3]\n", "matrix.yaml:3: entries[0]: expected a mapping, got str"),
    ('defaults:\n  image: x/y\nentries:\n  - "foo"\n', "matrix.yaml:4: entries[0]: expected a mapping, got str"),
], ids=["merge-self", "alias-in-own-list", "recursive-sequence", "flow-string", "quoted-string"])
def test_self_referencing_anchors_and_string_entries_name_their_line(project, capsys, text, needle):
    (project / "matrix.yaml").write_text(text)
    assert run_cli("validate") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {needle}") and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error: ")]) == 1
