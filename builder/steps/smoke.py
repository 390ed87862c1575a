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
from datetime import datetime, timezone
from pathlib import Path

from builder import log, reports
from builder.boundary import engine
from builder.errors import StepFailed, UserError

CHECK_TIMEOUT = 600  # seconds per check inside the image; `all` enforces it per check
DEFAULT_SHM = "8g"  # Docker's 64 MB default breaks NCCL and DataLoader workers; the env check says so


def add_arguments(p) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="CPU mode: 2 ranks over gloo, no GPU checks")
    mode.add_argument("--gpus", choices=["all"], help="run on every GPU (needs the NVIDIA container toolkit)")
    p.add_argument("--image", metavar="REF", help="gate this image instead of the tag's build (e.g. a pulled one)")
    p.add_argument("--shm-size", default=DEFAULT_SHM, help=f"/dev/shm size for the container (default {DEFAULT_SHM})")
    p.add_argument("--timeout", type=int, default=CHECK_TIMEOUT, help="seconds per check (default 600)")


def run_gate(image_ref: str, gpus: bool, timeout: int = CHECK_TIMEOUT, shm_size: str = DEFAULT_SHM) -> dict:
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
        # Three checks, each bounded by `timeout` inside; the outer limit only catches a wedged container.
        code, logs = engine.run_container(
            image.id, command, timeout=3 * timeout + 120, network="none", gpus=gpus, shm_size=shm_size,
            volumes={str(out_dir): {"bind": "/smoke-out", "mode": "rw"}},
            environment={"HF_HUB_OFFLINE": "1"},
        )
        result_file = out_dir / "all.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        per_check = {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json") if p.stem != "all"}
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
        "duration_s": round(time.monotonic() - started, 1),
        "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "shm_size": shm_size,
    }
    if result is None:
        report["checks"] = [{"name": "gate", "passed": False, "summary": "the gate wrote no result",
                             "diagnosis": [logs.strip()[-1500:] or f"container exit {code}"]}]
    return report


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


def main(args) -> int:
    from builder import cli
    from builder.model import matrix

    m = cli._load(args)
    if not args.tags:
        raise UserError("which image? name a tag", f"e.g. python -m builder smoke {m.default.tag} --cpu")
    entries = matrix.select(m, args.tags)
    if args.image and len(entries) != 1:
        raise UserError("--image needs exactly one tag")
    engine.sdk()
    rows, failed = [], 0
    for entry in entries:
        ref = args.image or reports.read(entry.tag, "build").get("image") or f"{entry.image}:{entry.tag}"
        with log.step(f"smoke {entry.tag}{' (' + ref + ')' if args.image else ''}") as note:
            report = run_gate(ref, gpus=bool(args.gpus), timeout=args.timeout, shm_size=args.shm_size)
            reports.write(entry.tag, "smoke", report)
            note["result"] = "passed" if report["passed"] else "FAILED"
        for check in report["checks"]:
            rows.append([entry.tag, check["name"], log.mark(bool(check.get("passed"))),
                         f"{check.get('seconds', 0):.1f}s", (check.get("summary") or "")[:90]])
        if not report["passed"]:
            failed += 1
            for line in failing(report):
                log.info(f"✕ {entry.tag}: {line}")
    log.summary("Smoke gate", ("tag", "check", "ok", "time", "summary"), rows)
    if failed:
        raise StepFailed(f"{failed} image(s) failed the smoke gate", "see build/reports/<tag>.smoke.json")
    return 0
