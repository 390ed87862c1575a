"""Run the smoke gate inside a built image (step 6) and bind the verdict to the exact image ID.

The gate itself lives in the image (`smoke all`, from smoke/); this module starts it in a container
with no network, GPUs through device requests, a time limit per check, and writes
build/reports/<tag>.smoke.json. publish refuses any image whose ID has no passing report.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from builder import log, reports
from builder.boundary import engine, host
from builder.errors import StepFailed, UserError
from builder.model import paths
from builder.steps import Done

# Seconds per check inside the image; `all` enforces it per check. On CPU, train is the long one: DeepSpeed's
# CPU accelerator JIT-builds shm_comm, its C++ FusedAdam and CPUAdam as it does for any user (~4 min on 2 cores).
CHECK_TIMEOUT = 900
DEFAULT_SHM = "8g"  # Docker's 64 MB default breaks NCCL and DataLoader workers; the env check says so


NAME = "smoke"
HELP = "run the smoke gate in a built image; write the smoke report"
DEFAULT_ALL = False


@dataclass(frozen=True)
class Options:
    cpu: bool = False
    gpus: str | None = None
    image: str | None = None
    shm_size: str = DEFAULT_SHM
    timeout: int = CHECK_TIMEOUT


def add_arguments(p) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="CPU mode: 2 ranks over gloo, no GPU checks")
    mode.add_argument("--gpus", choices=["all"], help="run on every GPU (needs the NVIDIA container toolkit)")
    # Neither: every GPU when this host can give containers GPUs, else CPU mode, and it says which.
    p.add_argument("--image", metavar="REF", help="gate this image instead of the tag's build (e.g. a pulled one)")
    p.add_argument("--shm-size", default=DEFAULT_SHM, help=f"/dev/shm size for the container (default {DEFAULT_SHM})")
    p.add_argument("--timeout", type=int, default=CHECK_TIMEOUT, help=f"seconds per check (default {CHECK_TIMEOUT})")


def prepare(entries, options: Options) -> None:
    if options.image and len(entries) != 1:
        raise UserError("--image needs exactly one tag")
    if options.timeout < 30:
        raise UserError(f"--timeout {options.timeout}: a check needs at least 30 seconds")
    info = engine.sdk().info()
    if options.cpu or options.gpus:
        return None
    found, source = host.gpus()
    if found and host.nvidia_runtime(info):
        log.info(f"no --cpu/--gpus: {len(found)} GPU(s) here ({found[0]['name']}, via {source}): GPU gate")
        return replace(options, gpus="all")
    log.info(f"no --cpu/--gpus: no GPU a container can use here ({source}): CPU gate — entries of GPU runners "
             "need a GPU gate before they can be published")
    return replace(options, cpu=True)


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
        # Five checks, each bounded by `timeout` inside; the outer limit only catches a wedged container.
        code, logs = engine.run_container(
            image.id, command, timeout=5 * timeout + 120, network="none", gpus=gpus, shm_size=shm_size,
            volumes={str(out_dir): {"bind": "/smoke-out", "mode": "rw"}},
            environment={"HF_HUB_OFFLINE": "1"},
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
                             "diagnosis": [logs.strip()[-1500:] or f"container exit {code}"]}]
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
    breaks the contract is no result. Returns (verdict or None, {check: result}, why it is unusable)."""
    result_file = out_dir / "all.json"
    if not result_file.exists():
        return None, {}, None
    try:
        result = json.loads(result_file.read_text())
        # Only the results all.json names: checks keep their own scratch files (rank results) beside them.
        names = [c.get("name") for c in result.get("checks", []) if isinstance(c, dict)] if isinstance(
            result, dict) else []
        per_check = {n: json.loads((out_dir / f"{n}.json").read_text()) for n in names
                     if isinstance(n, str) and n.isidentifier() and (out_dir / f"{n}.json").is_file()}
    except (OSError, ValueError) as exc:
        return None, {}, f"the gate's output is not JSON ({exc})"
    found = reports.problems("all", result, smoke=True) + [
        f"{name}.json: {p}" for name, data in per_check.items() for p in reports.problems("check", data, smoke=True)]
    if found:
        return None, per_check, f"the gate's output breaks smoke/schemas: {found[0]}"
    return result, per_check, None


def failing(report: dict) -> list[str]:
    """One line per failed check: its name and the likely cause."""
    lines = []
    for check in report["checks"]:
        if not check.get("passed"):
            diagnosis = check.get("diagnosis") or [check.get("summary", "")]
            if isinstance(diagnosis, str):
                diagnosis = [diagnosis]
            lines.append(f"{check['name']}: {'; '.join(d for d in diagnosis if d)[:600]}")
    return lines


def run(entry, options: Options) -> Done:
    ref = options.image or (reports.read(entry.tag, "build") or {}).get("image") or paths.image_ref(entry)
    report = run_gate(ref, gpus=bool(options.gpus), timeout=options.timeout, shm_size=options.shm_size)
    reports.write(entry.tag, NAME, report)
    for check in report["checks"]:
        log.info(f"  {log.mark(bool(check.get('passed')))} {check['name']} ({check.get('seconds') or 0:.1f}s): "
                 f"{(check.get('summary') or '')[:100]}")
    if not report["passed"]:
        raise StepFailed(f"{entry.tag}: the smoke gate failed: " + " | ".join(failing(report)),
                         f"see {paths.report(entry.tag, NAME)}")
    return Done("passed", f"{report['mode']}: " + ", ".join(f"{c['name']} {c.get('seconds') or 0:.0f}s"
                                                          for c in report["checks"]))
