"""A hostile or broken Docker engine (tests/integration/fake_engine.py: the Engine API on a unix socket, with
DOCKER_HOST pointed at it) and odd DOCKER_HOST values, against the builder's real verbs run as a user runs
them (`python -m builder`). No real engine, no image.

Every case ends in one `error:` line with the right exit code (1 a step refused, 3 the machine's engine is
wrong), no traceback, bounded memory, and nothing the engine sent reaches the terminal as a control
character.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.fake_engine import IMAGE_ID, INFO, VERSION, FakeEngine, endless, image, with_facts
from tests.integration.images import CI_TAG
from tests.integration.second_engine import project

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what a terminal acts on; newline and tab are text
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m\r"
FACTS = json.loads((ROOT / "dockerfiles" / CI_TAG / "image.json").read_text())


@pytest.fixture
def fake(tmp_path):
    started = []

    def start(answers: dict) -> FakeEngine:
        started.append(FakeEngine(tmp_path, answers))
        return started[-1]

    yield start
    for engine in started:
        engine.close()


def builder(host: str, *args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCKER_HOST=host, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)
    for name in ("BUILDER_REPORTS", "BUILDER_MATRIX", "GITHUB_ACTIONS"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def one_error(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """Exactly one error line naming `words`, exit `code`, no traceback, no control character printed."""
    text = proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    print(proc.stderr[-2000:])  # shown with `pytest -rP`: what the user reads
    assert proc.returncode == code and len(errors) == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert not CONTROL.search(text.replace("\n", "").replace("\t", "")), repr(text[-3000:])
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def huge(h) -> None:
    """A length of 16 GiB, announced; a reader that believes it runs out of memory."""
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(16 << 30))
    h.end_headers()


# --- the first answer: GET /version --------------------------------------------------------------------

VERSIONS = {
    "unparsable-version": ({**VERSION, "Version": "banana"}, "version 'banana'"),
    "unparsable-api-version": ({**VERSION, "ApiVersion": "x.y"}, "API version 'x.y'"),
    "not-json": (b"<html>gateway</html>", "no Docker engine answers"),
    "a-list": ([VERSION], "a JSON list, not an object"),
    "missing-keys": ({"Os": "linux"}, "no usable version"),
    "escapes": ({**VERSION, "Version": ESCAPES}, "no usable version"),
    "huge": (huge, "more than 64 MiB"),
    "endless": (endless, "more than 64 MiB"),
}


@pytest.mark.parametrize("answer, words", list(VERSIONS.values()), ids=list(VERSIONS))
def test_a_bad_version_answer_is_one_line_exit_3(fake, tmp_path, answer, words):
    engine = fake({"/version": answer})
    one_error(builder(engine.host, "verify", "x/y:z", "--no-pull", cwd=tmp_path), 3, words)


VERBS = {
    "build": ("build", CI_TAG, "--local-base"),
    "smoke": ("smoke", CI_TAG, "--cpu"),
    "publish": ("publish", CI_TAG, "--dry-run", "--registry", "127.0.0.1:5000/acme"),
    "manifest": ("manifest", "ghcr.io/train-images/train:x"),
    "audit": ("audit", CI_TAG),
}


@pytest.mark.parametrize("argv", list(VERBS.values()), ids=list(VERBS))
def test_every_verb_that_talks_to_the_engine_stops_at_its_first_answer(fake, tmp_path, argv):
    engine = fake({"/version": {**VERSION, "Version": "not.a.version"}})
    cwd = project(tmp_path / "checkout", "FROM scratch\n")
    one_error(builder(engine.host, *argv, cwd=cwd), 3, "no usable version")
    assert engine.seen == ["GET /version"]  # nothing else was asked of (or believed from) that engine


# --- answers after the version: /info, image inspection, copies out of the image ----------------------

SHAPES = {
    "info-a-list": ({"/info": [INFO]}, ("smoke", CI_TAG, "--cpu"), "GET /info"),
    "info-runtimes-a-list": ({"/info": {**INFO, "Runtimes": ["nvidia"]}}, ("smoke", CI_TAG, "--cpu"), "GET /info"),
    "image-a-list": ({"/images/*/json": [image({})]}, ("verify", "x/y:z", "--no-pull"), "not an image"),
    "image-without-id": ({"/images/*/json": {"Config": {}}}, ("verify", "x/y:z", "--no-pull"), "not an image"),
    "image-labels-a-list": ({"/images/*/json": {**image({}), "Config": {"Labels": ["a=b"]}}},
                            ("verify", "x/y:z", "--no-pull"), "not an image"),
    "image-not-json": ({"/images/*/json": b"{'Id':"}, ("verify", "x/y:z", "--no-pull"), "not JSON"),
    "image-endless": ({"/images/*/json": endless}, ("verify", "x/y:z", "--no-pull"), "more than 64 MiB"),
}


@pytest.mark.parametrize("answers, argv, words", list(SHAPES.values()), ids=list(SHAPES))
def test_a_wrong_shaped_answer_is_one_line_exit_3(fake, tmp_path, answers, argv, words):
    engine = fake(answers)
    cwd = project(tmp_path / "checkout", "FROM scratch\n")
    one_error(builder(engine.host, *argv, cwd=cwd), 3, words)


def test_an_endless_copy_out_of_the_image_is_bounded(fake, tmp_path):
    engine = fake(with_facts(FACTS, **{"/images/*/json": image({}), "/containers/c0ffee/archive": endless}))
    one_error(builder(engine.host, "verify", "x/y:z", "--no-pull", cwd=tmp_path), 1, "no readable")


# --- forged labels: the image is not the one its name says ----------------------------------------------

HONEST = {"io.train-images.tag": CI_TAG, "io.train-images.base.substituted": "false",
          **{f"io.train-images.pin.{name}": version or "none" for name, version in FACTS["pins"].items()}}
TORCH = "io.train-images.pin.torch"
HASH = "1" * 64  # the input hash of the build report and of the image's label
LOCK = b"torch==2.13.0\n"  # the checkout's lock, and the one inside the image
FORGED = {
    "tag": ({"io.train-images.tag": "cu999-other"}, FACTS, "tag: the image's label says 'cu999-other'"),
    "pin": ({TORCH: "9.9.9"}, FACTS, "pin torch: the image's label"),
    "input-hash": ({"io.train-images.input-hash": "2" * 64}, FACTS, "input hash"),
    "facts-tag": ({}, {**FACTS, "tag": "cu999-other"}, "tag: the image's facts say 'cu999-other'"),
}


def _gated_checkout(tmp_path: Path) -> Path:
    """A checkout whose reports say the fake engine's image was built here and passed its gate."""
    cwd = project(tmp_path / "checkout", "FROM scratch\n")
    reports = cwd / "build" / "reports"
    reports.mkdir(parents=True)
    common = {"tag": CI_TAG, "image": "x", "image_id": IMAGE_ID, "finished_at": "2026-12-01T00:00:00Z"}
    (reports / f"{CI_TAG}.smoke.json").write_text(json.dumps(
        {**common, "step": "smoke", "passed": True, "mode": "gpu", "level": {"kind": "gpu"}, "checks": []}))
    (cwd / "locks" / CI_TAG).mkdir(parents=True)
    (cwd / "locks" / CI_TAG / "python.lock").write_bytes(LOCK)
    (reports / f"{CI_TAG}.build.json").write_text(json.dumps(
        {**common, "step": "build", "result": "built", "duration_s": 1.0, "input_hash": HASH}))
    return cwd


def _publish(engine: FakeEngine, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return builder(engine.host, "publish", CI_TAG, "--dry-run", "--registry", "127.0.0.1:5000/acme", cwd=cwd, **env)


def _image_answers(facts: dict, **labels: str) -> dict:
    return with_facts(facts, {"python.lock": LOCK}, **{"/images/*/json": image(
        {**HONEST, "io.train-images.input-hash": HASH, **labels})})


def test_publish_goes_through_for_the_honest_image(fake, tmp_path):
    """The checkout and engine the forgeries below start from: the refusals are theirs, not the setup's."""
    proc = _publish(fake(_image_answers(FACTS)), _gated_checkout(tmp_path))
    assert proc.returncode == 0 and "would push" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("labels, facts, words", list(FORGED.values()), ids=list(FORGED))
def test_publish_refuses_an_image_whose_labels_or_facts_name_another_entry(fake, tmp_path, labels, facts, words):
    proc = _publish(fake(_image_answers(facts, **labels)), _gated_checkout(tmp_path))
    one_error(proc, 1, "refusing to publish: the image is not the entry's", words)


def test_smoke_refuses_to_gate_an_image_labelled_as_another_entry(fake, tmp_path):
    engine = fake({"/images/*/json": image({**HONEST, TORCH: "9.9.9"})})
    cwd = _gated_checkout(tmp_path)
    (cwd / "build" / "reports" / f"{CI_TAG}.smoke.json").unlink()
    one_error(builder(engine.host, "smoke", CI_TAG, "--cpu", cwd=cwd), 1, "refusing to gate", "pin torch")
    assert not any("/containers" in seen for seen in engine.seen)  # no gate ran, no report claims one
    assert not (cwd / "build" / "reports" / f"{CI_TAG}.smoke.json").exists()


def test_verify_refuses_an_image_whose_labels_contradict_its_facts(fake, tmp_path):
    engine = fake(with_facts(FACTS, **{"/images/*/json": image({**HONEST, "io.train-images.tag": "cu999-other"})}))
    one_error(builder(engine.host, "verify", "x/y:z", "--no-pull", cwd=tmp_path), 1,
              "its labels contradict its own facts", "cu999-other")


# --- terminal escapes in what the engine and the image say ----------------------------------------------


def test_escape_sequences_from_the_engine_never_reach_the_terminal(fake, tmp_path):
    """The engine's description and its error message (the error line) carry ESC/BEL/C1/CR sequences; the user
    sees them spelled out, the terminal gets none."""
    engine = fake(with_facts(FACTS, **{
        "/images/*/json": image({}), "/info": {**INFO, "ServerVersion": ESCAPES},
        "/containers/c0ffee/start": (500, {"message": f"cannot start {ESCAPES}"})}))
    proc = builder(engine.host, "verify", "x/y:z", "--no-pull", "--cpu", cwd=tmp_path)
    line = one_error(proc, 3, "cannot start a container")
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in line  # shown, not obeyed


def test_an_image_whose_facts_carry_escape_sequences_is_refused_in_one_spelled_out_line(fake, tmp_path):
    """The image's facts file names a tag with ESC/BEL/C1/CR in it: not this builder's facts (the schema's tag
    form), refused where it is read, the sequences spelled out in the one error line, none printed raw."""
    facts = {**FACTS, "tag": f"{CI_TAG}{ESCAPES}", "cuda": ESCAPES}
    engine = fake(with_facts(facts, **{"/images/*/json": image({}), "/info": INFO}))
    proc = builder(engine.host, "verify", "x/y:z", "--no-pull", "--cpu", cwd=tmp_path)
    line = one_error(proc, 1, "/opt/train-image/image.json", "field ")
    assert "\\u001b]0;pwned\\u0007" in line  # shown, not obeyed


@pytest.mark.parametrize("said", ["banana", "Docker version \x1b[31m20", ""], ids=["word", "banner", "nothing"])
def test_a_docker_client_with_an_unparsable_version_is_one_line_exit_3(fake, tmp_path, said):
    """BUILDER_DOCKER names a client without buildx whose `version` answer is not a version: not one that can
    build (exit 3), rather than a guess or a traceback."""
    client = tmp_path / "docker"
    client.write_text(f"#!/bin/sh\n[ \"$1\" = buildx ] && exit 1\nprintf '%s\\n' '{said}'\n")
    client.chmod(0o755)
    proc = _publish(fake(_image_answers(FACTS)), _gated_checkout(tmp_path), BUILDER_DOCKER=str(client))
    one_error(proc, 3, "no docker client here can run BuildKit builds")


# --- odd DOCKER_HOST values --------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("host", [
    f"tcp://127.0.0.1:{_closed_port()}", f"ssh://nobody@127.0.0.1:{_closed_port()}", "REGULAR", "unix://REGULAR",
    "unix:///nonexistent/\x1b[31mdocker.sock", "garbage!!", "fd://",
], ids=["tcp-closed", "ssh", "regular-file", "unix-regular-file", "unix-escapes", "garbage", "fd"])
def test_an_odd_docker_host_is_one_line_exit_3(tmp_path, host):
    """(`unix://` with an empty path is not odd: the docker CLI and the SDK both read it as the default socket.)"""
    regular = tmp_path / "not-a-socket"
    regular.write_text("hello\n")
    proc = builder(host.replace("REGULAR", str(regular)), "verify", "x/y:z", "--no-pull", cwd=tmp_path)
    one_error(proc, 3, "no Docker engine answers at")
    assert "DOCKER_HOST is set" in proc.stderr
