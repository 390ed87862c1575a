"""Trainer job: the way most users run ZeRO-3. transformers `Trainer` with a DeepSpeed config (the `deepspeed=`
TrainingArguments path, "auto" values filled in by transformers), peft LoRA on a tiny Llama built from a config
(no download), in two runs of the same command, as a preempted job restarts: the first trains half the steps
and stops at a checkpoint; the second (a new process: accelerate allows one DeepSpeed Accelerator per process)
resumes from it (the global step must continue), runs DeepSpeed's zero_to_fp32 consolidation on the last
ZeRO-3 checkpoint, saves OUT/consolidated/model.safetensors and reloads it into a fresh model (every tensor must
match the trained one).

The gate runs both as 2 gloo ranks on CPU (DS_ACCELERATOR=cpu) or one rank per GPU (smoke.train starts them);
users can run the same job, twice, under the launchers they use, from /opt/train-image:
    torchrun --nproc_per_node 2 -m smoke.train_trainer --out /tmp/trainer
    deepspeed --num_gpus 2 --module smoke.train_trainer --out /tmp/trainer
    accelerate launch --use_deepspeed --num_processes 2 -m smoke.train_trainer --out /tmp/trainer
(on CPU: DS_ACCELERATOR=cpu). Exit status 0 iff every assertion passed; rank 0 prints them."""

import argparse
import os
import sys
import tempfile
import time

from smoke import launch, ranks, report

SEED = 1234
BATCH, SEQ, VOCAB = 4, 32, 256


def ds_config():
    """A user's ZeRO-3 config as the transformers docs write it: "auto" where the Trainer's arguments decide."""
    auto = "auto"
    return {
        "train_micro_batch_size_per_gpu": auto, "train_batch_size": auto, "gradient_accumulation_steps": auto,
        "gradient_clipping": auto,
        "optimizer": {"type": "AdamW", "params": {"lr": auto, "betas": auto, "eps": auto, "weight_decay": auto}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "stage3_gather_16bit_weights_on_model_save": True},
        "bf16": {"enabled": auto},
        "steps_per_print": 10 ** 9,
    }


def parse_args(argv):
    p = argparse.ArgumentParser(prog="smoke.train_trainer", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("SMOKE_CKPT_DIR"),
                   help="Trainer output_dir: checkpoints and the consolidated weights (default $SMOKE_CKPT_DIR, "
                        "else a new directory under the temp dir)")
    p.add_argument("--steps", type=int, default=int(os.environ.get("SMOKE_STEPS", "4")),
                   help="steps in all (at least 2): half before the checkpoint, half after the resume")
    p.add_argument("--phase", choices=("train", "resume"), default=os.environ.get("SMOKE_TRAINER_PHASE"),
                   help="train: steps 1..N/2, checkpoint; resume: from that checkpoint to N, consolidate, reload "
                        "(default: resume when OUT has the checkpoint, else train)")
    # The deepspeed launcher appends --local_rank=N; LOCAL_RANK in the environment says the same.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rank_env():
    """(rank, world, local rank, gpu?): torchrun's contract, which every launcher (and smoke.launch) follows;
    one process when started without a launcher."""
    env = dict(os.environ)
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        env.setdefault(k, v)
    if "SMOKE_MODE" not in env:
        import torch

        cpu = env.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available()
        env["SMOKE_MODE"] = "cpu" if cpu else "gpu"
    return ranks.rank_env(env)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    launch.start_rank()
    rank, world, local, gpu = rank_env()
    out = args.out or os.path.join(tempfile.gettempdir(), "smoke-trainer")
    first = max(1, args.steps // 2)
    phase = args.phase or ("resume" if os.path.isdir(os.path.join(out, f"checkpoint-{first}")) else "train")
    res = report.Result(f"trainer {phase}", "gpu" if gpu else "cpu")
    res.figures.update(phase=phase, out=out)
    try:
        (train_phase if phase == "train" else resume_phase)(res, out, first, gpu)
    except Exception as e:  # a broken stack must still produce a verdict, on every rank
        import traceback

        traceback.print_exc()
        res.add(f"Trainer {phase} ran", False, f"{type(e).__name__}: {e}")
    return finish(res, rank, world)


def finish(res, rank, world):
    """Rank 0 writes its result (when the gate asked for one) and prints the verdict; ranks leave together."""
    import torch.distributed as dist

    if os.environ.get("SMOKE_RESULT"):
        ranks.write_rank0_result(rank, res)
    if rank == 0:
        report.print_result(res.finish().to_dict(), ("steps", "loss_first", "loss_last"))
    if dist.is_initialized():
        ranks.leave_group(dist)
    ok = all(i["ok"] is not False for i in res.items)
    print(f"rank {rank}/{world} done: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


def train_phase(res, out, first, gpu):
    """Train `first` steps and stop with a checkpoint there, as a job that ran out of its time slot."""
    bf16 = use_bf16(gpu)
    res.figures["dtype"] = "bf16" if bf16 else "fp32"
    t0 = time.monotonic()
    trainer = train(out, first, first, bf16, gpu, resume=None)
    res.figures["train_seconds"] = round(time.monotonic() - t0, 2)
    losses = logged_losses(trainer)
    res.figures.update(losses=losses, steps=trainer.state.global_step)
    res.add(f"trained steps 1..{first}", sorted(losses) == list(range(1, first + 1)), sorted(losses))
    check_world(res, trainer)
    check_checkpoint_dir(res, os.path.join(out, f"checkpoint-{first}"), first)


def resume_phase(res, out, first, gpu):
    """A new process resumes from checkpoint-`first` up to twice that, consolidates the last checkpoint, reloads."""
    bf16 = use_bf16(gpu)
    res.figures["dtype"] = "bf16" if bf16 else "fp32"
    total, ckpt = 2 * first, os.path.join(out, f"checkpoint-{first}")
    if not res.add(f"checkpoint-{first} to resume from", os.path.isdir(ckpt),
                   ckpt if os.path.isdir(ckpt) else f"{ckpt}: missing (run the train phase first)"):
        return
    t0 = time.monotonic()
    resumed = train(out, first, total, bf16, gpu, resume=ckpt)
    t1 = time.monotonic()
    check_resume(res, ckpt, resumed, first, total)
    trained = gathered_weights(resumed.model_wrapped)
    check_consolidated(res, os.path.join(out, f"checkpoint-{total}"), trained, bf16)
    res.figures.update(resume_seconds=round(t1 - t0, 2), consolidate_seconds=round(time.monotonic() - t1, 2))


def use_bf16(gpu):
    # bf16 where the GPU does it (capability, as smoke.train decides), fp32 on CPU and older GPUs.
    import torch

    return gpu and torch.cuda.get_device_capability()[0] >= 8


def cpu_state():
    """On a machine with no accelerator, name the process group's backend the public way: accelerate's
    PartialState(backend="gloo") with DeepSpeed on, before TrainingArguments (use_configured_state). Left to
    TrainingArguments, which passes no backend with deepspeed=..., accelerate finds none for the CPU and counts
    one process while DeepSpeed counts them all (DeepSpeed's batch-size check then fails). Returns the
    TrainingArguments accelerator_config that uses it."""
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # what `accelerate launch --use_deepspeed` sets
    PartialState(backend="gloo")
    return {"use_configured_state": True}


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ * 2)


def lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def dataset(rows):
    """`rows` copies of one fixed batch of sequences, the same on every rank: the loss must fall step by step."""
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return [{"input_ids": ids[i % BATCH], "labels": ids[i % BATCH]} for i in range(rows)]


def train(out, save_steps, max_steps, bf16, gpu, resume):
    """One Trainer run as a user writes it: arguments (with the DeepSpeed config) first, then the model, so
    transformers builds it under ZeRO-3's partitioned init as from_pretrained would."""
    import transformers
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=out, max_steps=max_steps, save_strategy="steps", save_steps=save_steps, logging_steps=1,
        per_device_train_batch_size=BATCH, learning_rate=1e-2, lr_scheduler_type="constant", bf16=bf16,
        deepspeed=ds_config(), accelerator_config=None if gpu else cpu_state(), seed=SEED, report_to="none",
        disable_tqdm=True, dataloader_num_workers=0)
    transformers.set_seed(SEED)  # the same initial weights on every rank
    model = lora(AutoModelForCausalLM.from_config(tiny_config()))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = Trainer(model=model, args=args, train_dataset=dataset(BATCH * world * max_steps))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def logged_losses(trainer):
    """{step: training loss} from the Trainer's log history."""
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e and "step" in e}


def check_world(res, trainer):
    """The Trainer counts every rank the launcher started (a miscount trains each rank alone, or stops DeepSpeed)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    res.figures["world_size"] = trainer.args.world_size
    res.add(f"Trainer counts all {world} ranks", trainer.args.world_size == world,
            f"Trainer {trainer.args.world_size}, launcher {world}")


def check_checkpoint_dir(res, ckpt, step):
    """What a ZeRO-3 Trainer checkpoint holds: the Trainer's state, DeepSpeed's shards and its recovery script."""
    tag = os.path.join(ckpt, f"global_step{step}")
    have = {name: os.path.exists(os.path.join(ckpt, name))
            for name in ("trainer_state.json", "latest", "zero_to_fp32.py")}
    have[f"global_step{step}/"] = os.path.isdir(tag)
    missing = [name for name, ok in have.items() if not ok]
    res.add(f"checkpoint-{step} saved (ZeRO-3 shards, zero_to_fp32.py)", not missing,
            f"{ckpt}: missing {', '.join(missing)}" if missing else ckpt)


def check_resume(res, ckpt, resumed, first, total):
    """The resumed run continues at the checkpoint's step, ends at `total`, and starts from the trained weights:
    its first loss is below the first run's first loss (read from the checkpoint; a fresh start would repeat it)."""
    import json

    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        before = {e["step"]: e["loss"] for e in json.load(f)["log_history"] if "loss" in e}
    after = {step: loss for step, loss in logged_losses(resumed).items() if step > first}
    steps_after = sorted(after)
    res.figures.update(losses_first_run=before, losses_resumed=after, resumed_at=first,
                       global_step=resumed.state.global_step, steps=total)
    res.add(f"resume continued at step {first + 1} up to {total}",
            steps_after == list(range(first + 1, total + 1)) and resumed.state.global_step == total,
            f"logged steps {steps_after}, global_step {resumed.state.global_step}")
    if not before or not after:
        return
    losses = [before[s] for s in sorted(before)] + [after[s] for s in steps_after]
    res.figures.update(loss_first=losses[0], loss_last=losses[-1])
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    res.add("loss finite", finite, "losses %s" % [f"{x:.4f}" for x in losses])
    res.add("resumed from the trained weights (loss below the first step's)", after[steps_after[0]] < losses[0],
            f"step 1 {losses[0]:.4f}, step {steps_after[0]} {after[steps_after[0]]:.4f}")


def gathered_weights(engine):
    """The trained (LoRA) tensors, whole (ZeRO-3 keeps a shard per rank): a collective, every rank calls it."""
    import deepspeed

    named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        return {n: p.detach().float().cpu().clone() for n, p in named}


def check_consolidated(res, ckpt, trained, bf16):
    """zero_to_fp32 on the last checkpoint (rank 0, as a user runs it once), saved as OUT/consolidated/
    model.safetensors and loaded into a fresh LoRA model. The Trainer leaves frozen parameters out of a PEFT
    model's ZeRO checkpoint, so the consolidated weights are the adapter: exactly the trained tensors, each equal
    to the trained one (bf16 training keeps fp32 masters: compared at bf16's precision); the base weights come
    from where the base model came from."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file, save_file

    state = get_fp32_state_dict_from_zero_checkpoint(ckpt)
    path = os.path.join(os.path.dirname(ckpt), "consolidated", "model.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(state, path)
    fresh = lora(fresh_model())
    result = fresh.load_state_dict(load_file(path), strict=False)
    loaded = dict(fresh.named_parameters())
    res.figures.update(consolidated_tensors=len(state), trained_tensors=len(trained))
    res.add("zero_to_fp32 holds exactly the trained tensors", set(state) == set(trained),
            f"{len(state)} consolidated, {len(trained)} trained; only in one: "
            + ", ".join(sorted(set(state) ^ set(trained))[:3]))
    not_base = [k for k in result.missing_keys if k in trained] + list(result.unexpected_keys)
    tol = 1e-2 if bf16 else 1e-6
    differ = [n for n, t in trained.items()
              if n not in loaded or not torch.allclose(loaded[n].detach().float(), t, rtol=tol, atol=tol)]
    res.add("consolidated weights reload into a fresh model and match the trained ones",
            bool(trained) and not differ and not not_base,
            f"{len(trained) - len(differ)}/{len(trained)} tensors match"
            + ((": differ " + ", ".join(differ[:3])) if differ else "")
            + ((", not loaded/unexpected " + ", ".join(not_base[:3])) if not_base else ""))


def fresh_model():
    """A fresh, whole (not partitioned) model: the class's constructor, outside the Trainer's ZeRO-3 init."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(tiny_config())


if __name__ == "__main__":
    sys.exit(main())
