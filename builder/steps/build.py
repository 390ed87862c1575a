"""Build images with BuildKit (step 5): stage the context, skip unchanged inputs, build, verify, report.

Reads only what render and lock wrote (dockerfiles/<tag>/) plus smoke/, which is copied into every image.
The BuildKit mechanics (argv, secrets, labels, the input hash) are builder/boundary/buildkit.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import builder
from builder import log, reports
from builder.boundary import buildkit, engine, inspect
from builder.errors import EnvironmentProblem, StepFailed
from builder.model import paths
from builder.model.matrix import Entry
from builder.steps import Done, lock, preflight

NAME = "build"
HELP = "build images with BuildKit, verify them, write build reports"
DEFAULT_ALL = False


@dataclass(frozen=True)
class Options:
    force: bool = False
    no_cache: bool = False
    local_base: bool = False
    base_image: str | None = None
    apt_mirror: str | None = None
    ca_bundle: str | None = None
    cache_ref: str | None = None
    flash_attn_mirror: str | None = None


def add_arguments(p) -> None:
    p.add_argument("--force", action="store_true", help="build even when this builder already built these inputs")
    p.add_argument("--no-cache", action="store_true", help="no BuildKit layer cache (downloads stay cached)")
    p.add_argument("--cache-ref", metavar="REF",
                   help="registry build cache (e.g. ghcr.io/acme/train-cache:TAG); used where docker has buildx")
    add_base_arguments(p)


def add_base_arguments(p) -> None:
    """The flags that choose the build's inputs; repro takes the same ones."""
    p.add_argument("--local-base", action="store_true",
                   help="prefer a local image named like the base (name:tag, no digest) when one exists; "
                        "the substitution is recorded in labels and the report")
    p.add_argument("--base-image", metavar="REF", help="use this base reference instead (a mirror)")
    p.add_argument("--apt-mirror", metavar="URL", help="apt mirror, e.g. http://mirror.local/debian")
    p.add_argument("--ca-bundle", metavar="PATH",
                   help="extra CA bundle for pip inside the build (default: $PIP_CERT or $SSL_CERT_FILE)")
    p.add_argument("--flash-attn-mirror", metavar="URL",
                   help="a directory serving the flash-attn wheel files (their sha256 from the lock is still checked)")


def prepare(entries: list[Entry], options: Options) -> None:
    engine.sdk()  # fail once, before any tag, when no engine answers
    if options.cache_ref and engine.client().mode != "buildx":
        log.info(f"warning: --cache-ref {options.cache_ref} is not used: {engine.client().binary} has no buildx")


def _skippable(entry: Entry, digest: str) -> dict | None:
    """The previous report when this builder built exactly these inputs and that image is still here."""
    previous = reports.read(entry.tag, NAME, required=False)
    if not previous or previous.get("result") not in ("built", "skipped") or previous.get("input_hash") != digest:
        return None
    image = engine.image_or_none(paths.image_ref(entry))
    if image is None or image.id != previous.get("image_id"):
        return None  # another image under the name (pulled, or built elsewhere): never trusted
    if image.labels.get(f"{buildkit.LABEL_PREFIX}.input-hash") != digest:
        return None
    return previous


def run(entry: Entry, options: Options) -> Done:
    started = time.monotonic()
    context = buildkit.stage_context(entry)
    flash = context / lock.FLASH_LOCK
    if options.flash_attn_mirror and flash.exists():
        flash.write_text(preflight.rewrite_flash_lock(flash.read_text(), options.flash_attn_mirror))
    spec = buildkit.spec(entry, context=context, ref=paths.image_ref(entry), base_image=options.base_image,
                         local_base=options.local_base, apt_mirror=options.apt_mirror, no_cache=options.no_cache,
                         cache_ref=options.cache_ref)
    digest = buildkit.input_hash(spec)
    previous = None if options.force else _skippable(entry, digest)
    if previous:
        reports.write(entry.tag, NAME, {**previous, "result": "skipped", "reason": "this builder built these inputs",
                                        "duration_s": round(time.monotonic() - started, 1)})
        return Done("skipped", f"same input hash as the last build, {_gb(previous.get('size_bytes'))}")
    # Only a build that will run needs its sources: an unchanged matrix is skipped without touching the network.
    checked = preflight.preflight(entry, paths.tag_dir(entry), local_base=options.local_base,
                                  base_image=options.base_image, apt_mirror=options.apt_mirror,
                                  flash_attn_mirror=options.flash_attn_mirror,
                                  image_exists=lambda ref: engine.image_or_none(ref) is not None)
    log.info("  sources: " + ", ".join(f"{c['source']} {log.mark(c['ok'])}" for c in checked["checked"]))
    facts = json.loads((context / "image.json").read_text())
    code, output, shown = buildkit.run(spec, buildkit.labels(spec, facts, digest), options.ca_bundle)
    base = {"ref": spec.base_ref, "substituted": spec.base_substituted, "image_id": spec.base_id}
    if code != 0:
        message, hint, environmental = buildkit.explain_failure(output)
        reports.write(entry.tag, NAME, {"result": "failed", "error": message, "command": shown, "input_hash": digest,
                                        "base": base, "duration_s": round(time.monotonic() - started, 1)})
        raise (EnvironmentProblem if environmental else StepFailed)(f"{entry.tag}: {message}", hint)
    with engine.answering("after the build"):
        image = engine.sdk().images.get(spec.ref)
        found = inspect.installed(spec.ref)
    mismatches = inspect.problems(facts, found)
    report = {
        "result": "failed" if mismatches else "built",
        "image": spec.ref, "image_id": image.id, "size_bytes": image.attrs.get("Size"),
        "duration_s": round(time.monotonic() - started, 1), "input_hash": digest, "command": shown,
        "builder_version": builder.__version__, "base": base,
        "versions": found.get("versions"), "torch_cuda": found.get("torch_cuda"),
        "verification": mismatches or "ok", "source_date_epoch": buildkit.ZIP_EPOCH,  # what the steps used
        "docker": {"binary": engine.client().binary, "mode": engine.client().mode},
    }
    reports.write(entry.tag, NAME, report)
    if mismatches:
        raise StepFailed(f"{entry.tag}: the image is not what the matrix says: " + "; ".join(mismatches),
                         f"see {paths.report(entry.tag, NAME)}")
    return Done("built", f"{image.id[7:19]}, {_gb(image.attrs.get('Size'))}")


def _gb(size) -> str:
    return f"{size / 1e9:.2f} GB" if size else "size unknown"
