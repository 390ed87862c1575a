"""The smoke gate, for real, in CPU mode: the CI image passes; deliberately broken images fail with the
right diagnosis."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builder import reports
from builder.steps import smoke
from tests.conftest import ROOT
from tests.integration.images import CI_TAG, derived_image

pytestmark = pytest.mark.docker
IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def test_gate_passes_on_the_built_image(ci_build):
    proc = subprocess.run([sys.executable, "-m", "builder", "smoke", CI_TAG, "--cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((ROOT / "build/reports" / f"{CI_TAG}.smoke.json").read_text())
    assert report["passed"] is True and report["mode"] == "cpu"
    assert report["image_id"] == ci_build["report"]["image_id"], "the verdict must be bound to the built image"
    assert [c["name"] for c in report["checks"]] == ["env", "train", "nccl"]
    train = report["details"]["train"]["figures"]
    assert train["loss_last"] < train["loss_first"]
    assert train["ranks"] == 2
    assert report["duration_s"] < 120, "the CPU gate should finish well under two minutes"
    assert "smoke: 1 of 1 ok" in proc.stderr and "✓" in proc.stderr
    # Both sides of the contract hold on real output: the builder's report and the gate's own files.
    assert reports.problems("smoke", report) == []
    for name, result in report["details"].items():
        assert reports.problems("check", result, smoke=True) == [], name


def test_torch_replaced_by_another_build_fails_env(ci_build, tmp_path):
    ref = derived_image("torch-replaced", IMAGE, ["pip install --no-deps torch==2.12.0"], tmp_path)
    report = smoke.run_gate(ref, gpus=False, timeout=300)
    assert not report["passed"]
    env = check(report, "env")
    assert not env["passed"]
    assert "pin torch: installed 2.12.0 != pinned 2.13.0" in env["diagnosis"]


def test_missing_pynvml_fails_env(ci_build, tmp_path):
    ref = derived_image("no-pynvml", IMAGE, ["pip uninstall -y nvidia-ml-py"], tmp_path)
    report = smoke.run_gate(ref, gpus=False, timeout=300)
    env = check(report, "env")
    assert not report["passed"] and not env["passed"]
    assert "pynvml" in " ".join(env["diagnosis"])


def test_small_dev_shm_fails_with_the_fix(ci_build):
    report = smoke.run_gate(IMAGE, gpus=False, timeout=300, shm_size="64m")
    env = check(report, "env")
    assert not report["passed"] and not env["passed"]
    text = " ".join(env["diagnosis"])
    assert "/dev/shm" in text and ("--shm-size" in text or "--ipc=host" in text)
