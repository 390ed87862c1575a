"""What users run, for real, in every image CI builds: DeepSpeed's prebuilt ops load under the CUDA accelerator with
no compiler on PATH, the default AdamW config and ZeRO-3 CPU offload train on 2 CPU ranks, torch.compile works.
Deliberately broken images, derived cheaply from the real CI image, prove each check bites with the right
diagnosis: ops not prebuilt, Python headers missing, ops built for archs that miss a GPU the image claims."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builder.steps import smoke
from tests.conftest import ROOT
from tests.integration.images import CI_TAG, CI_TAG_CUDA12, DOCKER, derived_image, gate_once, one_check

pytestmark = pytest.mark.docker
IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"
IMAGE_CUDA12 = f"ghcr.io/train-images/train:{CI_TAG_CUDA12}"


def facts(tag: str) -> dict:
    return json.loads((ROOT / "dockerfiles" / tag / "image.json").read_text())


def assert_ops_prebuilt(report: dict, tag: str) -> None:
    assert report["passed"], report["diagnosis"]
    assert report["figures"]["accelerator"] == "cuda" and report["figures"]["compiler_on_path"] is False
    ops = report["figures"]["ops"]
    assert set(ops) == set(facts(tag)["deepspeed_ops"]) >= {"fused_adam", "cpu_adam"}
    assert all(op["prebuilt"] and op["loaded"] for op in ops.values())
    # The GPU code really is the arch list the entry asked for (read from the .so's fat binary).
    want = facts(tag)["ops"]["arch_list"].split(";")
    sass = {f"sm_{a.split('+')[0].replace('.', '')}" for a in want}
    ptx = {f"ptx_{a.split('+')[0].replace('.', '')}" for a in want if a.endswith("+PTX")}
    assert set(ops["fused_adam"]["archs"]) == sass | ptx
    # ds_report, DeepSpeed's own inventory, says the same.
    assert report["figures"]["ds_report"]["fused_adam"].startswith("YES")
    assert report["figures"]["ds_report"]["cpu_adam"].startswith("YES")
    # DeepSpeed's CPU-accelerator ops: from the image's CPU build, prebuilt, loaded with no compiler.
    cpu = facts(tag)["ops"]["cpu_accelerator"]
    got = report["figures"]["cpu_accelerator_ops"]
    assert set(got) == set(cpu["modules"]) == {"fused_adam", "cpu_adam", "deepspeed_shm_comm"}
    assert all(op["prebuilt"] and op["loaded"] and op["module"].startswith(cpu["dir"] + "/") for op in got.values())


def test_cuda13_ops_are_prebuilt_and_load_without_a_compiler(ci_build, tmp_path):
    assert_ops_prebuilt(one_check(IMAGE, "ops", tmp_path), CI_TAG)


@pytest.mark.cuda12_image
def test_cuda12_gate_passes(ci_build_cuda12):
    """The CUDA 12 entry (Debian 12, Python 3.11; nvcc 12.4 from Debian 13's .debs, unpacked) through the whole
    gate, as CI gates it."""
    proc, report = gate_once(
        lambda: subprocess.run([sys.executable, "-m", "builder", "smoke", CI_TAG_CUDA12, "--cpu"], cwd=ROOT,
                               capture_output=True, text=True, timeout=1800),
        lambda: json.loads((ROOT / "build/reports" / f"{CI_TAG_CUDA12}.smoke.json").read_text()))
    assert proc.returncode == 0 and report["passed"], smoke.failing(report)
    assert report["image_id"] == ci_build_cuda12["report"]["image_id"]
    assert_ops_prebuilt(report["details"]["ops"], CI_TAG_CUDA12)
    train = report["details"]["train"]["figures"]
    for variant, optimizer in (("adamw", "FusedAdam"), ("offload", "DeepSpeedCPUAdam")):
        assert train[variant]["optimizer"] == optimizer
        assert train[variant]["loss_last"] < train[variant]["loss_first"]
    assert report["details"]["compile"]["passed"]


def test_ops_not_prebuilt_is_caught(ci_build, tmp_path):
    # What the image used to be: DeepSpeed from its sdist with no ops (DS_BUILD_OPS defaults to 0).
    ref = derived_image("ops-not-prebuilt", IMAGE, [
        "pip install -q --no-deps --force-reinstall --no-build-isolation --no-binary deepspeed deepspeed==0.19.8"],
        tmp_path)
    report = one_check(ref, "ops", tmp_path)
    assert not report["passed"]
    text = " ".join(report["diagnosis"])
    assert "fused_adam prebuilt: not prebuilt into the image" in text
    assert "cpu_adam prebuilt: not prebuilt into the image" in text
    assert any(d.startswith("op_not_prebuilt") for d in report["diagnosis"])


def test_cpu_accelerator_build_not_found_is_caught(ci_build, tmp_path):
    """Without the .pth that puts the CPU build first under DS_ACCELERATOR=cpu, DeepSpeed's CPU accelerator would
    JIT-build its ops: the ops check names the missing build, and each op, instead of passing."""
    py = facts(CI_TAG)["python"]
    ref = derived_image("no-cpu-accelerator-pth", IMAGE,
                        [f"rm /opt/venv/lib/python{py}/site-packages/train-image-deepspeed-cpu.pth"], tmp_path)
    report = one_check(ref, "ops", tmp_path)
    assert not report["passed"]
    failed = [i["name"] for i in report["items"] if i["ok"] is False]
    assert "DS_ACCELERATOR=cpu finds DeepSpeed's CPU build" in failed
    assert "fused_adam (CPU accelerator) loads prebuilt with no build step" in failed
    # The CUDA side is untouched and still passes.
    assert all(i["ok"] for i in report["items"] if "CPU accelerator" not in i["name"] and "CPU build" not in i["name"])


def test_python_headers_missing_is_caught(ci_build, tmp_path):
    py = facts(CI_TAG)["python"]
    ref = derived_image("no-python-headers", IMAGE, [f"apt-get remove -y -q python{py}-dev libpython{py}-dev"],
                        tmp_path)
    compiled = one_check(ref, "compile", tmp_path)
    assert not compiled["passed"]
    assert any(d.startswith("python_headers_missing") for d in compiled["diagnosis"]), compiled["diagnosis"]
    # The prebuilt ops need no headers: that check still passes, so the diagnosis points at the headers alone.
    assert one_check(ref, "ops", tmp_path)["passed"]


def test_ops_missing_a_claimed_gpu_is_caught(ci_build, tmp_path):
    # The image's ops are built for sm_75 and newer (CUDA 13 dropped Volta); an image that claims a V100 lies.
    data = facts(CI_TAG)
    data["gpu_capability"]["V100"] = "7.0"
    (tmp_path / "image.json").write_text(json.dumps(data))
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "image.json").write_text(json.dumps(data))
    (context / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY image.json /opt/train-image/image.json\n")
    ref = "builder-test/claims-v100:latest"
    subprocess.run([DOCKER, "build", "-q", "-t", ref, str(context)], check=True, capture_output=True,
                   env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    report = one_check(ref, "ops", tmp_path)
    assert not report["passed"]
    text = " ".join(report["diagnosis"])
    assert "no code for V100 (sm_70)" in text and "no kernel image is available" in text
