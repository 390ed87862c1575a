"""How far each tag has been proven, in one phrase: built by our CI or not, the gate level reached and when.

Read from the committed catalog (images.json, written by `catalog` from the step reports), so `list` and
the README table say the same as IMAGES.md without reading reports themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

from builder.model.matrix import Entry

CATALOG = Path("images.json")


def gate_phrase(level: dict | None) -> str:
    """`GPU: 8 × NVIDIA H100 80GB HBM3` / `CPU`: the gate level in words."""
    if not level:
        return "none"
    if level.get("kind") == "gpu":
        return f"GPU: {level.get('gpu_count') or '?'} × {level.get('gpu_model') or 'unknown GPU'}"
    return "CPU"


def levels(path: Path = CATALOG) -> dict[str, dict]:
    """tag → {"gate": phrase, "date": YYYY-MM-DD or None} from the catalog; empty when there is none."""
    try:
        images = json.loads(path.read_text(encoding="utf-8")).get("images") or []
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}
    if not isinstance(images, list):
        return {}  # a damaged catalog proves nothing: every tag reads "gate none"
    out = {}
    for image in images:
        if not isinstance(image, dict) or not isinstance(image.get("tag"), str):
            continue
        smoke = image.get("smoke") if isinstance(image.get("smoke"), dict) else {}
        passed = smoke.get("verdict") == "passed"
        level = smoke.get("level") if isinstance(smoke.get("level"), dict) else (
            {"kind": smoke["mode"]} if isinstance(smoke.get("mode"), str) else None)
        out[image["tag"]] = {"gate": gate_phrase(level) if passed else "none",
                             "date": smoke.get("date") if passed else None}
    return out


def phrase(entry: Entry, known: dict[str, dict]) -> str:
    """`CI build, gate CPU (2026-12-03)` / `not built by CI, gate none`."""
    found = known.get(entry.tag) or {"gate": "none", "date": None}
    built = "CI build" if entry.ci else "not built by CI"
    return f"{built}, gate {found['gate']}" + (f" ({found['date']})" if found.get("date") else "")


def engine_phrase(docker) -> str:
    """`Docker 26.1.5 (buildx, containerd image store)`: what built an image, from its build report's or provenance's
    `docker` object; "" where it names no engine (reports written before builds recorded it)."""
    if not isinstance(docker, dict) or not docker.get("engine"):
        return ""
    how = "buildx" if docker.get("mode") == "buildx" else "legacy docker build, BuildKit"
    store = docker.get("image_store")
    store = f", {store} image store" if store in ("containerd", "classic") else ""
    return f"Docker {str(docker['engine'])[:40]} ({how}{store})"
