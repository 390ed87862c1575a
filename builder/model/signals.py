"""Upstream's own signals about each pinned release, judged offline (issue #45): a release PyPI marks yanked, a
Requires-Python that excludes the entry's Python, no wheel that installs on the entry's Python and base (pip would
build from the sdist), and the Requires-Dist between pinned packages.

The data is builder/data/knowledge/pypi/<name>.json, one file per package, written by builder/derive/pypi_signals.py
(`refresh-compat --signals`) from PyPI's project JSON and each release's core metadata; this module only reads it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.model.matrix import Entry
from builder.model.verdict import Outcome

KIND = "signals"
DATA = "data/knowledge/pypi"
REFRESH = "run `python -m builder refresh-compat --signals`"

# The glibc of each base OS, keyed like compat.yaml base_os (`match` is a substring of the base's tag): a
# manylinux_2_N wheel installs only where N <= the glibc minor (PEP 600).
GLIBC = (
    {"match": "ubuntu20.04", "os": "Ubuntu 20.04", "glibc": 31,
     "source": "https://packages.ubuntu.com/focal/libc6 (2.31-0ubuntu9)"},
    {"match": "ubuntu22.04", "os": "Ubuntu 22.04", "glibc": 35,
     "source": "https://packages.ubuntu.com/jammy/libc6 (2.35-0ubuntu3)"},
    {"match": "ubuntu24.04", "os": "Ubuntu 24.04", "glibc": 39,
     "source": "https://packages.ubuntu.com/noble/libc6 (2.39-0ubuntu8)"},
    {"match": "bookworm", "os": "Debian 12", "glibc": 36,
     "source": "https://packages.debian.org/bookworm/libc6 (2.36-9+deb12u*)"},
    {"match": "trixie", "os": "Debian 13", "glibc": 41,
     "source": "https://packages.debian.org/trixie/libc6 (2.41-12)"},
)
# A base we know nothing about: manylinux_2_28 (AlmaLinux 8's glibc) is what current wheels target, and every
# maintained glibc distribution has at least it; the outcome says it was assumed.
ASSUMED_GLIBC = 28
PEP600 = "https://peps.python.org/pep-0600/ (manylinux_2_N needs glibc >= 2.N); https://peps.python.org/pep-0425/"

# Extras of a pinned package that the training stack installs (transformers[torch,deepspeed] for Trainer with the
# DeepSpeed integration; its `accelerate` extra carries the same accelerate minimum). Only their lower bounds are
# enforced: an upper bound in an extra (transformers 4.52.x's torch<2.7) is a packaging choice that shipped
# stacks override, not a reported failure (see compat.yaml `declared:`). accelerate, peft and datasets: the
# training path uses none of their extras (those are test/dev/quality/vision/audio sets).
USED_EXTRAS = {
    "transformers": ("torch", "accelerate", "deepspeed"),
}
EXTRAS_SOURCE = ("transformers setup.py extras (torch, accelerate, deepspeed); Trainer raises 'Using the `Trainer` "
                 "with `PyTorch` requires `accelerate>=…`' when the extra's minimum is not met")
# What pip needs to build a package from its sdist, where that is more than a C/C++ compiler.
BUILD_NEEDS = {
    "tokenizers": ("a Rust toolchain (its build backend is maturin)",
                   "https://github.com/huggingface/tokenizers/blob/main/bindings/python/pyproject.toml"),
}
DEFAULT_BUILD_NEEDS = "compilers and the package's own build dependencies"
# Installed from a prebuilt wheel on the project's GitHub release, not from PyPI (compat.yaml flash_attn):
# PyPI's file list does not describe what is installed.
NOT_FROM_PYPI = {"flash-attn": "installed from the prebuilt wheel on its GitHub release (compat.yaml flash_attn)"}
LEGACY_MANYLINUX = {"manylinux1": "manylinux_2_5", "manylinux2010": "manylinux_2_12", "manylinux2014": "manylinux_2_17"}
PYPI_HOSTS = ("pypi.org", "pypi.python.org", "files.pythonhosted.org")


def normalise_platform(platform: str) -> str:
    """PEP 600's name for a legacy manylinux tag (manylinux2014_x86_64 -> manylinux_2_17_x86_64)."""
    for old, new in LEGACY_MANYLINUX.items():
        if platform.startswith(old + "_"):
            return new + platform[len(old):]
    return platform


@lru_cache(maxsize=32)
def load(name: str) -> dict | None:
    """The package's signals document, or None where none was generated."""
    path = resources.files("builder").joinpath(f"{DATA}/{name}.json")
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def release(name: str, version: str) -> dict | None:
    doc = load(name)
    if doc is None:
        return None
    wanted = Version(version)
    for raw, row in doc["releases"].items():
        try:
            if Version(raw) == wanted:
                return row
        except InvalidVersion:
            continue
    return None


def evaluate(entry: Entry) -> list[Outcome]:
    """Failing and not-judged outcomes for every pinned package, and one passing summary per package."""
    out = []
    for name, version in entry.pins.items():
        if version is None:
            continue
        row = release(name, version)
        if row is None:
            out.append(Outcome("pypi-signals", KIND, name, None, f"{name} {version} is not in the signals data: "
                               f"{REFRESH}", f"builder/{DATA}/{name}.json"))
            continue
        python = _requires_python(entry, name, version, row)
        # Where Requires-Python already excludes the entry's Python, no wheel for it is the same news again.
        wheel, wheel_note = _wheel(entry, name, version, row) if not python else ([], "")
        failed = _yanked(name, version, row) + python + wheel + _requires_dist(entry, name, version, row)
        if not failed:
            met = sorted({target for _, (target, _), _ in _applicable(entry, name, row)})
            out.append(Outcome("pypi-signals", KIND, name, True,
                               f"{name} {version}: not yanked; Python {entry.python} allowed ({_python_note(row)}); "
                               f"{wheel_note}; " + (f"its requirements on {', '.join(met)} met" if met else
                                                    "no requirement on another pinned package"),
                               _source(name, version, row)))
        out += failed
    return out


def _python_note(row: dict) -> str:
    spec = row.get("requires_python")
    return f"Requires-Python {spec}" if spec else "no Requires-Python"


def _source(name: str, version: str, row: dict) -> str:
    meta = row.get("metadata") or {}
    where = f"; core metadata from {meta['file']} (sha256 {meta['sha256'][:12]}…)" if meta.get("file") else ""
    return f"https://pypi.org/pypi/{name}/json releases[{version}]{where}"


# --- yanked, Requires-Python ------------------------------------------------------------------------------


def _yanked(name: str, version: str, row: dict) -> list[Outcome]:
    if not row.get("yanked"):
        return []
    reason = row.get("yanked_reason")
    said = f': "{reason}"' if reason else " (no reason given)"
    return [Outcome("pypi-yanked", KIND, name, False, f"PyPI marks {name} {version} yanked{said}; pin another "
                    "release", f"https://pypi.org/project/{name}/{version}/")]


def python_admitted(spec: str | None, python: str) -> bool:
    """Does `spec` admit some patch release of the entry's Python (a MAJOR.MINOR, the base decides the patch)?"""
    if not spec:
        return True
    try:
        allowed = SpecifierSet(spec)
    except InvalidSpecifier:
        return True  # metadata pip itself would ignore (it warns and installs)
    return any(allowed.contains(f"{python}.{patch}", prereleases=True) for patch in range(40))


def _requires_python(entry: Entry, name: str, version: str, row: dict) -> list[Outcome]:
    spec = row.get("requires_python")
    if python_admitted(spec, entry.python):
        return []
    return [Outcome("requires-python", KIND, name, False, f"{name} {version} declares Requires-Python {spec}, "
                    f"which excludes the entry's Python {entry.python}: pip refuses to install it",
                    _source(name, version, row))]


# --- wheel tags -------------------------------------------------------------------------------------------


def base_glibc(entry: Entry) -> tuple[int, str, str]:
    """(glibc minor, what it is, its source) for the entry's base."""
    for row in GLIBC:
        if row["match"] in entry.base_name:
            return row["glibc"], f"glibc 2.{row['glibc']} of {row['os']}", row["source"]
    return (ASSUMED_GLIBC, f"glibc 2.{ASSUMED_GLIBC} assumed (manylinux_2_28: base '{entry.base_name}' is not in the "
            "glibc table)", "")


@lru_cache(maxsize=32)
def installable_tags(python: str, glibc: int) -> dict[Tag, int]:
    """What pip accepts for CPython `python` on manylinux x86_64 with glibc 2.`glibc`, each with its preference
    (0 = the tag pip picks first), as packaging.tags orders them for pip."""
    major, minor_ = (int(p) for p in python.split(".")[:2])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(glibc, 4, -1)] + ["linux_x86_64"]
    ordered = [*cpython_tags((major, minor_), platforms=platforms),
               *compatible_tags((major, minor_), interpreter=f"cp{major}{minor_}", platforms=platforms)]
    return {tag: rank for rank, tag in reversed(list(enumerate(ordered)))}


def _tags(row: dict) -> list[Tag]:
    out = []
    for text in row.get("wheel_tags", []):
        interpreter, abi, platform = text.split("-", 2)
        out.append(Tag(interpreter, abi, normalise_platform(platform)))
    return out


def compiled(name: str) -> bool:
    """Does any release of the package in the data ship a platform (non-pure) wheel?"""
    doc = load(name) or {}
    return any(t.platform != "any" for row in doc.get("releases", {}).values() for t in _tags(row))


def _wheel(entry: Entry, name: str, version: str, row: dict) -> tuple[list[Outcome], str]:
    """(failures, the passing note) for "does a wheel of this release install on the entry's Python and base"."""
    if name in NOT_FROM_PYPI:
        return [], NOT_FROM_PYPI[name]
    if name == "torch" and not any(host in entry.index_url for host in PYPI_HOSTS):
        return [], f"wheels from {entry.index_url}, not PyPI (not judged here)"
    glibc, libc, libc_source = base_glibc(entry)
    tags = _tags(row)
    accepted = installable_tags(entry.python, glibc)
    match = [t for t in tags if t in accepted]
    if match:
        return [], f"wheel {min(match, key=accepted.get)} installs ({libc})"
    if not tags and not compiled(name):
        return [], "sdist-only package: pip builds a pure-Python wheel"
    linux = [t for t in tags if t.platform.endswith("x86_64")]
    exist = f"wheels exist for: {_summary(linux)}" if linux else "no Linux x86_64 wheel at all"
    need, need_source = BUILD_NEEDS.get(name, (DEFAULT_BUILD_NEEDS, ""))
    if row.get("sdist"):
        what = f"pip would build {name} {version} from its sdist, which needs {need}"
    else:
        what = f"no wheel installs and there is no sdist: pip finds no distribution of {name} {version}"
    reason = f"{what}: no wheel for CPython {entry.python} on manylinux x86_64 with {libc}; {exist}"
    source = "; ".join(s for s in (_source(name, version, row), PEP600, libc_source, need_source) if s)
    return [Outcome("wheel-tags", KIND, name, False, reason, source)], ""


def _summary(tags: list[Tag]) -> str:
    """cp38..cp312 (manylinux_2_17), cp39-abi3 (…): the interpreters wheels exist for and the glibc they need."""
    by_abi = {}
    for t in tags:
        key = "abi3" if t.abi == "abi3" else ""
        by_abi.setdefault(key, set()).add(t.interpreter)
    parts = []
    for abi, interpreters in sorted(by_abi.items()):
        ordered = sorted(interpreters, key=lambda i: (len(i), i))
        shown = ordered[0] if len(ordered) == 1 else f"{ordered[0]}..{ordered[-1]}"
        parts.append(f"{shown}-abi3 and newer" if abi else shown)
    floors = sorted({t.platform.removesuffix("_x86_64") for t in tags})
    return f"{', '.join(parts)} ({', '.join(floors)})"


# --- Requires-Dist between pinned packages -------------------------------------------------------------


def marker_env(python: str, extra: str = "") -> dict[str, str]:
    """The marker environment of the image: CPython `python` on Linux x86_64 (every name, so nothing is read
    from the interpreter running the judge)."""
    full = f"{python}.0"
    return {"python_version": python, "python_full_version": full, "implementation_version": full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "platform_release": "", "platform_version": "", "extra": extra}


def _parse(line: str) -> Requirement | None:
    try:
        return Requirement(line)
    except InvalidRequirement:
        return None


def _applicable(entry: Entry, name: str, row: dict) -> list[tuple[Requirement, tuple[str, str], str]]:
    """(requirement, the pin it names as (name, version), the extra it comes with or "") for each requirement of
    the release on another pinned package that applies to the entry: unconditional ones, and those of the extras
    the stack uses."""
    pinned = {canonicalize_name(k): (k, v) for k, v in entry.pins.items() if v}
    out = []
    for line in row.get("requires_dist", []):
        req = _parse(line)
        target = canonicalize_name(req.name) if req else None
        if req is None or target not in pinned or target == canonicalize_name(name):
            continue
        if _applies(req.marker, entry.python):
            out.append((req, pinned[target], ""))
            continue
        extra = next((x for x in USED_EXTRAS.get(name, ()) if _applies(req.marker, entry.python, x)), None)
        if extra is not None:
            out.append((req, pinned[target], extra))
    return out


def _applies(marker: Marker | None, python: str, extra: str = "") -> bool:
    if marker is None:
        return True
    try:
        return marker.evaluate(marker_env(python, extra))
    except ValueError:  # UndefinedComparison and friends: pip skips such a requirement too
        return False


def lower_bounds(spec: SpecifierSet) -> SpecifierSet:
    """Only the lower bounds of a specifier set (>=, >, the floor of ~=)."""
    keep = []
    for s in spec:
        if s.operator in (">=", ">"):
            keep.append(str(s))
        elif s.operator == "~=":
            keep.append(str(Specifier(f">={s.version}")))
    return SpecifierSet(",".join(keep))


def _requires_dist(entry: Entry, name: str, version: str, row: dict) -> list[Outcome]:
    out, seen = [], set()
    for req, (target, have), extra in _applicable(entry, name, row):
        spec = lower_bounds(req.specifier) if extra else req.specifier
        if spec.contains(have, prereleases=True) or (target, str(spec)) in seen:
            continue
        seen.add((target, str(spec)))
        if extra:
            why = (f"{name} {version} declares {target}{spec} for its [{extra}] extra, which the training stack "
                   f"uses (Trainer refuses to start below it); the entry pins {target} {have}")
            source = f"{_source(name, version, row)}; {EXTRAS_SOURCE}"
        else:
            why = (f"{name} {version} requires {target}{spec} (Requires-Dist: {req}); the entry pins {target} "
                   f"{have}: the resolver refuses this combination")
            source = _source(name, version, row)
        out.append(Outcome("requires-dist", KIND, name, False, why, source))
    return out
