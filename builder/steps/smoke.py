"""Run the smoke gate inside a built image (step 6) and bind the verdict to the exact image ID.

The gate itself lives in the image (`smoke all`, from smoke/); builder/boundary/gate.py starts it in a
container with no network, GPUs through device requests, a time limit per check; this step writes
build/reports/<tag>.smoke.json. publish refuses any image whose ID has no passing report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from builder import log, reports
from builder.boundary import engine, host
from builder.boundary.gate import CHECK_TIMEOUT, DEFAULT_SHM, run_gate
from builder.errors import StepFailed, UserError
from builder.flags import arg, switch
from builder.model import attestations, paths
from builder.steps import Done


@dataclass(frozen=True)
class Options:
    # Neither --cpu nor --gpus: every GPU when this host can give containers GPUs, else CPU mode, and it says which.
    cpu: bool = switch("--cpu", exclusive="mode", help="CPU mode: 2 ranks over gloo, no GPU checks")
    gpus: str | None = arg("--gpus", default=None, exclusive="mode", choices=["all"],
                           help="run on every GPU (needs the NVIDIA container toolkit)")
    image: str | None = arg("--image", default=None, metavar="REF",
                            help="gate this image instead of the tag's build (e.g. a pulled one)")
    shm_size: str = arg("--shm-size", default=DEFAULT_SHM,
                        help=f"/dev/shm size for the container (default {DEFAULT_SHM})")
    timeout: int = arg("--timeout", default=CHECK_TIMEOUT, type=int,
                       help=f"seconds per check (default {CHECK_TIMEOUT})")


def prepare(entries, options: Options) -> None:
    if options.image and len(entries) != 1:
        raise UserError("--image needs exactly one tag")
    if options.timeout < 30:
        raise UserError(f"--timeout {options.timeout}: a check needs at least 30 seconds")
    info = engine.info()
    if options.cpu or options.gpus:
        return None
    found, source = host.gpus()
    if found and host.nvidia_runtime(info):
        log.info(f"no --cpu/--gpus: {len(found)} GPU(s) here ({found[0]['name']}, via {source}): GPU gate")
        return replace(options, gpus="all")
    log.info(f"no --cpu/--gpus: no GPU a container can use here ({source}): CPU gate — entries of GPU runners "
             "need a GPU gate before they can be published")
    return replace(options, cpu=True)


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
    image = engine.image_or_none(ref)
    wrong = attestations.label_problem(entry.tag, entry.pins, image.labels or {}) if image is not None else None
    if wrong:  # a passing report would bind this entry's verdict to another entry's image
        raise StepFailed(f"{entry.tag}: refusing to gate {ref}: it is not this entry's image: {wrong}",
                         f"gate the entry's own build: python -m builder build {entry.tag}, then smoke it")
    report = run_gate(ref, gpus=bool(options.gpus), timeout=options.timeout, shm_size=options.shm_size)
    reports.write(entry.tag, "smoke", report)
    for check in report["checks"]:
        log.info(f"  {log.mark(bool(check.get('passed')))} {check['name']} ({check.get('seconds') or 0:.1f}s): "
                 f"{(check.get('summary') or '')[:100]}")
    if not report["passed"]:
        raise StepFailed(f"{entry.tag}: the smoke gate failed: " + " | ".join(failing(report)),
                         f"see {paths.report(entry.tag, 'smoke')}")
    return Done("passed", f"{report['mode']}: " + ", ".join(f"{c['name']} {c.get('seconds') or 0:.0f}s"
                                                          for c in report["checks"]))
