"""compat.yaml read once, and the lookups every judge shares (a torch minor, a GPU's compute capability).

The judge (compat.py) and the knowledge sources it consults (archs.py …) both read it, so it lives below them:
neither needs the other to find a table."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

import yaml
from packaging.version import Version


@lru_cache(maxsize=1)
def rules() -> dict:
    text = resources.files("builder").joinpath("data/compat.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def minor(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


def gpu_capability(gpu: str) -> str | None:
    """The compute capability of a GPU model as users write it: "H100", "RTX 5090", "Tesla V100-SXM2", "a100"
    (case, spaces, '-'/'_' and vendor words do not matter); None when compat.yaml toolchain.gpus lacks it."""
    gpus = rules()["toolchain"]["gpus"]
    keys, key = _gpu_keys(tuple(gpus["capability"].items())), _gpu_key(gpu)
    if key in keys:
        return keys[key]
    # A variant of a listed model (H100-SXM5-80GB, A100-PCIE-40GB): the longest listed name it begins with.
    model = max((k for k in keys if key.startswith(k) and not key[len(k):len(k) + 1].isdigit()), key=len, default=None)
    if model is not None:
        return keys[model]
    return next((f["capability"] for f in gpus.get("families", ()) if re.match(f["match"], key)), None)


def _gpu_key(name: str) -> str:
    key = re.sub(r"[\s_-]+", "", name.upper())
    for word in ("NVIDIA", "TESLA", "GEFORCE", "QUADRO"):
        key = key.removeprefix(word)
    return key


@lru_cache(maxsize=4)
def _gpu_keys(items: tuple) -> dict[str, str]:
    return {_gpu_key(name): cap for name, cap in items}
