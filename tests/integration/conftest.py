"""Real-engine fixtures: a Docker engine must answer, the CI entry is built once per session for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration import diskwatch
from tests.integration.images import (
    BASE_MIRROR,
    CI_TAG,
    CI_TAG_CUDA12,
    DOCKER,
    MIRROR_FLAGS,
    canary_bundle,
    docker_available,
    gate_once,
    prune_build_cache,
    remove_images,
)

# --- disk: one CI image's build at a time ----------------------------------------------------------------
# A CI image costs ~25 GB of engine disk while it builds (layers, build cache, export). The CUDA 12 image's
# tests run first; then that image and the whole build cache go (the CUDA 13 image is built with --no-cache
# anyway), so the CUDA 13 build and everything after it never share the disk with it.

def pytest_collection_modifyitems(config, items):
    first = [item for item in items if item.get_closest_marker("cuda12_image")]
    items[:] = first + [item for item in items if not item.get_closest_marker("cuda12_image")]


def pytest_runtest_teardown(item, nextitem):
    # Only when more tests follow: a developer running just these keeps the image.
    if item.get_closest_marker("cuda12_image") and nextitem and not nextitem.get_closest_marker("cuda12_image"):
        remove_images(f"ghcr.io/train-images/train:{CI_TAG_CUDA12}")
        prune_build_cache()


def pytest_runtest_logstart(nodeid, location):
    diskwatch.start(DOCKER)
    diskwatch.running(nodeid)


@pytest.hookimpl(trylast=True)  # after the failures and the -ra list: the last lines a CI log shows
def pytest_terminal_summary(terminalreporter):
    line = diskwatch.summary()
    if line:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def require_docker():
    if not docker_available():
        pytest.fail("these tests need a Docker engine: run them through `make test` (or .ci/run), which starts one")


# --- the real CI image, built once per session -----------------------------------------------------------

@pytest.fixture(scope="session")
def ci_build(require_docker, tmp_path_factory):
    """Build the CI entry for real (no layer cache, so every RUN executes with the secret mounted).

    BUILDER_TEST_FAST=1 (local iteration only; CI never sets it) builds incrementally instead; the tests
    that need every RUN step executed then skip and say why."""
    tmp = tmp_path_factory.mktemp("ci-build")
    fast = os.environ.get("BUILDER_TEST_FAST") == "1"
    bundle, marker = canary_bundle(tmp)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PIP_INDEX_URL", None)
    flags = [] if fast else ["--no-cache", "--force"]
    subprocess.run([DOCKER, "tag", "debian:bookworm-slim", BASE_MIRROR], check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "-m", "builder", "build", CI_TAG, *MIRROR_FLAGS, *flags,
                           "--ca-bundle", str(bundle)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3000)
    log = proc.stdout + proc.stderr
    (tmp / "build.log").write_text(log)
    assert proc.returncode == 0, log[-4000:]
    from builder.model import paths

    report = json.loads((ROOT / paths.report(CI_TAG, "build")).read_text())
    return {"report": report, "log": log, "marker": marker, "bundle": bundle, "tmp": tmp, "fast": fast}




@pytest.fixture(scope="session")
def ci_build_cuda12(require_docker, tmp_path_factory):
    """Build the CUDA 12 CI entry for real, ops stage included (incremental: the secret and no-cache checks
    are the CUDA 13 build's job; on CI's fresh machine this is a cold build anyway)."""
    tmp = tmp_path_factory.mktemp("ci-build-cuda12")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PIP_INDEX_URL", None)
    proc = subprocess.run([sys.executable, "-m", "builder", "build", CI_TAG_CUDA12, "--local-base"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=3000)
    log = proc.stdout + proc.stderr
    (tmp / "build.log").write_text(log)
    assert proc.returncode == 0, log[-4000:]
    from builder.model import paths

    return {"report": json.loads((ROOT / paths.report(CI_TAG_CUDA12, "build")).read_text()), "log": log, "tmp": tmp}


@pytest.fixture(scope="session")
def ci_gate(ci_build):
    """The whole gate, once per session, on the CI image built above (`builder smoke TAG --cpu`): on 2 cores it
    takes about two minutes, so the gate test and the publish round trip share this one run."""
    from builder.model import paths

    # Once, as users run it: a rank that only failed to leave after its work is the gate's own decision.
    proc, report = gate_once(
        lambda: subprocess.run([sys.executable, "-m", "builder", "smoke", CI_TAG, "--cpu"], cwd=ROOT,
                               capture_output=True, text=True, timeout=2400),
        lambda: json.loads((ROOT / paths.report(CI_TAG, "smoke")).read_text()))
    return {"proc": proc, "report": report}
