"""IMAGES.md and images.json: what exists, what is in it, and what proved it (step 8).

Generated only from the matrix and the step reports (build, smoke, publish, repro), never from the
clock, so the same reports give byte-identical files and `catalog --check` can catch a stale catalog.
A smoke verdict counts only for the image ID it was run on: a report for another ID shows as stale.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from builder import fsutil, log, readme, reports
from builder.errors import EnvironmentProblem, UserError
from builder.flags import arg, switch
from builder.model import compat, paths, proof
from builder.model.matrix import PACKAGES, Entry

MARKDOWN, JSON = "IMAGES.md", "images.json"
SCHEMA = 1


@dataclass(frozen=True)
class Options:
    check: bool = switch("--check", help="exit 2 if IMAGES.md or images.json is stale")
    reports: str | None = arg("--reports", default=None, metavar="DIR",
                              help="read reports from DIR (default: build/reports)")
    out: str = arg("--out", default=".", metavar="DIR", help="where IMAGES.md and images.json go (default: .)")


# --- Markdown: nothing from a report may become markup --------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")
_MARKUP = re.compile(r"([\\`*_{}\[\]<>()#!|~&@]|:(?=//))")
_PLAIN_CODE = re.compile(r"[A-Za-z0-9._:/@+-]+")


def _md(value) -> str:
    """Text from a report as inert Markdown: one line, every markup character backslash-escaped, no
    autolinks (`://`, `www.` and `@` are broken up), so no heading, HTML, link, table cell or code span."""
    text = _CONTROL.sub(" ", str(value)).strip()
    if len(text) > 200:
        text = text[:197] + "..."
    text = _MARKUP.sub(r"\\\1", text)
    return re.sub(r"(?i)\b(www)\.", r"\1\\.", text)


def _code(value) -> str:
    """A code span for identifier-like values; anything else as escaped text."""
    text = str(value)
    return f"`{text}`" if _PLAIN_CODE.fullmatch(text) else _md(text)


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
    level = smoke.get("level") if isinstance(smoke.get("level"), dict) else {"kind": smoke.get("mode")}
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
    return {"verdict": repro.get("result"), "date": (repro.get("finished_at") or "")[:10] or None,
            "differences": repro.get("differences")}


def _read(directory: Path, tag: str, step: str) -> dict | None:
    return reports.read(tag, step, required=False, directory=directory)  # held to the step's schema


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
        "built_with": (build or {}).get("docker") if (build or {}).get("image_id") == image_id else None,
        "ci_builds": entry.ci,
        "exceptions": [str(x) for x in (publish or {}).get("exceptions") or []],
        "lock_exceptions": [f"{name}: {why}" for name, why in sorted(entry.lock_exceptions.items())],
        "smoke": _smoke(smoke, image_id),
        "published": None if not publish else {**{k: publish.get(k) for k in (
            "registry", "repository", "full_tag", "alias", "digest", "pull", "published_at", "layer_compression")},
            **({"audit": publish["audit"]} if publish.get("audit") else {})},  # publish --max-severity's audit
        "repro": _repro(_read(directory, entry.tag, "repro")),
    }


# Who can pull an image, by the compression of its layers (docs/publishing.md).
CLIENT_FLOOR = {"zstd": "pulls need Docker >= 23 or containerd >= 1.5",
                "gzip": "any OCI client pulls it"}


def render_json(records: list[dict]) -> str:
    return json.dumps({"schema": SCHEMA, "images": records}, indent=2, sort_keys=True) + "\n"


def _gb(size) -> str:
    return f"{size / 1e9:.2f} GB" if size else "—"


def _num(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "—"


def _smoke_cell(s: dict) -> str:
    if s["verdict"] == "not run":
        return "not run"
    mark = "✓" if s["verdict"] == "passed" else "✕"
    return f"{mark} {s['verdict']} ({_md(s.get('level_text'))}, {_md(s.get('date'))})"


def render_markdown(records: list[dict], source: str) -> str:
    rows = [[_code(r["tag"]), _code(r["published"]["full_tag"]) if r["published"] else "not published",
             f"{_code(str(r['published']['digest'])[:19])}…" if r["published"] else "—", _gb(r["size_bytes"]),
             _md(r["min_driver"]), _smoke_cell(r["smoke"]), _num(r["smoke"].get("steps_per_s"), ".2f"),
             _num(r["smoke"].get("busbw_gbps"), ".2f"), _md((r["repro"] or {}).get("verdict", "—"))] for r in records]
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
        lines += [f"## {_code(r['tag'])}", ""]
        if r["published"]:
            p = r["published"]
            pull = f"`docker pull {p['pull']}`" if _PLAIN_CODE.fullmatch(str(p["pull"])) else _md(p["pull"])
            full = f"{p['repository']}:{p['full_tag']}"
            lines += [f"- full tag: {_code(full)}",
                      f"- digest: {_code(p['digest'])}", f"- pull: {pull} (published {_md(p['published_at'])})"]
            if p.get("layer_compression") in CLIENT_FLOOR:
                lines.append(f"- layers: {p['layer_compression']} ({CLIENT_FLOOR[p['layer_compression']]})")
            lines.append(f"- vulnerabilities: {_md(p.get('audit') or 'not audited at publish (no --max-severity)')}")
        lines += [f"- image ID: {_code(r['image_id'])}" if r["image_id"] else "- image ID: —",
                  f"- size: {_gb(r['size_bytes'])}, Python {_md(r['python'])}, CUDA {_md(r['cuda'])}, "
                  f"base {_md(r['base'])}", f"- minimum NVIDIA driver: {_md(r['min_driver'])}"]
        s = r["smoke"]
        figures = ", ".join(x for x in (
            f"{s['steps_per_s']:.2f} steps/s" if isinstance(s.get("steps_per_s"), (int, float)) else "",
            f"loss {s['loss_first']:.4f} → {s['loss_last']:.4f}"
            if isinstance(s.get("loss_first"), (int, float)) and isinstance(s.get("loss_last"), (int, float)) else "",
            f"busbw {s['busbw_gbps']:.2f} GB/s ({_md(s.get('ranks'))} ranks {_md(s.get('backend'))})"
            if isinstance(s.get("busbw_gbps"), (int, float)) else "") if x)
        lines.append(f"- smoke: {_smoke_cell(s)}" + (f": {figures}" if figures else ""))
        lines.append(f"- proven: {'built by our CI in every run' if r['ci_builds'] else 'not built by our CI'}; "
                     f"gate {_md(s.get('level_text', 'none'))}")
        if proof.engine_phrase(r.get("built_with")):
            lines.append(f"- built with: {_md(proof.engine_phrase(r['built_with']))}")
        for line in r["lock_exceptions"]:
            lines.append(f"- lock exception (declared in matrix.yaml): {_md(line)}")
        if r["exceptions"]:
            lines.append(f"- published with exceptions: {_md(', '.join(r['exceptions']))} (see docs/publishing.md)")
        if r["repro"]:
            rp = r["repro"]
            extra = [f"{_md(rp['differences'])} differences" if rp.get("differences") is not None else "",
                     _md(rp.get("date") or "")]
            lines.append(f"- rebuild from scratch: {_md(rp['verdict'])}"
                         + (f" ({', '.join(x for x in extra if x)})" if any(extra) else ""))
        lines += ["", log.table(("package", "version"), [[_md(k), _md(v or "—")] for k, v in r["versions"].items()]),
                  f"\nVersions: {r['versions_source']}.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def generate(entries: list[Entry], directory: Path) -> dict[str, str]:
    records = [record(e, directory) for e in entries]
    return {MARKDOWN: render_markdown(records, "the step reports"), JSON: render_json(records)}


def _fs_error(exc: OSError, what: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"{exc.filename or what}: cannot {'read' if 'read' in what else 'write'} "
                              f"({exc.strerror or exc})", "fix the permissions or free disk space, then run again")


def main(args: Options, m) -> int:
    directory = Path(args.reports) if args.reports else paths.reports_dir()
    if not directory.is_dir():
        # An empty catalog from a mistyped or unmounted directory would look like "nothing was built".
        state = "is not a directory" if directory.exists() else "does not exist"
        raise UserError(f"{directory}: the reports directory {state}",
                        "run build/smoke/publish first, or pass --reports DIR (a CI artifact of build/reports)")
    try:
        files = generate(list(m.entries), directory)
    except OSError as exc:
        raise _fs_error(exc, f"read {directory}") from None
    out = Path(args.out)
    if args.check:
        try:
            stale = [name for name, text in files.items() if not (out / name).is_file()
                     or (out / name).read_text(encoding="utf-8", errors="replace") != text]
        except OSError as exc:
            raise _fs_error(exc, f"read {out}") from None
        if stale:
            raise UserError(f"{', '.join(str(out / n) for n in stale)}: stale (the reports say otherwise)",
                            "run `python -m builder catalog` and commit the result")
        log.info(f"{MARKDOWN} and {JSON} are up to date")
        return 0
    try:
        for name, text in files.items():
            target = out / name
            if not target.is_file() or target.read_text(encoding="utf-8", errors="replace") != text:
                fsutil.write_atomic(target, text)
                log.info(f"wrote {target}")
    except OSError as exc:
        raise _fs_error(exc, str(out)) from None
    if out.resolve() == Path(".").resolve():
        # The README's table shows how far each tag is proven, read from images.json: keep it in step.
        for path in readme.write(m):
            log.info(f"wrote {path} (the proven column)")
    published = sum(1 for e in json.loads(files[JSON])["images"] if e["published"])
    log.info(f"{len(m.entries)} tags in the catalog, {published} published")
    return 0
