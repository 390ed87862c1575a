# Runs INSIDE a built image (`python /opt/train-image/smoke/installed.py`): what is really installed, as JSON.
# Stdlib only, and torch is imported last so a broken torch still yields the package list.
# Output contract: smoke/schemas/installed.schema.json.
import importlib.metadata as md
import json
import subprocess
import sys

NAMES = ["torch", "transformers", "deepspeed", "peft", "accelerate", "nvidia-ml-py", "flash-attn", "pynvml",
         "nvidia-ml-py3"]
out = {"python": ".".join(map(str, sys.version_info[:3])), "versions": {}, "torch_dists": 0}
# pip's check runs beside the rest (torch's import alone takes ~2 s): the two were most of a pin change's image check.
check = subprocess.Popen([sys.executable, "-m", "pip", "check"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
for name in NAMES:
    try:
        out["versions"][name] = md.version(name)
    except md.PackageNotFoundError:
        out["versions"][name] = None
# More than one distribution shipping top-level `torch` means a second torch was installed over the pin.
for dist in md.distributions():
    top = (dist.read_text("top_level.txt") or "").split()
    files = dist.files or []
    if "torch" in top or any(str(f).startswith("torch/__init__.py") for f in files):
        out["torch_dists"] += 1
try:
    import torch

    out["torch_cuda"] = torch.version.cuda
    out["torch_file"] = torch.__file__
except Exception as exc:  # noqa: BLE001 - any import failure is the finding
    out["torch_cuda"] = None
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
checked = check.communicate()[0]
out["pip_check"] = {"ok": check.returncode == 0, "output": checked.strip()[-2000:]}
print("INSTALLED-JSON " + json.dumps(out, sort_keys=True))
