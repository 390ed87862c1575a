"""The scheduled refresh decides from the re-locked inputs: a newer apt version in the lock → a rebuild plan;
nothing new → none. The image job's `moved` step (`builder plan TAG` on a schedule) is what runs here, in a clean
clone, against a registry that serves the published alias with its input-hash label (written over the API)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from builder.boundary import buildkit, registry
from builder.model import matrix
from tests.conftest import ROOT
from tests.integration import registry_fixture
from tests.workflow import harness
from tests.workflow.conftest import TOKEN

TAG = "cu130-torch2.13-bookworm"


def in_clone(clone, env, *argv: str) -> str:
    proc = subprocess.run([str(clone / ".venv" / "bin" / "python"), *argv], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def publish_alias(repo: registry.Repository, input_hash: str, config_dir) -> str:
    """An image manifest whose config carries the label `build` sets; returns its digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                         "config": {"Labels": {f"{buildkit.LABEL_PREFIX}.input-hash": input_hash}}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": registry.OCI_MANIFEST, "layers": [],
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": registry.put_blob(repo, config, config_dir), "size": len(config)}}
    return registry.put_manifest(repo, TAG, json.dumps(manifest).encode(), registry.OCI_MANIFEST, config_dir)


@pytest.fixture
def own_registry(tmp_path):
    """Its own registry: the alias published here must not change what the harness's runs see."""
    reg = registry_fixture.Registry(tmp_path / "registry", users={"ci": TOKEN}).start()
    yield reg
    reg.stop()


def test_schedule_rebuilds_what_the_relock_moved_and_nothing_else(venv, own_registry, tmp_path):
    local_registry = own_registry
    clone = harness.clean_clone(tmp_path / "clone")
    (clone / ".venv").symlink_to(venv)
    docker_config = tmp_path / "docker"
    env = dict(os.environ, DOCKER_CONFIG=str(docker_config), GITHUB_OUTPUT="", GITHUB_EVENT_NAME="schedule")
    where = f"{local_registry.host}/acme"
    subprocess.run([str(venv / "bin" / "python"), "-m", "builder", "login", "--registry", where, "--username", "ci",
                    "--password-stdin"], input=TOKEN, text=True, cwd=clone, env=env, check=True, capture_output=True)
    entry = matrix.load(clone / "matrix.yaml").by_tag()[TAG]
    current = in_clone(clone, env, "-c", "from builder.boundary import buildkit; from builder.model import matrix; "
                       f"print(buildkit.planned_input_hash(matrix.load().by_tag()[{TAG!r}]))").strip()
    digest = publish_alias(registry.repository(where, entry.image), current, docker_config)

    plan = ["-m", "builder", "plan", TAG, "--event", "schedule", "--registry", where]
    nothing_new = in_clone(clone, env, *plan)
    assert "build=false" in nothing_new and f"previous={where}/{entry.image.rsplit('/', 1)[-1]}@{digest}" in nothing_new

    apt_lock = clone / "locks" / TAG / "apt.lock"
    text = apt_lock.read_text()
    package, version = next(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    apt_lock.write_text(text.replace(f"{package}={version}", f"{package}={version}+deb12u1", 1))  # a security update
    assert "build=true" in in_clone(clone, env, *plan)
    assert ROOT != clone
