"""Unit tests run with no Docker engine and no network: the engine boundary refuses to be reached.

A unit test that needs the boundary stubs it explicitly (monkeypatch); anything that would reach a real
engine fails loudly here instead of passing or failing by the machine it runs on (cibuildwheel's habit).
"""

from __future__ import annotations

import pytest

from builder.boundary import engine


def _no_engine(*_args, **_kwargs):
    raise AssertionError("a unit test reached the Docker engine: stub builder.boundary.engine, or move the test "
                         "to tests/integration/")


@pytest.fixture(autouse=True)
def no_docker_engine(monkeypatch):
    engine.sdk.cache_clear()
    engine.client.cache_clear()
    for name in ("sdk", "client", "run_cli", "run_container", "image_or_none"):
        monkeypatch.setattr(engine, name, _no_engine)
