"""train check: a tiny DeepSpeed ZeRO-3 + peft LoRA job on every visible GPU (2 gloo ranks on CPU).

Proves the training stack composes: transformers builds a model from a config (no download),
peft wraps it, DeepSpeed partitions it (stage3_param_persistence_threshold 0 so even tiny
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


def ds_config(bf16):
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        # torch's AdamW: FusedAdam would JIT-build with nvcc, which a runtime image lacks.
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
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
    env = launch.base_env(mode)
    ckpt = tempfile.mkdtemp(prefix="smoke-ckpt-")
    result_path = os.path.join(out_dir, ".train.rank0.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    env.update(SMOKE_MODE=mode, SMOKE_STEPS=str(steps), SMOKE_CKPT_DIR=ckpt, SMOKE_RESULT=result_path)
    res.figures["ranks"] = n
    if mode == "cpu":
        # Two ranks share the cores; oversubscribed OpenMP threads make gloo crawl.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // n)))
        # DeepSpeed's CPU accelerator JIT-builds its shm_comm op at init: it needs a C++
        # compiler and ninja, and takes ~80 s on 2 cores.  The op only speeds up CPU-only
        # training, which is not what a GPU image is for, so by default the workers skip it
        # (DeepSpeed then uses plain gloo collectives).  SMOKE_DS_SHM=1 builds it as DeepSpeed
        # would; then a missing toolchain is a failure, reported with what is missing.
        cxx, ninja = compiler_on_path(env.get("PATH")), shutil.which("ninja", path=env.get("PATH"))
        res.figures["cxx"], res.figures["ninja"] = cxx, ninja
        missing = [x for x, p in (("C++ compiler (g++)", cxx), ("ninja", ninja)) if not p]
        if env.get("SMOKE_DS_SHM") == "1":
            res.figures["ds_shm_comm"] = "built"
            if missing:
                res.add("toolchain for DeepSpeed shm_comm JIT", False, "{} not on PATH".format(" and ".join(missing)))
                res.hint("SMOKE_DS_SHM=1: DeepSpeed JIT-builds shm_comm on CPU and needs g++ and ninja "
                         "on PATH (apt-get install g++; pip install ninja; venv bin on PATH)")
        else:
            env["SMOKE_DS_NO_SHM"] = "1"
            res.figures["ds_shm_comm"] = "skipped (plain gloo; SMOKE_DS_SHM=1 to build)"
    try:
        r = launch.run_ranks("smoke.train", n, out_dir, "train", timeout, env)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    data = read_json(result_path) or {}
    res.items.extend(data.get("items", []))
    res.figures.update(data.get("figures", {}))
    res.figures["wall_seconds"] = r["seconds"]
    res.figures["logs"] = r["logs"]
    ok = not r["timed_out"] and all(rc == 0 for rc in r["rcs"])
    if r["timed_out"]:
        res.add("ranks finished within timeout", False, f"killed after {timeout}s (hang?)")
    else:
        res.add("all ranks exited 0", ok, "exit codes {}".format(r["rcs"]))
    if not data:
        res.add("rank 0 wrote its result", False, "no result from rank 0")
    if not ok or not data or any(i["ok"] is False for i in res.items):
        logs = launch.read_logs(r["logs"])
        res.diagnose(logs)
        if r["first_failure"] is not None:
            first = r["first_failure"]
            res.hint(f"rank {first} failed first; log tail:\n"
                     + launch.tail(launch.read_logs([r["logs"][first]]), 8))
    f = res.figures
    if f.get("loss_first") is not None and f.get("loss_last") is not None:
        res.summary = (f"{n} ranks {f.get('dtype')}, loss {f['loss_first']:.4f} -> {f['loss_last']:.4f}, "
                       f"{f.get('steps_per_s') or 0:.2f} steps/s, peak {f.get('peak_mem_mb')} MB")


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
    if os.environ.get("SMOKE_DS_NO_SHM"):
        import importlib
        # importlib, not `import deepspeed.comm.torch as m`: that name resolves to the real
        # torch module re-exported by deepspeed.comm.
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
        ds_torch_comm.build_shm_op = lambda: None  # see run(): keep DeepSpeed on plain gloo
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
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                           config=ds_config(bf16))
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
