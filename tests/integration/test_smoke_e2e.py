"""The smoke gate, for real, in CPU mode: the CI image passes; deliberately broken images fail with the
right diagnosis."""

from __future__ import annotations

import pytest

from builder import reports
from tests.integration.images import CI_TAG, derived_image, one_check

pytestmark = pytest.mark.docker
IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"


def test_gate_passes_on_the_built_image(ci_build, ci_gate):
    proc, report = ci_gate["proc"], ci_gate["report"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["passed"] is True and report["mode"] == "cpu"
    assert report["image_id"] == ci_build["report"]["image_id"], "the verdict must be bound to the built image"
    assert [c["name"] for c in report["checks"]] == ["env", "ops", "compile", "train", "nccl"]
    train = report["details"]["train"]["figures"]
    # DeepSpeed's default AdamW config and ZeRO-3 CPU offload, nothing patched: the optimizers DeepSpeed picks.
    for variant, optimizer in (("adamw", "FusedAdam"), ("offload", "DeepSpeedCPUAdam")):
        assert train[variant]["optimizer"] == optimizer
        assert train[variant]["loss_last"] < train[variant]["loss_first"]
    assert train["ranks"] == 2
    assert report["details"]["compile"]["figures"]["backend"] == "inductor/cpp"
    assert report["details"]["ops"]["figures"]["ds_report"]["fused_adam"].startswith("YES")
    # DeepSpeed's CPU-accelerator ops come prebuilt: the training jobs compiled nothing (their own empty
    # torch-extensions directory stayed empty) and the ops check loaded each from the image's CPU build.
    items = {i["name"]: i for i in report["details"]["train"]["items"]}
    assert items["nothing compiled at run time (DeepSpeed's CPU-accelerator ops prebuilt)"]["ok"] is True
    assert set(report["details"]["ops"]["figures"]["cpu_accelerator_ops"]) == {"fused_adam", "cpu_adam",
                                                                              "deepspeed_shm_comm"}
    assert report["duration_s"] < 600, "the CPU gate took longer than its measured bound"
    assert "smoke: 1 of 1 ok" in proc.stderr and "✓" in proc.stderr
    # Both sides of the contract hold on real output: the builder's report and the gate's own files.
    assert reports.problems("smoke", report) == []
    for name, result in report["details"].items():
        assert reports.problems("check", result, smoke=True) == [], name


# The broken images below target the env check: each runs that check alone (the whole CPU gate takes minutes).

def test_torch_replaced_by_another_build_fails_env(ci_build, tmp_path):
    ref = derived_image("torch-replaced", IMAGE, ["pip install --no-deps torch==2.12.0"], tmp_path)
    env = one_check(ref, "env", tmp_path, timeout=300)
    assert not env["passed"]
    assert "pin torch: installed 2.12.0 != pinned 2.13.0" in env["diagnosis"]


def test_missing_pynvml_fails_env(ci_build, tmp_path):
    ref = derived_image("no-pynvml", IMAGE, ["pip uninstall -y nvidia-ml-py"], tmp_path)
    env = one_check(ref, "env", tmp_path, timeout=300)
    assert not env["passed"]
    assert "pynvml" in " ".join(env["diagnosis"])


def test_small_dev_shm_fails_with_the_fix(ci_build, tmp_path):
    env = one_check(IMAGE, "env", tmp_path, timeout=300, shm_size="64m")
    assert not env["passed"]
    text = " ".join(env["diagnosis"])
    assert "/dev/shm" in text and ("--shm-size" in text or "--ipc=host" in text)
