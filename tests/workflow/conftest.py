"""Shared by the workflow tests: the job's venv (made once) and a registry on 127.0.0.1 that wants a login."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT
from tests.integration import registry_fixture

TOKEN = "harness-token"  # secrets.GITHUB_TOKEN in the simulated runs; the registry's password for user `ci`


@pytest.fixture(scope="session")
def venv(tmp_path_factory):
    """The job's `make venv`, made once per session with the Makefile's own recipe (each clone links it)."""
    path = tmp_path_factory.mktemp("workflow-venv") / "venv"
    subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", "venv", f"VENV={path}"], check=True,
                   capture_output=True, timeout=900)
    return path


@pytest.fixture(scope="session")
def local_registry(tmp_path_factory):
    reg = registry_fixture.Registry(tmp_path_factory.mktemp("workflow-registry"), users={"ci": TOKEN}).start()
    yield reg
    reg.stop()
