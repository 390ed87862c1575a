"""Run the in-image smoke gate (`smoke all`, from smoke/) in a fresh container and read its verdict.

The container has no network, GPUs through device requests, a time limit per check; what the gate writes
is held to smoke/schemas/ before a verdict is believed. The `smoke` step runs it on a built image and writes
the report; `verify` runs it on a pulled image on the user's host.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from builder import log
from builder.boundary import engine
from builder.errors import UserError
from builder.model import schemas, yamlread

# Seconds per check inside the image; `all` enforces it per check. On CPU, train is the long one: DeepSpeed's
# CPU accelerator JIT-builds shm_comm, its C++ FusedAdam and CPUAdam as it does for any user (~4 min on 2 cores).
CHECK_TIMEOUT = 900
DEFAULT_SHM = "8g"  # Docker's 64 MB default breaks NCCL and DataLoader workers; the env check says so
MAX_OUTPUT = 8 << 20  # per file of the gate's output: its results are kilobytes; more is refused, not read


def run_gate(image_ref: str, gpus: bool, timeout: int = CHECK_TIMEOUT, shm_size: str = DEFAULT_SHM,
             only: str | None = None) -> dict:
    """Run `smoke all` in a fresh container of `image_ref`; return the report (not yet written)."""
    image = engine.image_or_none(image_ref)
    if image is None:
        raise UserError(f"image {image_ref} is not here", "build it (`python -m builder build TAG`) or pull it")
    out_dir = Path(tempfile.mkdtemp(prefix="smoke-"))
    started = time.monotonic()
    try:
        command = ["smoke", "all", "--out", "/smoke-out", "--timeout", str(timeout)]
        if not gpus:
            command.append("--cpu")
        if only:
            command += ["--only", only]
        # Each check's line shows as the container prints it (the gate takes minutes; it is not silent).
        # Five checks, each bounded by `timeout` inside; the outer limit only catches a wedged container.
        code, logs = engine.run_container(
            image.id, command, timeout=5 * timeout + 120, network="none", gpus=gpus, shm_size=shm_size,
            volumes={str(out_dir): {"bind": "/smoke-out", "mode": "rw"}},
            environment={"HF_HUB_OFFLINE": "1"}, on_line=log.output,
        )
        result, per_check, broken = read_gate_output(out_dir)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    report = {
        "image": image_ref,
        "image_id": image.id,
        "passed": bool(result and result.get("passed")) and code == 0,
        "mode": (result or {}).get("mode", "gpu" if gpus else "cpu"),
        "exit_code": code,
        "checks": (result or {}).get("checks", []),
        "details": per_check,
        "not_run": (result or {}).get("not_run", []),
        "level": level(result, per_check, gpus),
        "duration_s": round(time.monotonic() - started, 1),
        "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "shm_size": shm_size,
    }
    if result is None:
        report["passed"] = False
        report["checks"] = [{"name": "gate", "passed": False, "summary": broken or "the gate wrote no result",
                             # why first: the step's error line is built from the diagnosis
                             "diagnosis": [broken] * bool(broken) + [logs.strip()[-1500:] or f"container exit {code}"]}]
    return report


def level(result: dict | None, per_check: dict, gpus: bool) -> dict:
    """How far the gate proved the image: `cpu`, or `gpu` with the model, count and host driver it ran on."""
    if not gpus or (result or {}).get("mode") != "gpu":
        return {"kind": "cpu", "gpu_model": None, "gpu_count": 0, "driver": None}
    figures = (per_check.get("env") or {}).get("figures") or {}
    models = sorted({g.get("name") for g in figures.get("gpus") or [] if g.get("name")})
    return {"kind": "gpu", "gpu_model": " + ".join(models) or None, "gpu_count": figures.get("gpu_count"),
            "driver": figures.get("driver")}


def read_gate_output(out_dir: Path) -> tuple[dict | None, dict, str | None]:
    """The gate's all.json and per-check files, each held to its schema (smoke/schemas/): a result that
    breaks the contract is no result. Returns (verdict or None, {check: result}, why it is unusable).

    The image wrote this directory: each file is read only if it is a regular file (never through a link,
    which could name a host file, nor from a FIFO or device) and at most MAX_OUTPUT bytes."""
    result_file = out_dir / "all.json"
    if not os.path.lexists(result_file):
        return None, {}, None
    try:
        result = _read_json(result_file)
        # Only the results all.json names: checks keep their own scratch files (rank results) beside them.
        names = [c.get("name") for c in result.get("checks", []) if isinstance(c, dict)] if isinstance(
            result, dict) else []
        per_check = {n: _read_json(out_dir / f"{n}.json") for n in names
                     if isinstance(n, str) and n.isidentifier() and os.path.lexists(out_dir / f"{n}.json")}
    except UserError as exc:
        return None, {}, f"the gate's output is unusable: {exc.message.replace(str(out_dir) + '/', '')}"
    except (ValueError, RecursionError) as exc:
        return None, {}, f"the gate's output is not JSON ({str(exc)[:200]})"
    found = schemas.problems("all", result, smoke=True) + [
        f"{name}.json: {p}" for name, data in per_check.items() for p in schemas.problems("check", data, smoke=True)]
    if found:
        return None, per_check, f"the gate's output breaks smoke/schemas: {found[0]}"
    return result, per_check, None


def _read_json(path: Path):
    """A file of the gate's output as JSON: a regular file, not a link, at most MAX_OUTPUT bytes."""
    return json.loads(yamlread.read_bounded(path, MAX_OUTPUT, what="gate result", follow=False).decode("utf-8"))
