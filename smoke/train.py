"""train check: tiny DeepSpeed ZeRO-3 + peft LoRA jobs on every visible GPU (2 gloo ranks on CPU).

Runs what users run, nothing in DeepSpeed patched: DeepSpeed's default optimizer config
({"type": "AdamW"}: FusedAdam on GPU, DeepSpeed's C++ FusedAdam on the CPU accelerator), then, in the same
ranks, the same training with ZeRO-3 CPU offload (offload_optimizer: {device: cpu}: DeepSpeedCPUAdam).
On CPU the accelerator's own ops (shm_comm, the CPU Adam kernels) come prebuilt from the image's
CPU-accelerator DeepSpeed build where the facts say so, and the check fails if anything was JIT-built;
older images JIT-build them as for any user.
Proves the stack composes: transformers builds a model from a config
(no download), peft wraps it, DeepSpeed partitions it (stage3_param_persistence_threshold 0 so even tiny
params are partitioned), trains N steps on a fixed batch, saves and reloads a checkpoint. Then the job most
users run (smoke.train_trainer): transformers' Trainer with a DeepSpeed ZeRO-3 config + LoRA, a checkpoint, a
resume from it, zero_to_fp32 consolidation and a reload of the consolidated weights.
Parent side (run) launches ranks via smoke.ranks; worker side (worker) is `python -m smoke.train`.
"""

import os
import shutil
import tempfile
import time

from smoke import launch, ranks, report

SEED = 1234
BATCH, SEQ, VOCAB = 4, 32, 256


# The two DeepSpeed configs users start from; only the optimizer placement differs.
VARIANTS = ("adamw", "offload")
JOB = "deepspeed"  # the job that runs them, one after the other, in the same ranks
EXPECTED_OPTIMIZER = {"adamw": "FusedAdam", "offload": "DeepSpeedCPUAdam"}
# The Trainer job users run (smoke.train_trainer: Trainer + DeepSpeed config): a first run to a checkpoint,
# then a second process that resumes from it, consolidates with zero_to_fp32 and reloads.
TRAINER_PHASES = ("train", "resume")


def ds_config(bf16, variant="adamw"):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if variant == "offload":
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        # DeepSpeed's default: FusedAdam on GPU (prebuilt in the image), DeepSpeedCPUAdam when offloading.
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": zero,
        "bf16": {"enabled": bool(bf16)},
        "gradient_clipping": 1.0,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


def compiler_on_path(path=None):
    for c in ("c++", "g++"):
        p = shutil.which(c, path=path)
        if p:
            return p
    return None


def run(res, facts, mode, n_gpus, out_dir, steps, timeout):
    n = n_gpus if mode == "gpu" else 2
    res.figures["ranks"] = n
    started = time.monotonic()
    # An image with DeepSpeed's CPU-accelerator ops prebuilt (facts ops.cpu_accelerator) must compile nothing on
    # CPU: the jobs get an empty torch-extensions directory of their own, which must stay empty. Without them
    # DeepSpeed JIT-builds shm_comm and its Adam kernels, so the image needs its toolchain (said in figures).
    prebuilt = mode == "cpu" and bool((facts.get("ops") or {}).get("cpu_accelerator"))
    extensions = tempfile.mkdtemp(prefix="smoke-torch-ext-") if prebuilt else None
    if mode == "cpu":
        path = launch.base_env(mode).get("PATH")
        res.figures["cxx"], res.figures["ninja"] = compiler_on_path(path), shutil.which("ninja", path=path)
    try:
        run_deepspeed_job(res, mode, n, out_dir, steps, timeout, extensions)
        run_trainer(res, mode, n, out_dir, steps, lambda: max(30.0, timeout - (time.monotonic() - started)),
                    extensions)
        if extensions:
            built = sorted(os.listdir(extensions))
            res.add("nothing compiled at run time (DeepSpeed's CPU-accelerator ops prebuilt)", not built,
                    f"JIT-built into TORCH_EXTENSIONS_DIR: {', '.join(built)}" if built else "no JIT build")
    finally:
        if extensions:
            shutil.rmtree(extensions, ignore_errors=True)
    res.figures["wall_seconds"] = round(time.monotonic() - started, 2)
    summarise(res, n)


def summarise(res, n):
    f = res.figures
    parts = []
    for variant in VARIANTS:
        v = f.get(variant) or {}
        if v.get("loss_first") is not None and v.get("loss_last") is not None:
            parts.append(f"{variant} ({v.get('optimizer')}) loss {v['loss_first']:.4f} -> {v['loss_last']:.4f}")
    t = f.get("trainer-resume") or {}
    if t.get("loss_last") is not None:
        parts.append(f"Trainer loss {t['loss_first']:.4f} -> {t['loss_last']:.4f}, resumed at step "
                     f"{t.get('resumed_at')} to {t.get('global_step')}")
    if parts:
        res.summary = f"{n} ranks {f.get('dtype')}: " + "; ".join(parts)


def job_env(mode, n, steps, ckpt, extensions=None):
    env = launch.base_env(mode)
    env.update(SMOKE_MODE=mode, SMOKE_STEPS=str(steps), SMOKE_CKPT_DIR=ckpt)
    if extensions:
        env["TORCH_EXTENSIONS_DIR"] = extensions
    if mode == "cpu":
        # Two ranks share the cores; oversubscribed OpenMP threads make gloo crawl.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // n)))
    return env


def run_deepspeed_job(res, mode, n, out_dir, steps, timeout, extensions=None):
    """The deepspeed.initialize configs, one after the other in one multi-rank job: each rank pays the imports and
    the process group once (a launch is most of a job's wall time on 2 cores). Items arrive named per variant."""
    ckpt = tempfile.mkdtemp(prefix="smoke-ckpt-")
    try:
        env = dict(job_env(mode, n, steps, ckpt, extensions), SMOKE_VARIANTS=",".join(VARIANTS))
        run_rank_job(res, "smoke.train", n, out_dir, JOB, timeout, env, merge=merge_variants)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def run_trainer(res, mode, n, out_dir, steps, time_left, extensions=None):
    """The Trainer job's two runs over one output directory; the resume runs only after a good first run."""
    ckpt = tempfile.mkdtemp(prefix="smoke-trainer-")
    try:
        for phase in TRAINER_PHASES:
            env = dict(job_env(mode, n, steps, ckpt, extensions), SMOKE_TRAINER_PHASE=phase)
            if not run_rank_job(res, "smoke.train_trainer", n, out_dir, f"trainer-{phase}", time_left(), env):
                break
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def run_rank_job(res, module, n, out_dir, name, timeout, env, merge=None):
    """One multi-rank job; its items and figures land in res under `name` (merge_variant, or the given merge).
    True iff it passed."""
    r, data = ranks.run_job(module, n, out_dir, f"train-{name}", timeout, env)
    (merge or merge_variant)(res, name, r, data)
    prefix = f"{name}: "
    ok = ranks.record_exit(res, r, data, timeout, prefix)
    if not ok or not data or any(i["ok"] is False for i in data.get("items", [])):
        ranks.explain_failure(res, r, prefix)
        return False
    return True


def merge_variant(res, variant, r, data):
    """Rank 0's items (named after the variant) and figures (under res.figures[variant]; dtype shared)."""
    for item in data.get("items", []):
        res.items.append(dict(item, name=f"{variant}: {item['name']}"))
    figs = data.get("figures", {})
    if "dtype" in figs:
        res.figures["dtype"] = figs.pop("dtype")
    figs["wall_seconds"] = r["seconds"]
    figs["logs"] = r["logs"]
    res.figures[variant] = figs


def merge_variants(res, job, r, data):
    """The deepspeed job's rank 0 result: items already named per variant, figures under each variant's name;
    the job's wall time and logs under `job`."""
    res.items.extend(data.get("items", []))
    figs = dict(data.get("figures", {}))
    if "dtype" in figs:
        res.figures["dtype"] = figs.pop("dtype")
    res.figures.update(figs)
    res.figures[job] = {"wall_seconds": r["seconds"], "logs": r["logs"], "variants": list(VARIANTS)}


# ----------------------------------------------------------------------------- worker side

def worker():
    launch.start_rank()
    import torch.distributed as dist

    rank, world, local, gpu = ranks.rank_env()
    steps = int(os.environ.get("SMOKE_STEPS", "5"))
    mode = "gpu" if gpu else "cpu"
    res = report.Result("train", mode)
    dev = join_group(gpu, local)
    bf16 = use_bf16(gpu, dev)
    res.figures["dtype"] = "bf16" if bf16 else "fp32"
    for variant in os.environ.get("SMOKE_VARIANTS", "adamw").split(","):
        one = report.Result("train", mode)
        t0 = time.monotonic()
        train_variant(one, variant, bf16, dev, steps, gpu, os.path.join(os.environ["SMOKE_CKPT_DIR"], variant))
        one.figures["seconds"] = round(time.monotonic() - t0, 2)
        res.items.extend(dict(item, name=f"{variant}: {item['name']}") for item in one.items)
        res.figures[variant] = one.figures
    ranks.finish(dist, rank, res)
    print(f"rank {rank}/{world} done: " + ("ok" if all(i["ok"] for i in res.items) else "FAILED"))


def train_variant(res, variant, bf16, dev, steps, gpu, ckpt):
    """One deepspeed.initialize config: train, check, checkpoint round trip; the engine is released after."""
    if gpu:
        import torch

        torch.cuda.reset_peak_memory_stats(dev)  # this config's peak, not the process's
    engine = build_engine(res, bf16, variant)
    # Same fixed batch on every rank, so every rank must compute the same loss: a cheap
    # proof that the partitioned parameters agree after the steps.
    ids = fixed_batch(dev)
    loss_last = train_and_check(res, engine, ids, steps, gpu)
    tol = 1e-3 if bf16 else 1e-5
    check_ranks_agree(res, loss_last, tol, dev)
    check_checkpoint(res, engine, ids, tol, ckpt)
    record_peak_memory(res, gpu, dev)
    # ZeRO-3's hooks and partitioned buffers go before the next config's engine (destroy(): DeepSpeed >= 0.10).
    getattr(engine, "destroy", lambda: None)()


def join_group(gpu, local):
    """This rank's device, and the process group joined the way DeepSpeed users' scripts join it."""
    import datetime

    import torch

    if gpu:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if gpu else torch.device("cpu")
    # Imported only once this rank's device is bound, in case DeepSpeed's accelerator touches the current device.
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo",
                               timeout=datetime.timedelta(seconds=120))
    return dev


def use_bf16(gpu, dev):
    # bf16 where the GPU does it; fp32 otherwise (fp16's dynamic loss scale skips the first
    # steps on overflow, which would make "loss fell in 5 steps" flaky).
    # (capability, not is_bf16_supported(): that also says yes for emulated bf16 on sm_7x)
    import torch

    return gpu and torch.cuda.get_device_capability(dev)[0] >= 8


def build_engine(res, bf16, variant):
    """A tiny Llama from a config (no download), LoRA-wrapped by peft, partitioned by DeepSpeed."""
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)  # same init on every rank
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ * 2)
    model = LlamaForCausalLM(cfg)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                                   config=ds_config(bf16, variant))
    # The optimizer DeepSpeed chose for the config (ZeRO-3 wraps it): FusedAdam / DeepSpeedCPUAdam.
    chosen = type(getattr(optimizer, "optimizer", optimizer)).__name__
    res.figures["optimizer"] = chosen
    expected = EXPECTED_OPTIMIZER[variant]
    res.add(f"DeepSpeed chose {expected}", chosen == expected, chosen)
    return engine


def fixed_batch(dev):
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(dev)


def eval_loss(engine, ids):
    import torch

    engine.eval()
    with torch.no_grad():
        v = engine(input_ids=ids, labels=ids).loss.float().item()
    engine.train()
    return v


def train_step(engine, ids):
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    return loss.float().item()


def snapshot(engine):
    import deepspeed

    named = list(engine.module.named_parameters())
    # ZeRO-3 keeps only a shard per rank (shape 0 locally): gather to compare whole tensors.
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        return {n: p.detach().float().cpu().clone() for n, p in named}


def sync(gpu):
    if gpu:
        import torch

        torch.cuda.synchronize()


def timed_steps(engine, ids, steps, gpu):
    """(per-step training losses, seconds for all steps)."""
    sync(gpu)
    t0 = time.perf_counter()
    losses = [train_step(engine, ids) for _ in range(steps)]
    sync(gpu)
    return losses, time.perf_counter() - t0


def train_and_check(res, engine, ids, steps, gpu):
    """Train `steps` steps on the fixed batch; check the loss and which weights moved. Returns the last loss."""
    before = snapshot(engine)
    loss_first = eval_loss(engine, ids)
    losses, dt = timed_steps(engine, ids, steps, gpu)
    loss_last = eval_loss(engine, ids)
    after = snapshot(engine)
    check_loss(res, losses, loss_first, loss_last, steps, dt)
    check_weights(res, before, after)
    return loss_last


def check_loss(res, losses, loss_first, loss_last, steps, dt):
    res.figures.update(loss_first=loss_first, loss_last=loss_last, train_losses=losses, steps=steps,
                       steps_per_s=steps / dt if dt > 0 else None)
    finite = all(x == x and abs(x) != float("inf") for x in losses + [loss_first, loss_last])
    res.add("loss finite", finite, "losses %s" % [f"{x:.4f}" for x in losses])
    res.add(f"loss fell after {steps} steps", loss_last < loss_first, f"{loss_first:.4f} -> {loss_last:.4f}")


def check_weights(res, before, after):
    """LoRA trains the adapters only: every LoRA tensor moved, no base tensor did."""
    import torch

    lora = [n for n in before if "lora_" in n]
    base = [n for n in before if "lora_" not in n]
    lora_changed = [n for n in lora if not torch.equal(before[n], after[n])]
    base_changed = [n for n in base if not torch.equal(before[n], after[n])]
    res.add("LoRA weights changed", bool(lora) and len(lora_changed) == len(lora),
            f"{len(lora_changed)}/{len(lora)} LoRA tensors changed")
    res.add("base weights unchanged", bool(base) and not base_changed,
            f"{len(base_changed)}/{len(base)} base tensors changed"
            + ((": " + ", ".join(base_changed[:3])) if base_changed else ""))
    res.figures["lora_tensors"], res.figures["base_tensors"] = len(lora), len(base)


def check_ranks_agree(res, loss_last, tol, dev):
    """Ranks agree: max - min of the loss across ranks."""
    import torch.distributed as dist

    hi = ranks.all_reduce_scalar(loss_last, dev, dist.ReduceOp.MAX)
    lo = ranks.all_reduce_scalar(loss_last, dev, dist.ReduceOp.MIN)
    spread = hi - lo
    res.figures["loss_rank_spread"] = spread
    res.add("ranks agree on loss", spread <= tol * max(1.0, abs(loss_last)), f"max-min {spread:.2e}")


def check_checkpoint(res, engine, ids, tol, ckpt):
    """Checkpoint round trip: save, move the weights with one more step, load, same loss again."""
    try:
        engine.save_checkpoint(ckpt, tag="smoke")
        loss_saved = eval_loss(engine, ids)
        train_step(engine, ids)
        loss_moved = eval_loss(engine, ids)
        engine.load_checkpoint(ckpt, tag="smoke")
        loss_loaded = eval_loss(engine, ids)
        same = abs(loss_loaded - loss_saved) <= tol * max(1.0, abs(loss_saved))
        res.add("checkpoint save/load same loss", same,
                f"saved {loss_saved:.6f}, after extra step {loss_moved:.6f}, loaded {loss_loaded:.6f}")
        res.figures.update(ckpt_loss_saved=loss_saved, ckpt_loss_loaded=loss_loaded)
    except Exception as e:
        import traceback
        traceback.print_exc()
        res.add("checkpoint save/load same loss", False, f"{type(e).__name__}: {e}")


def record_peak_memory(res, gpu, dev):
    """The largest rank's peak: GPU memory allocated, or (CPU) the process's max RSS."""
    import resource

    import torch
    import torch.distributed as dist

    if gpu:
        peak = torch.cuda.max_memory_allocated(dev) / 2 ** 20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux -> MB
    res.figures["peak_mem_mb"] = round(ranks.all_reduce_scalar(peak, dev, dist.ReduceOp.MAX), 1)
    # CPU: the kernel's max RSS covers the whole process, so a later config's figure includes the earlier ones.
    res.figures["peak_mem_kind"] = "gpu max_memory_allocated" if gpu else "cpu max RSS per rank, process so far"


if __name__ == "__main__":
    worker()
