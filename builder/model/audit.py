"""What `builder audit` decides, from what was found: waivers (each with a reason and an expiry date; an expired
one fails the audit), severities, and whether an image is above `--max-severity`. Pure: data in, verdict out.

Severity: the package index's vulnerability data has none (OSV ids, aliases, fixed_in only) and OSV's own API
is not reachable from our machines. So a severity is what waivers.yaml records for an id, with the source it
was read from (an advisory page); an id nobody rated is `unrated`, ranked above critical: `--max-severity`
never lets an unrated vulnerability through. Waive it (with a reason and an expiry) or rate it (with a source).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.errors import MatrixError
from builder.model import yamlread

DEFAULT_WAIVERS = Path("waivers.yaml")
LEVELS = ("none", "low", "medium", "high", "critical", "unrated")  # ascending; "none": no finding at all
ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*-[A-Za-z0-9:._-]{1,80}")  # PYSEC-2024-1, GHSA-xxxx-…, CVE-2024-1
NOTE_RE = re.compile(r"[^\x00-\x1f\x7f]{10,300}")
WAIVER_KEYS = {"id", "package", "reason", "expires"}
SEVERITY_KEYS = {"id", "level", "source"}


def _date(value, fail) -> dt.date:
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError:
        fail(f"{str(value)[:40]!r} is not a date", "write YYYY-MM-DD, e.g. 2027-01-31")
        raise  # fail() raises; this line only tells readers so


def _items(data, key: str, known: set[str], fail) -> list:
    items = data.get(key) or []
    if not isinstance(items, list):
        fail(data.key_lines.get(key, 1), key, "expected a list", f"write `{key}:` then `- id: …` items")
    for index, item in enumerate(items):
        if not isinstance(item, yamlread.LineDict):
            fail(data.key_lines.get(key, 1), f"{key}[{index}]", "expected a mapping", "e.g. `- id: PYSEC-2024-1`")
        extra = set(item) - known
        if extra or not known <= set(item):
            fail(item.line, f"{key}[{index}]", f"needs exactly {', '.join(sorted(known))}",
                 f"unknown: {', '.join(sorted(map(str, extra)))}" if extra else "one is missing")
        if not isinstance(item["id"], str) or not ID_RE.fullmatch(item["id"]):
            fail(item.key_lines["id"], f"{key}[{index}].id", f"{str(item['id'])[:40]!r} is not an advisory id",
                 "e.g. PYSEC-2024-1, GHSA-xxxx-xxxx-xxxx or CVE-2024-1234")
    return items


def load(path: Path = DEFAULT_WAIVERS) -> dict:
    """{"waivers": [...], "severities": {id: {"level", "source"}}}; a missing file is an empty one.
    Raises MatrixError naming file:line and the field."""
    if not Path(path).exists():
        return {"waivers": [], "severities": {}}
    data = yamlread.load(Path(path))

    def fail(line: int, where: str, message: str, hint: str = "") -> None:
        raise MatrixError(f"{path}:{line}: {where}: {message}", hint or None)

    if data is None:
        return {"waivers": [], "severities": {}}
    if not isinstance(data, yamlread.LineDict) or set(data) - {"waivers", "severities"}:
        fail(1, "waivers", "expected a mapping with `waivers:` and `severities:` only", "see waivers.yaml's header")
    waivers = []
    for index, item in enumerate(_items(data, "waivers", WAIVER_KEYS, fail)):
        where = f"waivers[{index}]"
        if not isinstance(item["reason"], str) or not NOTE_RE.fullmatch(item["reason"]):
            fail(item.key_lines["reason"], f"{where}.reason", "must be one line of 10 to 300 characters",
                 "say why the vulnerability does not apply or cannot be fixed yet")
        if not isinstance(item["package"], str) or not item["package"].strip():
            fail(item.key_lines["package"], f"{where}.package", "must name the Python package", "e.g. torch")
        expires = _date(item["expires"], lambda m, h, ln=item.key_lines["expires"], w=where: fail(ln, f"{w}.expires",
                                                                                                   m, h))
        waivers.append({"id": item["id"], "package": str(canonicalize_name(item["package"])),
                        "reason": item["reason"], "expires": expires.isoformat(), "line": item.line})
    severities = {}
    for index, item in enumerate(_items(data, "severities", SEVERITY_KEYS, fail)):
        if item["level"] not in LEVELS[1:-1]:
            fail(item.key_lines["level"], f"severities[{index}].level", f"{str(item['level'])[:20]!r} is not a level",
                 f"one of {', '.join(LEVELS[1:-1])}")
        if not isinstance(item["source"], str) or not item["source"].startswith("https://"):
            fail(item.key_lines["source"], f"severities[{index}].source", "must be the https:// page the level "
                 "was read from", "e.g. https://github.com/advisories/GHSA-…")
        severities[item["id"]] = {"level": item["level"], "source": item["source"]}
    return {"waivers": waivers, "severities": severities}


def findings(found: dict[tuple[str, str], dict]) -> list[dict]:
    """One row per (package, vulnerability) from vulndb.releases()'s answer."""
    out = []
    for (name, version), answer in sorted(found.items()):
        for v in answer["vulnerabilities"]:
            out.append({"package": str(canonicalize_name(name)), "version": version, "id": v.get("id"),
                        "aliases": sorted(v.get("aliases") or []), "fixed_in": sorted(v.get("fixed_in") or []),
                        "link": v.get("link")})
    return out


def level_of(finding: dict, severities: dict) -> tuple[str, str | None]:
    """(level, source) recorded for the finding's id or any alias; ("unrated", None) when none is."""
    for ident in (finding["id"], *finding["aliases"]):
        if ident in severities:
            return severities[ident]["level"], severities[ident]["source"]
    return "unrated", None


def assess(found: dict[tuple[str, str], dict], rules: dict, today: dt.date, max_severity: str | None) -> dict:
    """The audit's verdict: every finding with its level and waiver, the expired waivers, what is above
    max_severity, and passed (no expired waiver, nothing unwaived above max_severity)."""
    rows = []
    for f in findings(found):
        level, source = level_of(f, rules["severities"])
        waiver = next((w for w in rules["waivers"] if w["package"] == f["package"]
                       and w["id"] in (f["id"], *f["aliases"])), None)
        rows.append({**f, "level": level, "level_source": source,
                     "waived": {"reason": waiver["reason"], "expires": waiver["expires"]} if waiver else None})
    expired = [w for w in rules["waivers"] if dt.date.fromisoformat(w["expires"]) < today]
    limit = LEVELS.index(max_severity) if max_severity else len(LEVELS)
    above = [r for r in rows if not r["waived"] and LEVELS.index(r["level"]) > limit]
    not_audited = {f"{n} {v}": a["why"] for (n, v), a in sorted(found.items()) if a["data"] == "none"}
    return {"audited_on": today.isoformat(), "max_severity": max_severity, "python_packages": len(found),
            "not_audited": not_audited, "findings": rows, "waived": sum(1 for r in rows if r["waived"]),
            "expired_waivers": [{k: w[k] for k in ("id", "package", "expires", "line")} for w in expired],
            "above_max_severity": [f"{r['package']} {r['version']}: {r['id']} ({r['level']})" for r in above],
            "passed": not expired and not above}


def problems(verdict: dict, waivers_path) -> list[str]:
    """Why the audit failed, one line each; empty when it passed."""
    out = [f"{waivers_path}:{w['line']}: waiver for {w['id']} ({w['package']}) expired on {w['expires']}: renew it "
           "with a new reason and date, or remove it once the package is upgraded" for w in verdict["expired_waivers"]]
    out += [f"above --max-severity {verdict['max_severity']}: {line}" for line in verdict["above_max_severity"]]
    return out


def summary(verdict: dict) -> str:
    """One line for IMAGES.md, verify and the publish report."""
    levels = {}
    for r in verdict["findings"]:
        if not r["waived"]:
            levels[r["level"]] = levels.get(r["level"], 0) + 1
    open_ = ", ".join(f"{n} {level}" for level, n in sorted(levels.items(), key=lambda kv: -LEVELS.index(kv[0])))
    audited = verdict["python_packages"] - len(verdict["not_audited"])
    return (f"audit {verdict['audited_on']}: {'passed' if verdict['passed'] else 'FAILED'}; "
            f"{audited}/{verdict['python_packages']} Python packages audited, "
            f"{len(verdict['findings'])} known vulnerabilities ({verdict['waived']} waived"
            f"{', open: ' + open_ if open_ else ''}); OS packages not audited")
