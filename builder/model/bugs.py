"""Known release bugs as version ranges (builder/data/knowledge/bugs.yaml), judged against an entry's pins.

A release bug is data only with its upstream issue and the first release with the fix, and it applies to the
whole affected range: a row names the distribution, a PEP 440 range, the other pins it also needs (`when`) and
how it hurts. The judge here only reads that data (no network, no subprocess):
- what a typical fine-tune with the stack hits (scope `common`: any ZeRO-2 run with gradient accumulation, any
  resume) rejects the entry: silent wrong results (gradients, loss, weights, checkpoints) and crashes alike;
- what only a narrow configuration hits (an option, a race, one model family) warns, naming the configuration:
  the image serves every configuration, and a shipped stack is not broken for the jobs that avoid it;
- a silent bug the entry names (its id or issue URL) in `accepted` is a warning, not a rejection.
Rows that do not apply produce no outcome, so `compat TAG` lists only what concerns the entry.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from importlib import resources

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from builder.errors import CompatError
from builder.model.matrix import PACKAGES, Entry
from builder.model.verdict import Outcome

DATA = "data/knowledge/bugs.yaml"
REQUIRED = ("id", "package", "affected", "fixed_in", "effect", "scope", "config", "symptom", "issue", "fix",
            "evidence")
OPTIONAL = ("when", "introduced", "needs")
EFFECTS = ("silent", "crash")
SCOPES = ("common", "narrow")
# What `when` may test besides the package itself: another pin, or the entry's Python and CUDA lines.
WHEN_KEYS = (*PACKAGES, "python", "cuda")
# `needs: ops`: only a stack that compiles DeepSpeed's CUDA ops hits the bug (compat.yaml's rules say the same).
NEEDS = ("ops",)
ID_RE = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*")
# An upstream report or fix: a GitHub issue, pull request (a comment anchor allowed) or commit.
URL_RE = re.compile(r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/"
                    r"(?:(?:issues|pull)/[0-9]+(?:#[A-Za-z0-9_-]+)?|commit/[0-9a-f]{7,40})")
# A version far past every release: an open-ended range (an unfixed bug) must contain it.
FAR_FUTURE = Version("9999")


@lru_cache(maxsize=1)
def _loaded() -> tuple[dict, ...]:
    text = resources.files("builder").joinpath(DATA).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return tuple(data["bugs"]) if isinstance(data, dict) and isinstance(data.get("bugs"), list) else ()


def rows() -> list[dict]:
    """The rows of bugs.yaml, as written (copies: callers may not change the cached data)."""
    return copy.deepcopy(list(_loaded()))


@lru_cache(maxsize=1)
def _checked() -> tuple[dict, ...]:
    found = problems(list(_loaded()))
    if found:
        raise CompatError(f"{DATA} is malformed: " + "; ".join(found[:5]),
                          hint="fix the rows named; tests/unit/test_bugs.py checks the schema")
    return _loaded()


# --- the judge ----------------------------------------------------------------------------------------


def evaluate(entry: Entry, accepted: tuple[str, ...] = (), ops: bool = True) -> list[Outcome]:
    """One outcome per known bug that the entry's pins fall into, in the data's order. `accepted`: bug ids or
    issue URLs the entry declares it lives with (silent bugs only). ops=False: the stack never compiles
    DeepSpeed's CUDA ops, so rows with `needs: ops` do not apply."""
    found = [_outcome(entry, row, accepted) for row in _checked() if applies(row, entry, ops)]
    known = {key for row in _checked() for key in (row["id"], row["issue"])}
    return found + [_unknown(ref) for ref in accepted if ref not in known]


def _unknown(ref: str) -> Outcome:
    # A typo in an acceptance would leave the user believing a bug is accepted (or a stale one would accept
    # nothing): say so instead of ignoring it.
    return Outcome("accept-bugs-known", "bug", "accept_bugs", False,
                   f"accept_bugs names {ref!r}, which no row of {DATA} has (neither its id nor its issue URL); "
                   "write the id or issue URL that `validate` printed for the bug, or drop it", DATA)


def applies(row: dict, entry: Entry, ops: bool = True) -> bool:
    """Is the entry's pin of the row's package inside the affected range, with every `when` key pinned and
    matching? A `when` key the entry does not pin means the bug cannot apply."""
    if row.get("needs") == "ops" and not ops:
        return False
    if not _inside(entry.pins.get(row["package"]), row["affected"]):
        return False
    return all(_inside(_value(entry, key), spec) for key, spec in (row.get("when") or {}).items())


def _value(entry: Entry, key: str) -> str | None:
    if key == "python":
        return entry.python
    if key == "cuda":
        return entry.cuda
    return entry.pins.get(key)


def _inside(version: str | None, spec: str) -> bool:
    # prereleases=True: a pinned release candidate inside the range carries the same bug.
    return version is not None and SpecifierSet(spec).contains(Version(version), prereleases=True)


def _outcome(entry: Entry, row: dict, accepted: tuple[str, ...]) -> Outcome:
    waived = row["effect"] == "silent" and (row["id"] in accepted or row["issue"] in accepted)
    rejects = not waived and row["scope"] == "common"
    reason = _reason(entry, row)
    if waived:
        reason += " (accepted by the entry)"
    source = "; ".join(url for url in (row["issue"], row["fix"]) if url)
    return Outcome(row["id"], "bug", row["package"], False if rejects else None, reason, source,
                   warn=not rejects)


def _reason(entry: Entry, row: dict) -> str:
    package = row["package"]
    pinned = f"{package} {entry.pins[package]}"
    when = row.get("when") or {}
    others = "".join(f" with {key} {_value(entry, key)}" for key in when)
    needs = "".join(f", {key} {spec}" for key, spec in when.items())
    what = "silent wrong results" if row["effect"] == "silent" else "crash"
    if row["fixed_in"]:
        remedy = f"fixed in {row['fixed_in']}: use >= {row['fixed_in']}"
    else:
        remedy = "not fixed upstream" + (f": move off {', '.join(f'{k} {s}' for k, s in when.items())}"
                                          if when else "")
    return (f"{pinned}{others}: {row['symptom']} ({what}, hit by: {row['config']}); affected: {package} "
            f"{row['affected']}{needs}; {remedy}")


# --- the data's schema --------------------------------------------------------------------------------


def problems(data: list) -> list[str]:
    """Every way the rows break the schema documented in bugs.yaml, one line each; empty when sound."""
    found: list[str] = []
    seen: set[str] = set()
    for number, row in enumerate(data, 1):
        if not isinstance(row, dict):
            found.append(f"row {number}: not a mapping")
            continue
        name = f"row {number} ({row.get('id', '?')})"
        found += [f"{name}: {p}" for p in _row_problems(row)]
        if row.get("id") in seen:
            found.append(f"{name}: duplicate id")
        seen.add(row.get("id"))
    return found


def _row_problems(row: dict) -> list[str]:
    missing = [k for k in REQUIRED if k not in row]
    unknown = sorted(set(row) - set(REQUIRED) - set(OPTIONAL))
    if missing or unknown:
        return [f"missing keys {missing}" if missing else f"unknown keys {unknown}"]
    found = []
    if not isinstance(row["id"], str) or not ID_RE.fullmatch(row["id"]):
        found.append(f"id {row['id']!r} is not kebab-case")
    if row["package"] not in PACKAGES:
        found.append(f"package {row['package']!r} is not one of {', '.join(PACKAGES)}")
    if row["effect"] not in EFFECTS:
        found.append(f"effect {row['effect']!r} is not one of {EFFECTS}")
    if row["scope"] not in SCOPES:
        found.append(f"scope {row['scope']!r} is not one of {SCOPES}")
    for key in ("config", "symptom", "evidence"):
        if not isinstance(row[key], str) or not row[key].strip() or "\n" in row[key]:
            found.append(f"{key} must be one non-empty line")
    found += _range_problems(row)
    found += _url_problems(row)
    found += _when_problems(row)
    if row.get("needs") not in (None, *NEEDS):
        found.append(f"needs {row['needs']!r} is not one of {NEEDS}")
    return found


def _range_problems(row: dict) -> list[str]:
    affected, fixed = row["affected"], row["fixed_in"]
    spec = _spec(affected)
    if spec is None:
        return [f"affected {affected!r} is not a PEP 440 specifier"]
    if example_version(affected) is None:
        return [f"affected {affected!r} contains no version"]
    if fixed is None:
        # An unfixed bug rejects every future release: it must be narrowed to the pins that trigger it.
        problems_ = [] if spec.contains(FAR_FUTURE, prereleases=True) else ["unfixed (fixed_in null) but affected "
                                                                            "has an upper bound"]
        return problems_ + ([] if row.get("when") else ["unfixed bug without `when`: it would reject every "
                                                         "future release"])
    version = _version(fixed)
    if version is None:
        return [f"fixed_in {fixed!r} is not a canonical version"]
    if spec.contains(version, prereleases=True):
        return [f"fixed_in {fixed} is inside affected {affected}"]
    if Version(example_version(affected)) > version:
        return [f"affected {affected} lies above fixed_in {fixed}"]
    return []


def _url_problems(row: dict) -> list[str]:
    found = []
    for key in ("issue", "fix", "introduced"):
        url = row.get(key)
        if url is None and (key == "introduced" or (key == "fix" and row["fixed_in"] is None)):
            continue
        if not isinstance(url, str) or not URL_RE.fullmatch(url):
            found.append(f"{key} {url!r} is not a GitHub issue, pull request or commit URL")
    return found


def _when_problems(row: dict) -> list[str]:
    when = row.get("when")
    if when is None:
        return []
    if not isinstance(when, dict) or not when:
        return ["when must be a non-empty mapping"]
    found = []
    for key, spec in when.items():
        if key not in WHEN_KEYS or key == row["package"]:
            found.append(f"when key {key!r} is not another pin, python or cuda")
        elif not isinstance(spec, str) or _spec(spec) is None or example_version(spec) is None:
            found.append(f"when {key}: {spec!r} is not a satisfiable PEP 440 specifier")
    return found


def _spec(text) -> SpecifierSet | None:
    try:
        return SpecifierSet(text) if isinstance(text, str) and text.strip() else None
    except InvalidSpecifier:
        return None


def _version(text) -> Version | None:
    try:
        version = Version(text) if isinstance(text, str) else None
    except InvalidVersion:
        return None
    return version if version is not None and str(version) == text else None


def example_version(spec: str) -> str | None:
    """A version inside `spec`, built from the versions it names (the highest that fits, so the one nearest a
    fix): a stack inside the range for tests, and proof that the range is not empty. None when none fits."""
    parsed = _spec(spec)
    if parsed is None:
        return None
    named = [Version(s.version) for s in parsed if not s.version.endswith(".*")]
    candidates = sorted({c for v in named for c in (v, _below(v), Version(f"{v.public}.post1"))}
                        | {Version("0.1")})
    inside = [c for c in candidates if parsed.contains(c, prereleases=True)]
    return str(inside[-1]) if inside else None


def _below(version: Version) -> Version:
    """A release just below `version` (4.46.0 -> 4.45.99, 0.15.2 -> 0.15.1, 2.0 -> 1.99)."""
    parts = list(version.release)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] > 0:
            parts[i] -= 1
            parts[i + 1:] = [99] * (len(parts) - i - 1)
            return Version(".".join(map(str, parts)))
    return Version("0")
