"""Unit tests run with no Docker engine, no child process and no network: each refuses to be reached.

A unit test that needs the boundary stubs it explicitly (monkeypatch the one runner,
`builder.boundary.process.run` / `pipe`, or an engine function); anything that would start a real process or
open a connection fails loudly here instead of passing or failing by the machine it runs on (cibuildwheel's
`mock_protection`). A test that truly needs a real process or a loopback server lives in tests/integration/.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from builder.boundary import engine

HOW = ("stub the boundary (monkeypatch builder.boundary.process.run / process.pipe, builder.boundary.web or an "
       "engine function), or move the test to tests/integration/")
# Every way Python starts a program: subprocess (run, check_output, Popen, os.popen all end in Popen), the
# exec family, spawn, system, fork.
OS_STARTERS = tuple(name for name in dir(os) if name.startswith(("exec", "spawn", "posix_spawn"))) + (
    "system", "fork", "forkpty")


class ForbiddenInUnitTests(AssertionError):
    """Raised by whatever a unit test may not reach."""


def _refuse(what: str, show_args: bool = False):
    def refused(*args, **_kwargs):
        shown = f" {args[0]!r}" if show_args and args else ""
        raise ForbiddenInUnitTests(f"a unit test tried to start {what}{shown}: {HOW}")

    return refused


def _no_engine(*_args, **_kwargs):
    raise ForbiddenInUnitTests("a unit test reached the Docker engine: stub builder.boundary.engine, or move the "
                               "test to tests/integration/")


@pytest.fixture(autouse=True)
def no_docker_engine(monkeypatch):
    engine.sdk.cache_clear()
    engine.client.cache_clear()
    for name in ("sdk", "client", "run_cli", "run_container", "image_or_none"):
        monkeypatch.setattr(engine, name, _no_engine)


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", _refuse("a process", show_args=True))
    for name in OS_STARTERS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"a process (os.{name})", show_args=True))


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """No connection of any kind (TCP, UDP, a Unix socket such as the engine's) and no name lookup."""
    for name in ("connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, name, _refuse(f"a network connection (socket.{name})"))
    for name in ("create_connection", "getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        monkeypatch.setattr(socket, name, _refuse(f"a network lookup (socket.{name})"))
