"""A build that grew past its size budget fails, naming the packages and directories that grew since the image
it replaces (builder diff's comparison). Real `builder build` on the main engine, with a tiny stand-in Dockerfile
in place of the real one (tests/integration/fault_build.py stubs only the network preflight and the pin check),
under another image name so the real CI image is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.images import CI_TAG, DOCKER
from tests.integration.second_engine import project

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("require_docker")]
IMAGE = "builder-test/size-budget"
SITE = "/usr/lib/python3/dist-packages"


def dockerfile(version: str, extra_mb: int) -> str:
    """A stand-in image holding one Python distribution `bigpkg` (a dist-info, as pip leaves it) of extra_mb MB."""
    info = f"{SITE}/bigpkg-{version}.dist-info"
    return ("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n"
            f"RUN mkdir -p {info} && printf 'Metadata-Version: 2.1\\nName: bigpkg\\nVersion: {version}\\n\\n' > "
            f"{info}/METADATA && head -c {extra_mb}M /dev/urandom > {SITE}/bigpkg.bin\n")


def build(cwd) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("BUILDER_REPORTS", "BUILDER_MATRIX")}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.fault_build", "build", CI_TAG, "--local-base"],
                          cwd=cwd, env={**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=600)
    return proc, json.loads((cwd / "build" / "reports" / f"{CI_TAG}.build.json").read_text())


def test_a_build_above_its_size_budget_fails_naming_what_grew(tmp_path):
    cwd = project(tmp_path / "p", dockerfile("1.0", 1))
    text = (cwd / "matrix.yaml").read_text().replace("image: ghcr.io/train-images/train", f"image: {IMAGE}")
    (cwd / "matrix.yaml").write_text(text)
    made = []
    try:
        first, report = build(cwd)
        made.append(report.get("image_id"))
        assert first.returncode == 0, first.stderr[-2000:]
        # The budget: 2 MB over the first image; the next build adds 8 MiB and upgrades bigpkg.
        budget = report["size_bytes"] + 2_000_000
        entry = f"  - tag: {CI_TAG}\n"
        (cwd / "matrix.yaml").write_text(text.replace(entry, f"{entry}    size_budget: {budget}\n"))
        (cwd / "dockerfiles" / CI_TAG / "Dockerfile").write_text(dockerfile("2.0", 9))
        second, report = build(cwd)
        made.append(report.get("image_id"))
        assert second.returncode == 1 and report["result"] == "failed"
        error = next(line for line in second.stderr.splitlines() if line.startswith("error:"))
        assert f"above its size budget of {budget / 1e9:.2f} GB (matrix.yaml:" in error
        assert "python bigpkg 1.0 → 2.0 (upgraded)" in error and "/usr +8.4 MB" in error  # 8 MiB more, error
        assert report["error"] in error
    finally:
        subprocess.run([DOCKER, "rmi", "-f", f"{IMAGE}:{CI_TAG}", *filter(None, made)], capture_output=True)
