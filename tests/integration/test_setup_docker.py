"""`ci/setup-docker.sh`, the script `make docker` runs, as a user runs it: the engine choice (DOCKER_ENGINE).

It installs and starts engines, so only its refusals run here, against the machine's real engine: a user who asks
for the modern engine while an older one holds the socket is told so before anything is fetched or installed.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT
from tests.integration.images import DOCKER

SCRIPT = ROOT / "ci" / "setup-docker.sh"


def _run(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "debian:bookworm-slim"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MODERN_DOCKER=str(tmp_path / "modern"), **env))


def test_an_unknown_engine_is_a_user_error_that_names_the_choices(tmp_path):
    proc = _run(tmp_path, DOCKER_ENGINE="podman")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: DOCKER_ENGINE=podman: use auto (the engine that answers, else Docker 26 + buildx), modern (Docker 26 "
        "+ buildx) or debian (the host's docker.io)"]
    assert not (tmp_path / "modern").exists()


def test_modern_is_refused_while_an_older_engine_answers_and_nothing_is_installed(tmp_path):
    server = subprocess.run([DOCKER, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True,
                            timeout=30).stdout.strip()
    if not server or int(server.split(".")[0]) >= 26:
        pytest.skip(f"needs an engine older than 26 answering (here: {server or 'none'})")
    plugin = "/usr/local/lib/docker/cli-plugins/docker-buildx"
    before = os.path.realpath(plugin) if os.path.lexists(plugin) else None
    proc = _run(tmp_path, DOCKER_ENGINE="modern")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: DOCKER_ENGINE=modern, but Docker {server} answers already: stop it, then re-run (nothing was installed)"]
    assert not (tmp_path / "modern").exists()
    assert (os.path.realpath(plugin) if os.path.lexists(plugin) else None) == before
