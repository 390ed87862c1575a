"""Docker 20.10 without buildx, Debian 12's docker.io: still supported, and run here as its users run it.

`make test` runs on Docker >= 26 with buildx (what `make docker` starts). This job (`make test-docker20`, run by
.ci/run after the suite) gives the builder what a Debian 12 host has: a private 20.10 dockerd (its own data root,
socket and bridge; tests/integration/second_engine.py) with its classic image store, and a process that sees no
buildx plugin (a private mount namespace hides the plugin directory), so the builder must pick Debian's client and
its embedded BuildKit by itself. On that engine the CI entry is built, gated and published to a real registry, and
`make docker`'s engine choice is checked against it: it uses the older engine it finds, and refuses to start the
modern one beside it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.images import CI_TAG, gate_once
from tests.integration.registry_fixture import Registry
from tests.integration.second_engine import Engine, running_with_base, skip_unless_possible

pytestmark = pytest.mark.docker20

PLUGINS = "/usr/local/lib/docker/cli-plugins"  # where `make docker` links buildx for every client
# What a Debian 12 host lacks: the buildx plugin. Mounted over for this process tree only; the machine keeps it.
NO_BUILDX = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             f'[ ! -d {PLUGINS} ] || mount -t tmpfs none {PLUGINS} || exit 97; exec "$@"', "sh"]


@pytest.fixture(scope="module")
def engine20(tmp_path_factory):
    skip_unless_possible()
    version = subprocess.run(["dockerd", "--version"], capture_output=True, text=True).stdout
    if not re.match(r"Docker version 20\.10\.", version):
        reason = f"the dockerd on PATH is not Debian 12's 20.10 ({version.strip() or 'none'})"
        if os.environ.get("PRIVATE_ENGINE_REQUIRED") == "1":  # `make test-docker20`: a skip would prove nothing
            pytest.fail(f"this engine job cannot run here: {reason}")
        pytest.skip(reason)
    with running_with_base(Engine(), tmp_path_factory.mktemp("base")) as engine:
        yield engine


def _run(argv: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([*NO_BUILDX, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode != 97, f"cannot hide {PLUGINS} in a mount namespace: {proc.stderr[-500:]}"
    return proc


def _env(engine: Engine, tmp_path) -> dict:
    env = engine.env(BUILDER_REPORTS=str(tmp_path / "reports"), DOCKER_CONFIG=str(tmp_path / "docker-config"),
                     PYTHONUNBUFFERED="1")
    env.pop("BUILDER_DOCKER", None)  # the builder picks the client itself, as on a Debian 12 host
    return env


def test_the_ci_entry_builds_passes_its_gate_and_publishes_on_docker_20_10(engine20, tmp_path):
    env = _env(engine20, tmp_path)
    assert _run(["docker", "buildx", "version"], env, 30).returncode != 0, "buildx must be out of sight here"

    built = _run([sys.executable, "-m", "builder", "build", CI_TAG, "--local-base"], env, 3000)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    report = json.loads((tmp_path / "reports" / f"{CI_TAG}.build.json").read_text())
    assert report["result"] == "built" and report["verification"] == "ok"
    # Debian's client with BuildKit built in, against the classic store: file times are the build's, layers
    # gzip when pushed, and the report says so.
    assert report["docker"]["mode"] == "legacy" and report["docker"]["engine"].startswith("20.10.")
    assert report["docker"]["image_store"] == "classic"
    assert report["timestamps_rewritten"] is False and report["layer_compression"] == "gzip"

    # Once, as users run it (a rank that only fails to leave after its work is the gate's own decision,
    # docs/training.md).
    gate, smoke = gate_once(
        lambda: _run([sys.executable, "-m", "builder", "smoke", CI_TAG], env, 1800),
        lambda: json.loads((tmp_path / "reports" / f"{CI_TAG}.smoke.json").read_text()))
    assert gate.returncode == 0, (gate.stdout + gate.stderr)[-4000:]
    assert smoke["passed"] is True and smoke["image_id"] == report["image_id"]

    registry = Registry(tmp_path / "registry").start()
    try:
        # --allow-substituted-base: the base here is made by debootstrap, not pulled by its digest (docs/ci.md)
        published = _run([sys.executable, "-m", "builder", "publish", CI_TAG, "--registry",
                          f"{registry.host}/team", "--allow-substituted-base"], env, 1800)
        assert published.returncode == 0, (published.stdout + published.stderr)[-4000:]
        pub = json.loads((tmp_path / "reports" / f"{CI_TAG}.publish.json").read_text())
        assert pub["layer_compression"] == "gzip"  # any client pulls what 20.10 pushes
        assert registry.digest("team/train", CI_TAG) == pub["digest"] == registry.digest("team/train", pub["full_tag"])
    finally:
        registry.stop()


def test_make_docker_uses_the_older_engine_it_finds_and_will_not_start_the_modern_one_beside_it(engine20, tmp_path):
    """DOCKER_ENGINE unset: an engine that answers is used as it is, with a line saying what it lacks; asked for
    the modern one explicitly while 20.10 answers: exit 3, nothing installed (an engine is never stopped by us)."""
    env = dict(_env(engine20, tmp_path), MODERN_DOCKER=str(tmp_path / "modern"))
    env.pop("DOCKER_ENGINE", None)
    script = ["bash", str(ROOT / "ci" / "setup-docker.sh"), "debian:bookworm-slim"]
    found = _run(script, env, 300)
    assert found.returncode == 0, found.stderr[-2000:]
    assert re.search(r"Docker 20\.10\.\S+ answers: builds use it \(no file-time rewriting, no zstd layers\)",
                     found.stderr), found.stderr
    refused = _run(script, dict(env, DOCKER_ENGINE="modern"), 300)
    assert refused.returncode == 3, refused.stderr
    assert re.search(r"^error: DOCKER_ENGINE=modern, but Docker 20\.10\.\S+ answers already: stop it, then re-run "
                     r"\(nothing was installed\)$", refused.stderr, re.M), refused.stderr
    assert not (tmp_path / "modern").exists()
