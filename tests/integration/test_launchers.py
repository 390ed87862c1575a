"""The gate's Trainer job (smoke.train_trainer: Trainer + DeepSpeed ZeRO-3 config + LoRA) started the ways
users start training in the image: torchrun, the deepspeed launcher and accelerate launch, 2 CPU ranks each, no
network. The same command runs twice, as a preempted job restarts: the first run stops at a checkpoint, the
second resumes from it, consolidates the last ZeRO-3 checkpoint with zero_to_fp32 and reloads the result. Each
launcher must end with the checkpoint written after the resume and the consolidated weights on disk.

`--hostname localhost`: with `--network none` the container's own hostname does not resolve, and torchrun's
rendezvous (which the other two launchers use too) connects to it."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.images import CI_TAG, DOCKER, aborted_at_exit

pytestmark = pytest.mark.docker
IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"
JOB = ["-m", "smoke.train_trainer", "--out", "/tmp/trainer", "--steps", "4"]
LAUNCHERS = {
    "torchrun": ["torchrun", "--nproc_per_node", "2", *JOB],
    "deepspeed": ["deepspeed", "--num_gpus", "2", "--module", *JOB[1:]],
    # --use_deepspeed: without it (and with no GPU) accelerate launch starts one process whatever --num_processes says.
    "accelerate": ["accelerate", "launch", "--use_deepspeed", "--num_processes", "2", *JOB],
}
# What the runs left, listed after the second exits (the container's /tmp goes with it), and what DeepSpeed
# JIT-built into the torch-extensions directory: nothing, its CPU-accelerator ops are prebuilt in the image.
LISTING = ("; rc=$?; echo \"jit-built: [$(ls -A /tmp/torch-ext 2>/dev/null | tr '\\n' ' ')]\"; "
           "cd /tmp/trainer && ls -d checkpoint-* consolidated/model.safetensors checkpoint-4/global_step4; exit $rc")


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_trainer_job_resumes_and_consolidates_under_each_launcher(launcher, ci_build):
    once = " ".join(LAUNCHERS[launcher])
    command = f"{once} && {once}{LISTING}"
    proc = subprocess.run([DOCKER, "run", "--rm", "--network", "none", "--hostname", "localhost", "--shm-size", "1g",
                           "-w", "/opt/train-image",
                           "-e", "DS_ACCELERATOR=cpu", "-e", "CUDA_VISIBLE_DEVICES=", "-e", "OMP_NUM_THREADS=1",
                           "-e", "TORCH_EXTENSIONS_DIR=/tmp/torch-ext",
                           IMAGE, "sh", "-c", command], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    # A rank aborting at interpreter exit, after its work, is PyTorch's gloo shutdown race (pytorch/pytorch#190489,
    # docs/training.md). Everything the job must do is still checked below; then the run is reported as that
    # known failure (xfail, never a pass), because the launcher's exit status, which users get, was not 0.
    aborted = aborted_at_exit(proc.returncode, out)
    if not aborted:
        assert proc.returncode == 0, f"{launcher}: exit {proc.returncode}\n{out[-6000:]}"
    assert "rank 1/2 done: ok" in proc.stdout, out[-6000:]
    assert proc.stdout.count("/2 done: ok") == 4, out[-6000:]  # both ranks finished both runs
    for phase in ("train", "resume"):
        assert f"\u2713 trainer {phase} [cpu]" in proc.stdout, out[-6000:]
    assert "jit-built: []" in proc.stdout, out[-3000:]  # nothing compiled at run time
    left = set(proc.stdout.split())
    assert {"checkpoint-2", "checkpoint-4", "checkpoint-4/global_step4", "consolidated/model.safetensors"} <= left, \
        proc.stdout[-2000:]
    if aborted:
        pytest.xfail(f"{launcher}: exit {proc.returncode} after the job's work was done and checked: a rank aborted "
                     "at interpreter exit (gloo worker freeing tensors while Python finalizes, pytorch/pytorch#190489)")
