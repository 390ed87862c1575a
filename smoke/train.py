"""train check: tiny DeepSpeed ZeRO-3 + peft LoRA jobs on every visible GPU (2 gloo ranks on CPU).

Runs what users run, nothing in DeepSpeed patched: DeepSpeed's default optimizer config
({"type": "AdamW"}: FusedAdam on GPU, DeepSpeed's C++ FusedAdam on the CPU accelerator), then the same job
with ZeRO-3 CPU offload (offload_optimizer: {device: cpu}: DeepSpeedCPUAdam). On CPU the accelerator's own
ops (shm_comm, the CPU Adam kernels) are JIT-built by DeepSpeed as for any user, so g++, ninja and the
Python headers must be in the image. Proves the stack composes: transformers builds a model from a config
(no download), peft wraps it, DeepSpeed partitions it (stage3_param_persistence_threshold 0 so even tiny
params are partitioned), trains N steps on a fixed batch, saves and reloads a checkpoint.
Parent side (run) launches ranks via smoke.launch; worker side (worker) is `python -m smoke.train`.
"""

import os
import shutil
import tempfile

from smoke import launch
from smoke.report import read_json

SEED = 1234
BATCH, SEQ, VOCAB = 4, 32, 256


# The two DeepSpeed configs users start from; only the optimizer placement differs.
VARIANTS = ("adamw", "offload")
EXPECTED_OPTIMIZER = {"adamw": "FusedAdam", "offload": "DeepSpeedCPUAdam"}


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
    started = __import__("time").monotonic()
    if mode == "cpu":
        # DeepSpeed's CPU accelerator JIT-builds shm_comm and its Adam kernels: a toolchain is part of the image.
        env = launch.base_env(mode)
        cxx, ninja = compiler_on_path(env.get("PATH")), shutil.which("ninja", path=env.get("PATH"))
        res.figures["cxx"], res.figures["ninja"] = cxx, ninja
    for variant in VARIANTS:
        left = timeout - (__import__("time").monotonic() - started)
        _run_variant(res, mode, n, out_dir, steps, max(30.0, left), variant)
    res.figures["wall_seconds"] = round(__import__("time").monotonic() - started, 2)
    f = res.figures
    parts = []
    for variant in VARIANTS:
        v = f.get(variant) or {}
        if v.get("loss_first") is not None and v.get("loss_last") is not None:
            parts.append(f"{variant} ({v.get('optimizer')}) loss {v['loss_first']:.4f} -> {v['loss_last']:.4f}")
    if parts:
        res.summary = f"{n} ranks {f.get('dtype')}: " + "; ".join(parts)


def _run_variant(res, mode, n, out_dir, steps, timeout, variant):
    env = launch.base_env(mode)
    ckpt = tempfile.mkdtemp(prefix="smoke-ckpt-")
    result_path = os.path.join(out_dir, f".train-{variant}.rank0.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    env.update(SMOKE_MODE=mode, SMOKE_STEPS=str(steps), SMOKE_CKPT_DIR=ckpt, SMOKE_RESULT=result_path,
               SMOKE_VARIANT=variant)
    if mode == "cpu":
        # Two ranks share the cores; oversubscribed OpenMP threads make gloo crawl.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // n)))
    try:
        r = launch.run_ranks("smoke.train", n, out_dir, f"train-{variant}", timeout, env)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    data = read_json(result_path) or {}
    for item in data.get("items", []):
        res.items.append(dict(item, name=f"{variant}: {item['name']}"))
    figs = data.get("figures", {})
    if "dtype" in figs:
        res.figures["dtype"] = figs.pop("dtype")
    figs["wall_seconds"] = r["seconds"]
    figs["logs"] = r["logs"]
    res.figures[variant] = figs
    ok = not r["timed_out"] and all(rc == 0 for rc in r["rcs"])
    if r["timed_out"]:
        res.add(f"{variant}: ranks finished within timeout", False, f"killed after {timeout:.0f}s (hang?)")
    else:
        res.add(f"{variant}: all ranks exited 0", ok, "exit codes {}".format(r["rcs"]))
    if not data:
        res.add(f"{variant}: rank 0 wrote its result", False, "no result from rank 0")
    if not ok or not data or any(i["ok"] is False for i in data.get("items", [])):
        logs = launch.read_logs(r["logs"])
        res.diagnose(logs)
        if r["first_failure"] is not None:
            first = r["first_failure"]
            res.hint(f"{variant}: rank {first} failed first; log tail:\n"
                     + launch.tail(launch.read_logs([r["logs"][first]]), 8))


# ----------------------------------------------------------------------------- worker side

def worker():
    launch.die_with_parent()
    import datetime
    import json
    import resource
    import time

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    mode, steps = os.environ["SMOKE_MODE"], int(os.environ.get("SMOKE_STEPS", "5"))
    gpu = mode == "gpu"
    if gpu:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if gpu else torch.device("cpu")

    import deepspeed
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    items, figs = [], {}

    def add(name, ok, detail=""):
        items.append({"name": name, "ok": bool(ok), "detail": str(detail)})

    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo",
                               timeout=datetime.timedelta(seconds=120))
    # bf16 where the GPU does it; fp32 otherwise (fp16's dynamic loss scale skips the first
    # steps on overflow, which would make "loss fell in 5 steps" flaky).
    # (capability, not is_bf16_supported(): that also says yes for emulated bf16 on sm_7x)
    bf16 = gpu and torch.cuda.get_device_capability(dev)[0] >= 8
    figs["dtype"] = "bf16" if bf16 else "fp32"

    torch.manual_seed(SEED)  # same init on every rank
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ * 2)
    model = LlamaForCausalLM(cfg)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    variant = os.environ.get("SMOKE_VARIANT", "adamw")
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                                   config=ds_config(bf16, variant))
    # The optimizer DeepSpeed chose for the config (ZeRO-3 wraps it): FusedAdam / DeepSpeedCPUAdam.
    inner = getattr(optimizer, "optimizer", optimizer)
    figs["optimizer"] = type(inner).__name__
    expected = EXPECTED_OPTIMIZER[variant]
    add(f"DeepSpeed chose {expected}", figs["optimizer"] == expected, figs["optimizer"])
    # Same fixed batch on every rank, so every rank must compute the same loss: a cheap
    # proof that the partitioned parameters agree after the steps.
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(dev)

    def eval_loss():
        engine.eval()
        with torch.no_grad():
            v = engine(input_ids=ids, labels=ids).loss.float().item()
        engine.train()
        return v

    def snapshot():
        named = list(engine.module.named_parameters())
        # ZeRO-3 keeps only a shard per rank (shape 0 locally): gather to compare whole tensors.
        with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
            return {n: p.detach().float().cpu().clone() for n, p in named}

    def sync():
        if gpu:
            torch.cuda.synchronize()

    before = snapshot()
    loss_first = eval_loss()
    losses = []
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.float().item())
    sync()
    dt = time.perf_counter() - t0
    loss_last = eval_loss()
    after = snapshot()

    figs.update(loss_first=loss_first, loss_last=loss_last, train_losses=losses, steps=steps,
                steps_per_s=steps / dt if dt > 0 else None)
    finite = all(map(lambda x: x == x and abs(x) != float("inf"), losses + [loss_first, loss_last]))
    add("loss finite", finite, "losses %s" % [f"{x:.4f}" for x in losses])
    add(f"loss fell after {steps} steps", loss_last < loss_first, f"{loss_first:.4f} -> {loss_last:.4f}")

    lora = [n for n in before if "lora_" in n]
    base = [n for n in before if "lora_" not in n]
    lora_changed = [n for n in lora if not torch.equal(before[n], after[n])]
    base_changed = [n for n in base if not torch.equal(before[n], after[n])]
    add("LoRA weights changed", lora and len(lora_changed) == len(lora),
        f"{len(lora_changed)}/{len(lora)} LoRA tensors changed")
    add("base weights unchanged", base and not base_changed,
        f"{len(base_changed)}/{len(base)} base tensors changed"
        + ((": " + ", ".join(base_changed[:3])) if base_changed else ""))
    figs["lora_tensors"], figs["base_tensors"] = len(lora), len(base)

    # Ranks agree: max - min of the loss across ranks.
    t = torch.tensor([loss_last], dtype=torch.float64, device=dev)
    hi, lo = t.clone(), t.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    spread = (hi - lo).item()
    tol = 1e-3 if bf16 else 1e-5
    figs["loss_rank_spread"] = spread
    add("ranks agree on loss", spread <= tol * max(1.0, abs(loss_last)), f"max-min {spread:.2e}")

    # Checkpoint round trip: save, move the weights with one more step, load, same loss again.
    ckpt = os.environ["SMOKE_CKPT_DIR"]
    try:
        engine.save_checkpoint(ckpt, tag="smoke")
        loss_saved = eval_loss()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        loss_moved = eval_loss()
        engine.load_checkpoint(ckpt, tag="smoke")
        loss_loaded = eval_loss()
        same = abs(loss_loaded - loss_saved) <= tol * max(1.0, abs(loss_saved))
        add("checkpoint save/load same loss", same,
            f"saved {loss_saved:.6f}, after extra step {loss_moved:.6f}, loaded {loss_loaded:.6f}")
        figs.update(ckpt_loss_saved=loss_saved, ckpt_loss_loaded=loss_loaded)
    except Exception as e:
        import traceback
        traceback.print_exc()
        add("checkpoint save/load same loss", False, f"{type(e).__name__}: {e}")

    if gpu:
        peak = torch.cuda.max_memory_allocated(dev) / 2 ** 20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux -> MB
    pk = torch.tensor([peak], dtype=torch.float64, device=dev)
    dist.all_reduce(pk, op=dist.ReduceOp.MAX)
    figs["peak_mem_mb"] = round(pk.item(), 1)
    figs["peak_mem_kind"] = "gpu max_memory_allocated" if gpu else "cpu max RSS per rank"

    if rank == 0:
        with open(os.environ["SMOKE_RESULT"] + ".tmp", "w") as f:
            json.dump({"items": items, "figures": figs}, f)
        os.replace(os.environ["SMOKE_RESULT"] + ".tmp", os.environ["SMOKE_RESULT"])
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{world} done: " + ("ok" if all(i["ok"] for i in items) else "FAILED"))


if __name__ == "__main__":
    worker()
