"""Rebuild a matrix entry from scratch beside the existing image and prove the contents are the same.

`compare(manifest_a, manifest_b)` works on any two manifests (so on any two images); every difference is
named by its class of nondeterminism (KNOWN_CLASSES) and either matched by the documented allowlist
(builder/data/repro-allowlist.yaml, each pattern with its reason) or counted as unexplained, which fails.
File mtimes are not content: they are counted apart (see docs/reproducibility.md).
"""

from __future__ import annotations

import fnmatch
import json
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from importlib import resources

import yaml

from builder import log, reports
from builder.boundary import buildkit, engine, imagesave
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.flags import nested, switch
from builder.model import context, paths
from builder.model.inputs import Inputs
from builder.steps import Done

REPORT_CAP = 500
# Known classes of build nondeterminism, first match wins. They name a difference; they do not excuse it
# (only the allowlist does).
KNOWN_CLASSES = (
    ("pyc", ("*.pyc", "*/__pycache__", "*/__pycache__/*")),
    ("pip-metadata", ("*.dist-info/RECORD", "*.dist-info/INSTALLER", "*.dist-info/direct_url.json",
                      "*.dist-info/REQUESTED", "*.egg-info/installed-files.txt", "*.egg-info/SOURCES.txt")),
    ("apt-dpkg-logs-caches", ("var/log/apt/*", "var/log/dpkg.log", "var/log/alternatives.log", "var/cache/apt/*",
                              "var/lib/apt/lists/*", "var/lib/apt/extended_states", "var/cache/debconf/*",
                              "var/lib/dpkg/*-old", "var/cache/ldconfig/*", "var/lib/dpkg/triggers/*")),
    ("ld.so.cache", ("etc/ld.so.cache",)),
    ("machine-id", ("etc/machine-id", "var/lib/dbus/machine-id")),
    ("logs", ("var/log/*",)),
    ("tmp", ("tmp/*", "var/tmp/*", "root/.cache/*")),
)
FIELDS = ("type", "mode", "uid", "gid", "size", "sha256", "target")


@dataclass(frozen=True)
class Options:
    keep: bool = switch("--keep", help=f"keep the rebuilt image (<image>:<tag>{paths.REPRO_SUFFIX})")
    inputs: Inputs = nested(Inputs)  # the same inputs the image was built with (same flags)


def prepare(entries, options: Options) -> Options:
    resolved = options.inputs.resolved()
    engine.sdk()
    engine.client()
    return replace(options, inputs=resolved)


# --- comparison ----------------------------------------------------------------------------------------


def classify(path: str) -> str:
    for name, patterns in KNOWN_CLASSES:
        if any(fnmatch.fnmatchcase(path, p) for p in patterns):
            return name
    return "content"


def load_allowlist(text: str | None = None) -> list[dict]:
    """[{pattern, reason}]: every pattern must say why the difference cannot be removed."""
    if text is None:
        text = resources.files("builder").joinpath("data/repro-allowlist.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text) or {}
    out = []
    for i, item in enumerate(raw.get("allow") or []):
        if not isinstance(item, dict) or not item.get("pattern") or not str(item.get("reason", "")).strip():
            raise UserError(f"repro allowlist item {i + 1}: needs `pattern` and a non-empty `reason`")
        out.append({"pattern": str(item["pattern"]), "reason": str(item["reason"]).strip()})
    return out


def _allowed(path: str, allowlist: list[dict]) -> dict | None:
    return next((a for a in allowlist if fnmatch.fnmatchcase(path, a["pattern"])), None)


def _packages(m: dict, key: str) -> dict[str, str]:
    out = {}
    for p in m[key]:
        name = p["name"] if key == "os_packages" else f"{p['name']}@{p['path']}"
        out[name] = p.get("version") or ""
    return out


def compare(a: dict, b: dict, allowlist: list[dict] | None = None) -> dict:
    """Compare two manifests by content: what differs, its class, allowlisted or unexplained."""
    allowlist = load_allowlist() if allowlist is None else allowlist
    fa, fb = a["files"], b["files"]
    differences, mtime_only, files, compared_bytes = [], 0, 0, 0
    for path in sorted(set(fa) | set(fb)):
        ea, eb = fa.get(path), fb.get(path)
        if ea is None or eb is None:
            differences.append({"path": path, "change": "added" if ea is None else "removed"})
            continue
        if ea["type"] == "file":
            files += 1
            compared_bytes += ea.get("size", 0)
        changed = [f for f in FIELDS if ea.get(f) != eb.get(f)]
        if changed:
            differences.append({"path": path, "change": "changed", "fields": changed})
        elif ea.get("mtime") != eb.get("mtime"):
            mtime_only += 1
    by_class: dict[str, int] = {}
    allowed, unexplained = [], []
    for d in differences:
        d["class"] = classify(d["path"])
        by_class[d["class"]] = by_class.get(d["class"], 0) + 1
        rule = _allowed(d["path"], allowlist)
        if rule:
            allowed.append({**d, "pattern": rule["pattern"], "reason": rule["reason"]})
        else:
            unexplained.append(d)
    packages = {}
    for key in ("python_packages", "os_packages"):
        pa, pb = _packages(a, key), _packages(b, key)
        packages[key] = [{"name": n, "a": pa.get(n), "b": pb.get(n)} for n in sorted(set(pa) | set(pb))
                         if pa.get(n) != pb.get(n)]
    layers_a = [x["diff_id"] for x in a["layers"]]
    layers_b = [x["diff_id"] for x in b["layers"]]
    return {
        "identical": not differences and not any(packages.values()),
        "ok": not unexplained and not any(packages.values()),
        "files_compared": files, "bytes_compared": compared_bytes,
        "paths": {"a": len(fa), "b": len(fb)},
        "differences": len(differences), "differences_by_class": dict(sorted(by_class.items())),
        "mtime_only": mtime_only,
        "allowlisted": allowed, "unexplained": unexplained, "packages": packages,
        "layers": {"identical": layers_a == layers_b, "a": layers_a, "b": layers_b,
                   "same_count": sum(x == y for x, y in zip(layers_a, layers_b))},
        "config_digests": {"a": a.get("config_digest"), "b": b.get("config_digest")},
    }


def compare_images(image_a: str, image_b: str, allowlist: list[dict] | None = None) -> dict:
    timings = {}
    manifests = []
    for image in (image_a, image_b):
        with log.step(f"manifest {image}") as note:
            result = imagesave.manifest(image)
            timings[image] = result["stats"]
            note["result"] = f"{result['totals']['files']} files, {result['totals']['bytes'] / 1e9:.2f} GB"
        manifests.append(result)
    out = compare(*manifests, allowlist=allowlist)
    return {"images": {"a": image_a, "b": image_b}, **out, "manifest_timings": timings}


def summarize(result: dict) -> None:
    rows = [[d["change"], d["class"], d["path"], ",".join(d.get("fields", [])), "allowlisted"]
            for d in result["allowlisted"][:20]]
    rows += [[d["change"], d["class"], d["path"], ",".join(d.get("fields", [])), "UNEXPLAINED"]
             for d in result["unexplained"][:50]]
    for key, changes in result["packages"].items():
        rows += [["package", key, c["name"], f"{c['a']} → {c['b']}", "UNEXPLAINED"] for c in changes]
    if rows:
        log.info(log.table(("change", "class", "path", "fields", "verdict"), rows))
    log.info(f"{result['files_compared']} files / {result['bytes_compared'] / 1e9:.2f} GB compared by content; "
             f"{result['differences']} differences ({len(result['allowlisted'])} allowlisted, "
             f"{len(result['unexplained'])} unexplained); {result['mtime_only']} differ in mtime only; "
             f"layer digests {'identical' if result['layers']['identical'] else 'differ'} "
             f"({result['layers']['same_count']}/{len(result['layers']['a'])} equal)")


# --- rebuilding ----------------------------------------------------------------------------------------


def rebuild(entry, options: Options) -> dict:
    """Build the entry again, no layer cache, tagged <image>:<tag>-repro; the original stays as it is."""
    original = paths.image_ref(entry)
    existing = engine.image_or_none(original)
    if existing is None:
        raise UserError(f"{original} is not here: nothing to compare with",
                        f"build it first: `python -m builder build {entry.tag}`")
    staged = context.stage(entry, options.inputs, root=paths.CONTEXT_ROOT / "repro")
    # Compressed as the build was: the layer digests are compared too.
    built = reports.read(entry.tag, "build", required=False) or {}
    spec = buildkit.spec(entry, options.inputs, context=staged, ref=paths.repro_ref(entry), no_cache=True,
                         compression=built.get("layer_compression") or "zstd")
    digest = buildkit.input_hash(spec)
    if existing.labels.get(f"{buildkit.LABEL_PREFIX}.input-hash") != digest:
        raise UserError(f"{original} was built from other inputs than these (dockerfiles/{entry.tag}/, "
                        f"locks/{entry.tag}/, smoke/, flags)",
                        f"give repro the flags the build had, or rebuild: `python -m builder build {entry.tag}`")
    facts = json.loads((staged / "image.json").read_text())
    started = time.monotonic()
    code, output, _ = buildkit.run(spec, buildkit.labels(spec, facts, digest), options.inputs)
    if code != 0:
        message, hint, environmental = buildkit.explain_failure(output)
        raise (EnvironmentProblem if environmental else StepFailed)(f"{entry.tag}: the repro build failed: {message}",
                                                                     hint)
    rebuilt = engine.built_image(spec.ref)
    if rebuilt.id == existing.id and not spec.rewrite_timestamps:
        # Not a second build: where layers carry the build's file times two builds cannot share an ID, unless
        # BuildKit merged them (it merges identical steps of builds running at once, even with --no-cache; seen
        # when `build --no-cache` of the same tag ran alongside). The tag lock keeps this checkout's builds apart.
        raise StepFailed(f"{entry.tag}: the rebuild is the very same image ({rebuilt.id[:19]}), so nothing was "
                         "compared", "run repro while no other build of this entry runs")
    # Where file times are rewritten (engine.rewrites_timestamps) the same ID is the goal: the same digest.
    return {"image": spec.ref, "id": rebuilt.id, "build_s": round(time.monotonic() - started, 1),
            "base": {"ref": spec.base_ref, "substituted": spec.base_substituted},
            "input_hash": digest, "original_id": existing.id, "timestamps_rewritten": spec.rewrite_timestamps,
            "same_digest": rebuilt.id == existing.id}


def _remove_rebuild(built: dict) -> None:
    """Remove the rebuilt image; when that fails (the engine went away) say so, never hide the first error."""
    try:
        with engine.answering(f"while removing {built['image']}"):
            engine.sdk().images.remove(built["image"], force=True)
    except Exception as exc:  # noqa: BLE001 - a leftover -repro image is harmless; the comparison's error matters
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        log.info(f"warning: {built['image']} was not removed ({reason}); remove it with `docker rmi {built['image']}`")
    imagesave.cache_path(built["id"]).unlink(missing_ok=True)


def run(entry, options: Options) -> Done:
    started = time.monotonic()
    built = rebuild(entry, options)
    try:
        result = compare_images(paths.image_ref(entry), built["image"])
    finally:
        if not options.keep:
            _remove_rebuild(built)
    # Lists are capped so a badly broken build still gives a readable report; the counts are complete.
    report = {"result": "reproducible" if result["ok"] else "differs", **result,
              "allowlisted_count": len(result["allowlisted"]), "allowlisted": result["allowlisted"][:REPORT_CAP],
              "unexplained_count": len(result["unexplained"]), "unexplained": result["unexplained"][:REPORT_CAP],
              "rebuild": built, "duration_s": round(time.monotonic() - started, 1),
              "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    reports.write(entry.tag, "repro", report)
    summarize(result)
    if not result["ok"]:
        raise StepFailed(f"{entry.tag}: the rebuild differs: {report['unexplained_count']} unexplained differences",
                         f"see {paths.report(entry.tag, 'repro')}")
    return Done("reproducible", f"{result['files_compared']} files, {result['bytes_compared'] / 1e9:.2f} GB equal; "
                                + ("the same image digest" if built["same_digest"] else
                                   f"layers {'identical' if result['layers']['identical'] else 'differ'}"))


