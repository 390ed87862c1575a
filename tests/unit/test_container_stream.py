"""`builder smoke` is not silent: engine.run_container hands each line of a container's output on as the
container prints it, keeps it all for the report, and still kills a container past its time. The engine is a
stub here (a container object scripted by the test); tests/integration/ runs real containers."""

from __future__ import annotations

import threading

import pytest
from requests.exceptions import ReadTimeout

from builder import log
from builder.boundary import engine, gate

RUN_CONTAINER = engine.run_container  # the real one: the unit conftest swaps it for a refusal per test


class Container:
    """A container whose output arrives in `chunks`; it exits (`wait` returns) only once all were read,
    or raises ReadTimeout when `hang` (the engine's answer to a wait past its timeout)."""

    def __init__(self, chunks, hang=False, status=0):
        self.chunks, self.hang, self.status = chunks, hang, status
        self.read_all, self.killed, self.removed = threading.Event(), threading.Event(), False
        self.seen_by_wait: list[str] = []

    def logs(self, stdout=True, stderr=True, stream=False, follow=False):
        assert stream and follow, "the output must be followed, not fetched at the end"
        yield from self.chunks
        if self.hang:
            self.killed.wait(5)  # a follow stream ends when the container dies
        self.read_all.set()

    def wait(self, timeout):
        if self.hang:
            raise ReadTimeout()
        assert self.read_all.wait(5)
        return {"StatusCode": self.status}

    def kill(self):
        self.killed.set()

    def remove(self, force=False):
        self.removed = True


@pytest.fixture
def engine_with(monkeypatch):
    def use(container):
        class Containers:
            def run(self, image, command, **kwargs):
                return container

        monkeypatch.setattr(engine, "sdk", lambda: type("Sdk", (), {"containers": Containers()})())
        return container

    return use


def test_each_line_is_handed_on_as_it_arrives_and_kept(engine_with):
    box = engine_with(Container([b"\xe2\x9c\x93 env [cpu] ok (5", b".4s)\n\xe2\x9c\x93 ops [cpu]", b" ok\n", b"tail"]))
    seen = []
    code, logs = RUN_CONTAINER("img", ["smoke", "all"], timeout=60, on_line=seen.append)
    assert seen == ["✓ env [cpu] ok (5.4s)", "✓ ops [cpu] ok", "tail"]
    assert (code, logs) == (0, "✓ env [cpu] ok (5.4s)\n✓ ops [cpu] ok\ntail")
    assert box.removed


def test_a_container_past_its_time_is_killed_and_its_output_kept(engine_with):
    box = engine_with(Container([b"\xe2\x9c\x93 env [cpu] ok\n", b"train: step 1\n"], hang=True))
    seen = []
    code, logs = RUN_CONTAINER("img", ["smoke", "all"], timeout=1, on_line=seen.append)
    assert box.killed.is_set() and box.removed
    assert code == 124 and logs == "✓ env [cpu] ok\ntrain: step 1\n" and seen == ["✓ env [cpu] ok", "train: step 1"]


def test_streamed_lines_are_masked_like_every_other_output(capsys):
    log.output("pull https://bob:tok-123@mirror.example/simple ok\n")
    assert capsys.readouterr().err == "  pull https://****@mirror.example/simple ok\n"


def test_the_gate_streams_its_container(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(engine, "image_or_none", lambda ref: type("Image", (), {"id": "sha256:abc"})())
    monkeypatch.setattr(engine, "run_container", lambda image, command, **kw: seen.update(kw) or (1, ""))
    gate.run_gate("train:x", gpus=False, timeout=60)
    assert seen["on_line"] is log.output
