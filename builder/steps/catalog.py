"""IMAGES.md and images.json: what exists, what is in it, and what proved it (step 8).

Generated only from the matrix and the step reports (build, smoke, publish, repro), never from the
clock, so the same reports give byte-identical files and `catalog --check` can catch a stale catalog.
A smoke verdict counts only for the image ID it was run on: a report for another ID shows as stale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder import fsutil, log, reports
from builder.errors import UserError
from builder.model import compat, paths, proof
from builder.model.matrix import PACKAGES, Entry

MARKDOWN, JSON = "IMAGES.md", "images.json"
SCHEMA = 1


NAME = "catalog"
HELP = "write IMAGES.md and images.json from the reports"
NEEDS_MATRIX = True


@dataclass(frozen=True)
class Options:
    check: bool = False
    reports: str | None = None
    out: str = "."


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="exit 2 if IMAGES.md or images.json is stale")
    p.add_argument("--reports", metavar="DIR", help="read reports from DIR (default: build/reports)")
    p.add_argument("--out", metavar="DIR", default=".", help="where IMAGES.md and images.json go (default: .)")


def _read(directory: Path, tag: str, step: str) -> dict | None:
    return reports.read(tag, step, required=False, directory=directory)


def _figures(smoke: dict) -> dict:
    """The gate's key figures: train steps/s and the all-reduce bus bandwidth at the largest size."""
    by_name = {c.get("name"): c.get("figures") or {} for c in smoke.get("checks") or []}
    train, nccl = by_name.get("train", {}), by_name.get("nccl", {})
    largest = nccl.get("largest") or {}
    return {"steps_per_s": train.get("steps_per_s"), "loss_first": train.get("loss_first"),
            "loss_last": train.get("loss_last"), "busbw_gbps": largest.get("busbw_gbps"),
            "busbw_bytes": largest.get("bytes"), "ranks": nccl.get("ranks"), "backend": nccl.get("backend")}


def _smoke(smoke: dict | None, image_id: str | None) -> dict:
    if smoke is None:
        return {"verdict": "not run"}
    level = smoke.get("level") or {"kind": smoke.get("mode")}
    out = {"verdict": "passed" if smoke.get("passed") is True else "failed", "mode": smoke.get("mode"),
           "level": level, "level_text": proof.gate_phrase(level),
           "date": (smoke.get("finished_at") or "")[:10] or None, "image_id": smoke.get("image_id"),
           **_figures(smoke)}
    if image_id and smoke.get("image_id") != image_id:
        out["verdict"] = "stale"  # gated another build of this tag
    return out


def _repro(repro: dict | None) -> dict | None:
    if repro is None:
        return None
    return {"verdict": repro["result"], "date": (repro.get("finished_at") or "")[:10] or None,
            "differences": repro.get("differences")}


def record(entry: Entry, directory: Path) -> dict:
    """Everything known about one tag, from its reports."""
    build, smoke, publish = (_read(directory, entry.tag, s) for s in ("build", "smoke", "publish"))
    image_id = (publish or {}).get("image_id") or (build or {}).get("image_id")
    measured = (build or {}).get("versions") if (build or {}).get("image_id") == image_id else None
    size = next((r.get("size_bytes") for r in (build, publish) if r and r.get("image_id") == image_id
                 and r.get("size_bytes")), None)
    return {
        "tag": entry.tag, "python": entry.python, "cuda": entry.cuda, "base": entry.base_name,
        "min_driver": compat.derive(entry)["min_driver"],
        "versions": {p: (measured or {}).get(p, entry.pins.get(p)) for p in PACKAGES},
        "versions_source": "measured in the image" if measured else "matrix pins (not built)",
        "image_id": image_id, "size_bytes": size,
        "built": (build or {}).get("result"),
        "ci_builds": entry.ci,
        "exceptions": list((publish or {}).get("exceptions") or []),
        "lock_exceptions": [f"{name}: {why}" for name, why in sorted(entry.lock_exceptions.items())],
        "smoke": _smoke(smoke, image_id),
        "published": None if not publish else {k: publish.get(k) for k in (
            "registry", "repository", "full_tag", "alias", "digest", "pull", "published_at")},
        "repro": _repro(_read(directory, entry.tag, "repro")),
    }


def render_json(records: list[dict]) -> str:
    return json.dumps({"schema": SCHEMA, "images": records}, indent=2, sort_keys=True) + "\n"


def _gb(size) -> str:
    return f"{size / 1e9:.2f} GB" if size else "—"


def _num(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "—"


def _smoke_cell(s: dict) -> str:
    if s["verdict"] == "not run":
        return "not run"
    return f"{'✓' if s['verdict'] == 'passed' else '✕'} {s['verdict']} ({s.get('level_text')}, {s.get('date')})"


def render_markdown(records: list[dict], source: str) -> str:
    rows = [[f"`{r['tag']}`", f"`{r['published']['full_tag']}`" if r["published"] else "not published",
             f"`{r['published']['digest'][:19]}…`" if r["published"] else "—", _gb(r["size_bytes"]), r["min_driver"],
             _smoke_cell(r["smoke"]), _num(r["smoke"].get("steps_per_s"), ".2f"),
             _num(r["smoke"].get("busbw_gbps"), ".2f"), (r["repro"] or {}).get("verdict", "—")] for r in records]
    lines = [
        "# Images", "",
        f"<!-- generated by `python -m builder catalog` from {source}; do not edit -->", "",
        "Every tag of the matrix, what is in it and what proved it. A tag is published only after its smoke gate",
        "passed for that exact image ID; pull by digest for an image that can never change under you.", "",
        log.table(("tag", "full tag", "digest", "size", "min driver", "smoke", "steps/s", "busbw GB/s", "repro"),
                  rows), "",
    ]
    for r in records:
        if not (r["built"] or r["published"] or r["smoke"]["verdict"] != "not run" or r["lock_exceptions"]):
            continue
        lines += [f"## `{r['tag']}`", ""]
        if r["published"]:
            p = r["published"]
            lines += [f"- full tag: `{p['repository']}:{p['full_tag']}`", f"- digest: `{p['digest']}`",
                      f"- pull: `docker pull {p['pull']}` (published {p['published_at']})"]
        lines += [f"- image ID: `{r['image_id']}`" if r["image_id"] else "- image ID: —",
                  f"- size: {_gb(r['size_bytes'])}, Python {r['python']}, CUDA {r['cuda']}, base {r['base']}",
                  f"- minimum NVIDIA driver: {r['min_driver']}"]
        s = r["smoke"]
        figures = ", ".join(x for x in (
            f"{s['steps_per_s']:.2f} steps/s" if isinstance(s.get("steps_per_s"), (int, float)) else "",
            f"loss {s['loss_first']:.4f} → {s['loss_last']:.4f}"
            if isinstance(s.get("loss_first"), (int, float)) and isinstance(s.get("loss_last"), (int, float)) else "",
            f"busbw {s['busbw_gbps']:.2f} GB/s ({s.get('ranks')} ranks {s.get('backend')})"
            if isinstance(s.get("busbw_gbps"), (int, float)) else "") if x)
        lines.append(f"- smoke: {_smoke_cell(s)}" + (f": {figures}" if figures else ""))
        lines.append(f"- proven: {'built by our CI in every run' if r['ci_builds'] else 'not built by our CI'}; "
                     f"gate {s.get('level_text', 'none')}")
        for line in r["lock_exceptions"]:
            lines.append(f"- lock exception (declared in matrix.yaml): {line}")
        if r["exceptions"]:
            lines.append(f"- published with exceptions: {', '.join(r['exceptions'])} (see docs/publishing.md)")
        if r["repro"]:
            rp = r["repro"]
            extra = [f"{rp['differences']} differences" if rp.get("differences") is not None else "",
                     rp.get("date") or ""]
            lines.append(f"- rebuild from scratch: {rp['verdict']}"
                         + (f" ({', '.join(x for x in extra if x)})" if any(extra) else ""))
        lines += ["", log.table(("package", "version"), [[k, v or "—"] for k, v in r["versions"].items()]),
                  f"\nVersions: {r['versions_source']}.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def generate(entries: list[Entry], directory: Path) -> dict[str, str]:
    records = [record(e, directory) for e in entries]
    return {MARKDOWN: render_markdown(records, "the step reports"), JSON: render_json(records)}


def main(args: Options, m) -> int:
    directory = Path(args.reports) if args.reports else paths.reports_dir()
    files = generate(list(m.entries), directory)
    out = Path(args.out)
    if args.check:
        stale = [name for name, text in files.items()
                 if not (out / name).exists() or (out / name).read_text() != text]
        if stale:
            raise UserError(f"{', '.join(str(out / n) for n in stale)}: stale (the reports say otherwise)",
                            "run `python -m builder catalog` and commit the result")
        log.info(f"{MARKDOWN} and {JSON} are up to date")
        return 0
    for name, text in files.items():
        target = out / name
        if not target.exists() or target.read_text() != text:
            fsutil.write_atomic(target, text)
            log.info(f"wrote {target}")
    if out.resolve() == Path(".").resolve():
        # The README's table shows how far each tag is proven, read from images.json: keep it in step.
        from builder.steps import readme

        for path in readme.write(m):
            log.info(f"wrote {path} (the proven column)")
    published = sum(1 for e in json.loads(files[JSON])["images"] if e["published"])
    log.info(f"{len(m.entries)} tags in the catalog, {published} published")
    return 0
