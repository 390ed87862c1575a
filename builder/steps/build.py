"""Build images with BuildKit (step 5): stage the context, skip unchanged inputs, build, verify, report.

Reads only what render (dockerfiles/<tag>/) and lock (locks/<tag>/) wrote plus smoke/, which is copied into
every image, staged once as the build context (builder/model/context.py) with the inputs applied. The
BuildKit mechanics (argv, secrets, labels, the input hash) are builder/boundary/buildkit.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

import builder
from builder import log, reports
from builder.boundary import buildkit, engine, inspect
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.flags import arg, nested, switch
from builder.model import attestations, context, inputs, paths, reference
from builder.model.matrix import Entry
from builder.steps import Done, diff, preflight

REPORT = "build"  # build/reports/<tag>.build.json


@dataclass(frozen=True)
class Options:
    force: bool = switch("--force", help="build even when this builder already built these inputs")
    no_cache: bool = switch("--no-cache", help="no BuildKit layer cache (downloads stay cached)")
    cache_ref: str | None = arg("--cache-ref", default=None, metavar="REF",
                                help="registry build cache (e.g. ghcr.io/acme/train-cache:TAG); used where docker "
                                     "has buildx")
    compression: str | None = arg("--compression", default=None, choices=buildkit.COMPRESSIONS,
                                  help="the layers' compression where the build writes them (Docker >= 26 with "
                                       "buildx and the containerd image store): zstd (default; pulls and unpacks "
                                       "faster, needs Docker >= 23 or containerd >= 1.5 to pull) or gzip (any "
                                       "client). Other engines push gzip")
    inputs: inputs.Inputs = nested(inputs.Inputs)


def prepare(entries: list[Entry], options: Options) -> Options:
    resolved = options.inputs.resolved()  # bad flag values and a missing CA bundle stop here, before any tag
    _check_cache_ref(options.cache_ref)
    engine.sdk()  # fail once, before any tag, when no engine answers
    if options.compression == "zstd" and not (engine.rewrites_timestamps() and engine.image_store() == "containerd"):
        log.info("warning: --compression zstd: this engine pushes gzip layers (zstd needs Docker >= 26 with buildx "
                 "and the containerd image store, which keeps the layers as the build wrote them)")
    if options.cache_ref:
        support = buildkit.cache_support()  # probed once; said once, not per tag
        if support.mode != "registry":
            use = "read only" if support.mode == "read" else "not used"
            log.info(f"warning: --cache-ref {options.cache_ref}: {use}: {support.why}")
    return replace(options, inputs=resolved)


def _check_cache_ref(ref: str | None) -> None:
    """The value goes into `--cache-from type=registry,ref=…`: a comma would add cache options of the user's own
    (`type=local,dest=/anywhere`), so only a plain pushable reference (NAME[:TAG], no digest) is accepted."""
    if ref is None:
        return
    why = "a digest cannot be pushed to" if "@" in ref else reference.problem(ref)
    if why:
        raise UserError(f"--cache-ref {ref[:100]!r}: {why}", "give a registry reference, e.g. ghcr.io/acme/cache:train")


def _skippable(entry: Entry, digest: str, compression: str) -> dict | None:
    """The previous report when this builder built exactly these inputs, compressed alike, and that image is still
    here."""
    previous = reports.read(entry.tag, REPORT, required=False)
    if not previous or previous.get("result") not in ("built", "skipped") or previous.get("input_hash") != digest:
        return None
    if previous.get("layer_compression", "gzip") != compression:
        return None
    image = engine.image_or_none(paths.image_ref(entry))
    if image is None or image.id != previous.get("image_id"):
        return None  # another image under the name (pulled, or built elsewhere): never trusted
    if image.labels.get(f"{buildkit.LABEL_PREFIX}.input-hash") != digest:
        return None
    return previous


def _buildkit_provenance(entry: Entry, image_id: str) -> str | None:
    """BuildKit's provenance of this image, where the engine wrote one (buildkit.run kept it): its path when its
    subject is this image, which publish attaches beside ours; None elsewhere (Docker 20.10 writes none)."""
    path = paths.buildkit_provenance(entry.tag)
    try:
        statement = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return str(path) if attestations.buildkit_binding(statement, image_id) is None else None


def run(entry: Entry, options: Options) -> Done:
    started = time.monotonic()
    staged = context.stage(entry, options.inputs)
    spec = buildkit.spec(entry, options.inputs, context=staged, ref=paths.image_ref(entry),
                         no_cache=options.no_cache, cache_ref=options.cache_ref,
                         compression=options.compression or "zstd")
    digest = buildkit.input_hash(spec)
    compression = buildkit.layer_compression(spec)
    # Read before this build replaces them: the images a size budget compares with (builder/model/budget.py).
    baselines = [reports.read(entry.tag, s, required=False) for s in ("publish", REPORT)]
    previous = None if options.force else _skippable(entry, digest, compression)
    if previous:
        reports.write(entry.tag, REPORT, {**previous, "result": "skipped", "reason": "this builder built these inputs",
                                        "duration_s": round(time.monotonic() - started, 1)})
        return Done("skipped", f"same input hash as the last build, {_gb(previous.get('size_bytes'))}")
    # Only a build that will run needs its sources: an unchanged matrix is skipped without touching the network.
    checked = preflight.preflight(entry, options.inputs, staged,
                                  image_exists=lambda ref: engine.image_or_none(ref) is not None)
    log.info("  sources: " + ", ".join(f"{c['source']} {log.mark(c['ok'])}" for c in checked["checked"]))
    facts = json.loads((staged / "image.json").read_text())
    with engine.holding(spec.ref, paths.previous_ref(entry)):  # what the size budget compares with
        code, output, shown = buildkit.run(spec, buildkit.labels(spec, facts, digest), options.inputs,
                                           provenance=paths.buildkit_provenance(entry.tag))
        base = {"ref": spec.base_ref, "substituted": spec.base_substituted, "image_id": spec.base_id}
        if code != 0:
            message, hint, environmental = buildkit.explain_failure(output)
            reports.write(entry.tag, REPORT, {"result": "failed", "error": message, "command": shown,
                                              "input_hash": digest, "base": base,
                                              "duration_s": round(time.monotonic() - started, 1)})
            raise (EnvironmentProblem if environmental else StepFailed)(f"{entry.tag}: {message}", hint)
        with engine.answering("after the build"):
            image = engine.built_image(spec.ref)
            found = inspect.installed(spec.ref)
        mismatches = inspect.problems(facts, found)
        over = None if mismatches else diff.over_budget(entry, image, baselines)
    report = {
        "result": "failed" if mismatches or over else "built", **({"error": over} if over else {}),
        "image": spec.ref, "image_id": image.id, "size_bytes": image.attrs.get("Size"),
        "duration_s": round(time.monotonic() - started, 1), "input_hash": digest, "command": shown,
        "builder_version": builder.__version__, "base": base,
        "versions": found.get("versions"), "torch_cuda": found.get("torch_cuda"),
        "verification": mismatches or "ok", "source_date_epoch": buildkit.ZIP_EPOCH,  # what the steps used
        "timestamps_rewritten": spec.rewrite_timestamps, "layer_compression": compression,
        "buildkit_provenance": _buildkit_provenance(entry, image.id),
        "docker": engine.describe(),
    }
    reports.write(entry.tag, REPORT, report)
    if mismatches:
        raise StepFailed(f"{entry.tag}: the image is not what the matrix says: " + "; ".join(mismatches),
                         f"see {paths.report(entry.tag, REPORT)}")
    if over:
        raise StepFailed(f"{entry.tag}: {over}", f"make the image smaller, or raise size_budget in {entry.source}")
    return Done("built", f"{image.id[7:19]}, {_gb(image.attrs.get('Size'))}")


def _gb(size) -> str:
    return f"{size / 1e9:.2f} GB" if size else "size unknown"
