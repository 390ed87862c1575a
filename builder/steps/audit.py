"""Known vulnerabilities of an image's packages (`python -m builder audit TAG|IMAGE`), against waivers.yaml.

Python packages: the package index's vulnerability data for each installed release (builder/boundary/vulndb.py),
listed by the image itself (smoke/inventory.py). OS packages: no vulnerability database is reachable from our
machines (Debian's security tracker and OSV are not; only the archive is), so the audit says so in one line and
the weekly rebuild, which installs the archive's current security updates, is what refreshes them.
Waivers and severities: builder/model/audit.py. A tag's verdict is kept in build/reports/<tag>.audit.json.

`--lock` audits what a tag's committed locks pin instead of an image: no engine, no build. The scheduled refresh
runs it right after the re-lock, so an entry whose refreshed set still carries a vulnerability above the
workflow's --max-severity stops before its build (the audit says which package; a pin in matrix.yaml, not a
rebuild, is what fixes that) instead of after an hour of building, at publish.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from builder import fsutil, log, reports
from builder.boundary import engine, inspect, vulndb
from builder.errors import UserError
from builder.flags import arg, switch
from builder.model import audit, lockfile, paths, reference

OS_NOT_AUDITED = ("OS packages: not audited: no vulnerability database for them is reachable here (Debian's "
                  "security tracker and OSV are not); the weekly rebuild installs the archive's security updates")


def max_severity():
    """The --max-severity field, also publish's."""
    return arg("--max-severity", default=None, choices=audit.LEVELS[:-1], metavar="LEVEL",
               help=f"fail when an unwaived vulnerability is above LEVEL ({', '.join(audit.LEVELS[:-1])}); "
                    "one with no recorded severity counts as above critical")


@dataclass(frozen=True)
class Options:
    target: str = arg(metavar="TAG|IMAGE", help="a matrix tag (its local image) or an image reference")
    waivers: str = arg("--waivers", default=str(audit.DEFAULT_WAIVERS), metavar="PATH",
                       help="waivers and severities (default waivers.yaml)")
    max_severity: str | None = max_severity()
    json: str | None = arg("--json", default=None, metavar="PATH", help="also write the verdict as JSON")
    lock: bool = switch("--lock", help="audit what TAG's locks pin (locks/TAG/), not an image: no engine needed")


def audit_image(image, waivers_path: str, max_severity: str | None, today: dt.date | None = None) -> dict:
    """The verdict for a local image (docker SDK Image): its packages, the index's data, the waivers."""
    rules = audit.load(Path(waivers_path))  # a bad waivers file stops here, before any network
    inventory = inspect.inventory(image.id)
    packages = [(p["name"], p["version"]) for p in inventory.get("python_packages", [])]
    return {**_assess(packages, rules, max_severity, today), "image_id": image.id}


def audit_lock(entry, waivers_path: str, max_severity: str | None, today: dt.date | None = None) -> dict:
    """The verdict for what the entry's locks pin (every Python lock of locks/<tag>/)."""
    rules = audit.load(Path(waivers_path))
    where = paths.lock_dir(entry)
    pins = lockfile.current_pins(where)
    if not pins:
        raise UserError(f"{where}: no Python lock to audit", f"run `python -m builder lock {entry.tag}`")
    packages = [tuple(pin.split("==", 1)) for pin in pins]
    return {**_assess(packages, rules, max_severity, today), "lock": str(where)}


def _assess(packages, rules: dict, max_severity: str | None, today: dt.date | None) -> dict:
    verdict = audit.assess(vulndb.releases(packages), rules, today or dt.datetime.now(dt.timezone.utc).date(),
                           max_severity)
    return {**verdict, "os": OS_NOT_AUDITED, "summary": audit.summary(verdict)}


def _entry(name: str, m):
    """The matrix entry a tag names, or None (then `name` is an image reference)."""
    return next((e for e in m.entries if e.tag == name), None) if m is not None else None


def _verdict(options: Options, m) -> tuple[dict, str | None]:
    """(verdict, the tag whose audit report it is, or None)."""
    entry = _entry(options.target, m)
    if options.lock:
        if entry is None:
            raise UserError(f"audit --lock {options.target}: not a matrix tag", "give a tag of matrix.yaml")
        subject, tag = str(paths.lock_dir(entry)), None  # build/reports/<tag>.audit.json stays the image's
        assess = functools.partial(audit_lock, entry)
    else:
        if entry is None:
            reference.check_image_name(options.target)
            ref, tag = options.target, None
        else:
            ref, tag = paths.image_ref(entry), entry.tag
        engine.sdk()
        image = engine.image_or_none(ref)
        if image is None:
            raise UserError(f"there is no local image {ref}", "build or pull it first")
        subject, assess = ref, functools.partial(audit_image, image)
    with log.step(f"audit {subject}") as note:
        verdict = assess(options.waivers, options.max_severity)
        note["result"] = f"{len(verdict['findings'])} known vulnerabilities"
    return verdict, tag


def main(options: Options, m=None) -> int:
    verdict, tag = _verdict(options, m)
    rows = [[r["package"], r["version"], r["id"], r["level"], ", ".join(r["fixed_in"]) or "—",
             f"waived until {r['waived']['expires']}" if r["waived"] else "open"] for r in verdict["findings"]]
    log.out(log.table(("package", "version", "vulnerability", "severity", "fixed in", "status"), rows) if rows
          else "(no known vulnerabilities in the audited Python packages)")
    for line in [f"not audited: {k} ({why})" for k, why in verdict["not_audited"].items()] + [verdict["os"]]:
        log.out(line)
    if tag:
        reports.write(tag, "audit", verdict)
    if options.json:
        fsutil.write_atomic(Path(options.json), json.dumps(verdict, indent=1, sort_keys=True))
    failed = audit.problems(verdict, options.waivers)
    for line in failed:
        log.info(f"error: {line}")
    log.out(verdict["summary"])
    return 1 if failed else 0
