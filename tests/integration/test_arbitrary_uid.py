"""The image as OpenShift and hardened Kubernetes run it: an arbitrary UID with no passwd entry (HOME=/), a
read-only root file system, a writable /tmp. The whole gate passes there (`smoke all --cpu`, the container the
gate runs, plus those flags), and the gate's caches (Hugging Face, torch extensions, triton, inductor, pip) land
under /tmp. /tmp is mounted exec: torch.compile's kernels are built there and loaded from there (DeepSpeed's CPU
ops are prebuilt in the image, and the train check fails if any were JIT-built)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.integration.images import CI_TAG, DOCKER, aborted_at_exit, gate_once, gate_output

pytestmark = pytest.mark.docker
IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"
HARDENED = ["--rm", "--network", "none", "--user", "12345:0", "--read-only", "--tmpfs", "/tmp:exec",
            "--shm-size", "1g"]
# The caches the gate's processes resolve (smoke.launch.base_env), printed one per line as NAME=PATH.
CACHES = ("import os, sys; sys.path.insert(0, '/opt/train-image'); from smoke import launch; "
          "os.environ.update(launch.base_env('cpu')); "
          "from huggingface_hub import constants; import torch.utils.cpp_extension as ext; from triton import knobs; "
          "print(f'hf={constants.HF_HOME}'); print(f'torch_extensions={ext.get_default_build_root()}'); "
          "print(f'triton={knobs.cache.dir}')")


def hardened(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, "run", *HARDENED, IMAGE, *command], capture_output=True, text=True, timeout=240)


# A user's own job, not the gate: nothing of smoke's environment (no writable_caches, no TORCH_EXTENSIONS_DIR). The
# image's start-up hook (train_image_env.py) must serve it: getpass (inductor's cache directory, which raised
# KeyError 'getpwuid(): uid not found: 12345' in the torch 2.6 image), the Hugging Face caches (datasets, hub), a
# CPU torch.compile, then the Trainer + ZeRO-3 + LoRA job under torchrun.
USER_CHECKS = ("import getpass, os, torch; print('user=' + getpass.getuser()); "
               "from huggingface_hub import constants; os.makedirs(constants.HF_HUB_CACHE, exist_ok=True); "
               "print('hf=' + constants.HF_HUB_CACHE); "
               "print('compiled=' + str(torch.compile(lambda x: x * 2)(torch.ones(2)).tolist()))")
USER_JOB = ["sh", "-c", "cd /opt/train-image && torchrun --nproc_per_node 2 -m smoke.train_trainer --out /tmp/trainer "
            "--steps 2 && ls -d /tmp/trainer/checkpoint-*"]


# The CUDA 12 case carries cuda12_image: it runs in the block before that image and the build cache go (conftest).
@pytest.mark.parametrize("build", ["ci_build", pytest.param("ci_build_cuda12", marks=pytest.mark.cuda12_image)])
def test_a_users_own_job_runs_as_an_arbitrary_uid_on_a_read_only_root(build, request):
    image = request.getfixturevalue(build)["report"]["image"]
    run = [DOCKER, "run", *HARDENED, "--hostname", "localhost", "-e", "DS_ACCELERATOR=cpu", "-e",
           "CUDA_VISIBLE_DEVICES=", "-e", "OMP_NUM_THREADS=1", image]
    proc = subprocess.run([*run, "python", "-c", USER_CHECKS], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{image} as UID 12345:\n{proc.stdout}{proc.stderr[-3000:]}"
    said = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert said["user"] == "uid12345" and said["hf"].startswith("/tmp/home-12345/.cache/huggingface/")
    assert said["compiled"] == "[2.0, 2.0]", proc.stdout
    job = subprocess.run([*run, *USER_JOB], capture_output=True, text=True, timeout=900)
    out = job.stdout + job.stderr
    assert job.stdout.count("/2 done: ok") == 2 or aborted_at_exit(job.returncode, out), out[-6000:]
    assert "\u2713 trainer train [cpu]" in job.stdout, out[-6000:]
    if job.returncode != 0:
        assert aborted_at_exit(job.returncode, out), out[-6000:]
        pytest.xfail("a rank aborted at interpreter exit after the job's work (pytorch/pytorch#190489)")
    assert re.search(r"^/tmp/trainer/checkpoint-\d+$", job.stdout, re.M), out[-3000:]  # the job's checkpoint


def test_env_and_compile_pass_as_an_arbitrary_uid_on_a_read_only_root(ci_build):
    for check in ("env", "compile"):
        proc = hardened("smoke", check, "--cpu")
        assert proc.returncode == 0, f"smoke {check} as UID 12345, read-only root:\n{proc.stdout}{proc.stderr}"
        assert proc.stdout.startswith(f"✓ {check} [cpu]"), proc.stdout


def test_the_gates_caches_go_to_tmp_when_home_is_not_writable(ci_build):
    proc = hardened("python", "-c", CACHES)
    assert proc.returncode == 0, proc.stderr
    caches = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert set(caches) == {"hf", "torch_extensions", "triton"}, proc.stdout
    # The image's start-up hook set them before the gate looked (train_image_env.py; the gate's own fallback,
    # smoke-home-<uid>, keeps what is already set).
    assert all(path.startswith("/tmp/home-12345/") for path in caches.values()), caches


def test_the_whole_gate_passes_as_an_arbitrary_uid_and_group_on_a_read_only_root(ci_build, tmp_path):
    out = tmp_path / "smoke-out"
    out.mkdir()
    out.chmod(0o777)  # the gate's UID owns nothing on this host
    # The gate's own container (builder.boundary.gate: no network, 8g shm, HF_HUB_OFFLINE) as UID:GID 12345:12345.
    hardened_gate = ["--rm", "--network", "none", "--user", "12345:12345", "--read-only", "--tmpfs", "/tmp:exec",
                     "--shm-size", "8g", "-e", "HF_HUB_OFFLINE=1", "-v", f"{out}:/smoke-out"]
    # A rank that only fails to leave after its work (PyTorch's gloo teardown bugs) is the gate's own decision
    # (docs/training.md): a pass with the clean exit not proven, as for users.
    proc, verdict = gate_once(
        lambda: subprocess.run([DOCKER, "run", *hardened_gate, IMAGE, "smoke", "all", "--cpu", "--out", "/smoke-out"],
                               capture_output=True, text=True, timeout=2400),
        lambda: gate_output(out))
    shown = f"smoke all as 12345:12345, read-only root:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    assert [c["name"] for c in verdict["checks"]] == ["env", "ops", "compile", "train", "nccl"], shown
    assert proc.returncode == 0 and verdict["passed"], shown
