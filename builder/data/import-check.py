"""The training surface imported as users import it, in a throwaway venv of one entry's packages, on the CPU.

Run by builder/boundary/importcheck.py as `python import-check.py --out FILE [--pins JSON]` with the venv's
interpreter, CUDA_VISIBLE_DEVICES="" and DS_ACCELERATOR=cpu. It runs in that interpreter, with only the entry's
packages: it imports nothing of builder/.

Each step is its own try block: a progress line on stdout (`✓ import torch 2.13.0 (8.1s)`) and one JSON line in
FILE (step, ok, seconds, error type, message, the traceback's last frames). A failure is also classified as
"consumer -> provider": the distribution whose code could not use another's (transformers' trainer.py importing a
name from accelerate.utils), read from the error (the module, path or callee it names) and from the traceback (the
innermost frame outside the provider), with files mapped to distributions by importlib.metadata. Exit 0 when every
step passed, 1 when one failed.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import sysconfig
import tempfile
import time
import traceback

FRAMES = 6  # the traceback's last frames kept per failure: enough to see the import chain across packages

# What an error says about the code it could not use: a module (and the name it lacked), or a callee.
_IMPORT_NAME = re.compile(r"cannot import name '(?P<name>[^']+)' from (?:partially initialized module )?"
                          r"'(?P<module>[^']+)'(?:.*\((?P<path>/[^()]+)\))?")
_NO_MODULE = re.compile(r"No module named '(?P<module>[^']+)'")
_MODULE_ATTR = re.compile(r"module '(?P<module>[^']+)' has no attribute '(?P<name>[^']+)'")
_OBJECT_ATTR = re.compile(r"(?:type object '(?P<type>[\w.]+)'|'(?P<cls>[\w.]+)' object) has no attribute "
                          r"'(?P<name>[^']+)'")
_CALL = re.compile(r"(?P<callee>[A-Za-z_][\w.]*)\(\) (?:got an unexpected keyword argument '(?P<name>[^']+)'|"
                   r"got multiple values for argument '(?P<multi>[^']+)'|missing \d+ required|takes )")
# transformers' own version gates: "Using the `Trainer` with `PyTorch` requires `accelerate>=0.26.0`".
_REQUIRES = re.compile(r"requires [`'\"]?(?P<dist>[A-Za-z0-9][A-Za-z0-9_.-]*)\s*(?:>=|==|~=|<=|>|<)")


def classify(error: str, message: str, frames: list, owner, callee_owner=None) -> dict:
    """{consumer, provider, name, module} of one failure (None where unknown). `frames`: the traceback's file paths,
    innermost last; `owner(path or module)`: the distribution it belongs to, or None (stdlib, this script);
    `callee_owner(qualified name)`: the distribution defining a callee or class, for a TypeError/AttributeError."""
    found = {"name": None, "module": None, "provider": None}
    m = _IMPORT_NAME.search(message)
    if m:
        found.update(name=m["name"], module=m["module"], provider=owner(m["path"] or m["module"]) or owner(m["module"]))
    elif (m := _NO_MODULE.search(message)) is not None:
        # A submodule a package lacks names that package; a top-level module nothing installs names itself.
        found.update(module=m["module"], provider=owner(m["module"]) or _canonical(m["module"].split(".")[0]))
    elif error == "AttributeError" and (m := _MODULE_ATTR.search(message)) is not None:
        found.update(name=m["name"], module=m["module"], provider=owner(m["module"]))
    elif error == "TypeError" and (m := _CALL.search(message)) is not None and callee_owner is not None:
        found.update(name=m["name"] or m["multi"], module=m["callee"], provider=callee_owner(m["callee"]))
    elif error == "AttributeError" and (m := _OBJECT_ATTR.search(message)) is not None and callee_owner:
        cls = m["cls"] or m["type"]
        found.update(name=m["name"], module=cls, provider=callee_owner(cls) if cls else None)
    elif (m := _REQUIRES.search(message)) is not None:
        found.update(provider=_canonical(m["dist"]))
    owners = [owner(path) for path in reversed(frames)]
    if found["provider"] is None:  # nothing named: the code that raised is the provider
        found["provider"] = next((o for o in owners if o), None)
    found["consumer"] = next((o for o in owners if o and o != found["provider"]), None)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def root_cause(exc: BaseException) -> BaseException:
    """The exception a chain started with: transformers' lazy module re-raises an ImportError as RuntimeError
    ("Failed to import transformers.trainer because of the following error"), whose cause names the packages."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None:
            break
        exc = nxt
    return exc


# --- what installed files belong to ----------------------------------------------------------------------


def make_owner():
    """owner(path or module name) -> canonical distribution name or None, for this interpreter's environment."""
    from importlib import metadata

    tops = metadata.packages_distributions()
    roots = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}, key=len, reverse=True)

    def by_file(path: str, dists: list):
        # A namespace shared by several distributions (nvidia/): the one whose RECORD lists the file.
        for dist in dists:
            for f in metadata.distribution(dist).files or ():
                if os.path.realpath(f.locate()) == path:
                    return dist
        return dists[0]

    def owner(where: str):
        if not where:
            return None
        if os.sep not in where:
            dists = tops.get(where.split(".")[0])
            return _canonical(dists[0]) if dists else None
        path = os.path.realpath(where)
        root = next((r for r in roots if path.startswith(r + os.sep)), None)
        if root is None:
            return None
        top = path[len(root) + 1:].split(os.sep)[0].split(".")[0]  # pkg/… or module.py or module.cpython-311….so
        dists = tops.get(top)
        if not dists:
            return None
        return _canonical(dists[0] if len(dists) == 1 else by_file(path, dists))

    return owner


def make_callee_owner(owner, tb, obj=None):
    """callee_owner(qualified name) -> distribution: the object an AttributeError names (`obj`, Python 3.10+), else
    the one found in the failing frame's names or in a loaded module, by the module that defines it."""
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next

    def callee_owner(qualname: str):
        first = qualname.split(".")[0]
        found = None
        if obj is not None:
            found = obj if isinstance(obj, type) else type(obj)
        elif frame is not None:
            found = frame.f_locals.get(first, frame.f_globals.get(first))
        if found is None:
            found = next((getattr(m, first) for m in list(sys.modules.values())
                          if getattr(getattr(m, first, None), "__qualname__", None) == first), None)
        module = getattr(found, "__module__", None) if found is not None else None
        return owner(module) if isinstance(module, str) else None

    return callee_owner


def version_of(dist):
    from importlib import metadata

    if dist is None:
        return None
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


# --- the steps ----------------------------------------------------------------------------------------------


def zero3_config() -> dict:
    """A user's ZeRO-3 config as the transformers docs write it ("auto" where the Trainer decides)."""
    auto = "auto"
    return {"train_micro_batch_size_per_gpu": auto, "gradient_accumulation_steps": auto, "gradient_clipping": auto,
            "optimizer": {"type": "AdamW", "params": {"lr": auto}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}, "bf16": {"enabled": auto}}


def step_torch():
    import torch

    return f"torch {torch.__version__} (CUDA build {torch.version.cuda}, no GPU used)"


def step_deepspeed():
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    return f"deepspeed {deepspeed.__version__}, accelerator {get_accelerator().device_name()}, no ops built"


def step_trainer():
    from transformers import Trainer, TrainingArguments  # noqa: F401  (the import is the check)

    return "Trainer, TrainingArguments"


def step_training_arguments():
    # deepspeed= makes TrainingArguments build transformers' DeepSpeed config and accelerate's DeepSpeedPlugin.
    from transformers import TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, deepspeed=zero3_config(), report_to=[])
        stage = args.hf_deepspeed_config.config["zero_optimization"]["stage"]
    del args  # transformers keeps ZeRO-3 "on" while it lives (a weak reference): not for the model built later
    gc.collect()
    return f"ZeRO-{stage} config accepted"


def step_hf_deepspeed_config():
    try:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig
    except ModuleNotFoundError:  # transformers < 4.32 kept it at the top level
        from transformers.deepspeed import HfDeepSpeedConfig
    HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    return HfDeepSpeedConfig.__module__


def step_accelerate():
    from accelerate import Accelerator  # noqa: F401

    return "Accelerator"


def step_peft():
    # A tiny random Llama from a config (no download), LoRA on it, one forward and backward pass on the CPU.
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                               task_type="CAUSAL_LM"))
    ids = torch.randint(0, 64, (2, 8))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return f"LoRA on a tiny Llama: {trainable} trainable parameters, loss {loss.item():.2f}"


def step_datasets():
    import datasets

    return f"Dataset of {len(datasets.Dataset.from_dict({'text': ['a', 'b']}))} rows"


def step_tokenizers():
    from tokenizers import Tokenizer, models

    return f"{type(Tokenizer(models.WordLevel({'a': 0, '[UNK]': 1}, unk_token='[UNK]'))).__name__}"


def step_huggingface_hub():
    import huggingface_hub

    return f"huggingface_hub {huggingface_hub.__version__}"


# (title, function, the pin it needs or None for always). Order: what users import first, torch before all.
STEPS = (
    ("import torch", step_torch, None),
    ("import deepspeed", step_deepspeed, None),
    ("from transformers import Trainer, TrainingArguments", step_trainer, None),
    ("TrainingArguments(deepspeed=<ZeRO-3 dict>)", step_training_arguments, None),
    ("HfDeepSpeedConfig", step_hf_deepspeed_config, None),
    ("from accelerate import Accelerator", step_accelerate, None),
    ("get_peft_model(tiny Llama, LoraConfig)", step_peft, None),
    ("import datasets", step_datasets, "datasets"),
    ("import tokenizers", step_tokenizers, "tokenizers"),
    ("import huggingface_hub", step_huggingface_hub, "huggingface-hub"),
)
SKIPPED = {"flash-attn": ("import flash_attn", "needs a GPU driver to import; the smoke gate imports it on a GPU")}


def run_step(title: str, fn, owner) -> dict:
    started = time.monotonic()
    try:
        detail = fn()
    except Exception as exc:  # noqa: BLE001 - every failure is the finding
        return failure(title, exc, time.monotonic() - started, owner)
    return {"step": title, "ok": True, "seconds": round(time.monotonic() - started, 2), "detail": detail}


def failure(title: str, exc: BaseException, seconds: float, owner) -> dict:
    root = root_cause(exc)
    summary = traceback.extract_tb(root.__traceback__)
    kept = [f for f in summary if not f.filename.startswith("<")]  # <frozen importlib._bootstrap>
    message = str(root).strip().splitlines()[0] if str(root).strip() else ""
    found = classify(type(root).__name__, message, [f.filename for f in kept], owner,
                     make_callee_owner(owner, root.__traceback__, getattr(root, "obj", None)))
    result = {"step": title, "ok": False, "seconds": round(seconds, 2), "error": type(root).__name__,
              "message": _short(message),
              "frames": [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in kept[-FRAMES:]]}
    if root is not exc:
        said = str(exc).strip()
        result["raised"] = _short(f"{type(exc).__name__}: {said.splitlines()[0] if said else ''}")
    for role in ("consumer", "provider"):
        dist = found[role]
        result[role] = {"name": dist, "version": version_of(dist)} if dist else None
    result.update(name=found["name"], module=found["module"])
    return result


def _short(text: str) -> str:
    """Paths under site-packages made relative to it: the venv is a temporary directory, gone after the check."""
    return text.replace(sysconfig.get_paths()["purelib"] + os.sep, "")


def show(result: dict) -> None:
    if result.get("skipped"):
        print(f"- {result['step']}: skipped ({result['skipped']})", flush=True)
        return
    mark = "✓" if result["ok"] else "✕"
    tail = result.get("detail") or f"{result['error']}: {result['message']}"
    print(f"{mark} {result['step']} ({result['seconds']:.1f}s) — {tail}", flush=True)
    for frame in result.get("frames", ()) if not result["ok"] else ():
        print(f"    at {frame}", flush=True)
    if not result["ok"]:
        who = " -> ".join(f"{r['name']} {r['version']}" for r in (result["consumer"], result["provider"]) if r)
        print(f"    {who or 'no package named'}", flush=True)


def parse(argv: list) -> tuple[str, dict]:
    """(FILE, pins) from `--out FILE [--pins JSON]`. Not argparse: builder/ leaves that to its CLI (test_layering)."""
    given = dict(zip(argv[::2], argv[1::2]))
    if len(argv) % 2 or set(given) - {"--out", "--pins"} or "--out" not in given:
        raise SystemExit(f"usage: import-check.py --out FILE [--pins JSON]: {' '.join(argv)}")
    return given["--out"], json.loads(given.get("--pins", "{}"))


def main(argv=None) -> int:
    out_path, pins = parse(sys.argv[1:] if argv is None else argv)
    owner = make_owner()
    failed = False
    with open(out_path, "a", encoding="utf-8") as out:
        for title, fn, needs in STEPS:
            if needs is not None and not pins.get(needs):
                continue
            result = run_step(title, fn, owner)
            failed |= not result["ok"]
            show(result)
            out.write(json.dumps(result) + "\n")
            out.flush()
            if title == "import torch" and not result["ok"]:
                break  # every other step imports torch
        for name, (title, why) in SKIPPED.items():
            if pins.get(name):
                result = {"step": title, "ok": None, "skipped": why}
                show(result)
                out.write(json.dumps(result) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
