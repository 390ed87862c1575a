"""PyPI's own signals per release of each stack package, as data (issue #45): yanked (and why), Requires-Python,
the Requires-Dist lines that name another stack package, the wheel tags for Linux x86_64/aarch64 and pure Python,
whether an sdist exists, and which file the core metadata was read from (its sha256).

Read from PyPI's project JSON (`pypi.project`; per-version JSON URLs are not served by every mirror) and each
final release's core metadata: its PEP 658 `.metadata` file where the index serves one, else read from the file
itself (fetched sha256-checked and cached): the smallest wheel's `*.dist-info/METADATA`, or for an sdist-only release
(DeepSpeed, flash-attn) the sdist's PKG-INFO with `*.egg-info/requires.txt` where PKG-INFO lists no Requires-Dist.
A release whose chosen file is the one the committed data already read (same sha256) reuses that row's metadata,
so a refresh downloads only new releases. builder/model/signals.py judges the data; this module only derives it.
"""

from __future__ import annotations

import email.parser
import json
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder import fsutil, log
from builder.boundary import pypi
from builder.derive import api_index
from builder.errors import UserError
from builder.model.matrix import PACKAGES
from builder.model.signals import DATA, load, normalise_platform

GENERATED_BY = "python -m builder refresh-compat --signals (builder/derive/pypi_signals.py)"
# The oldest release worth judging per package: older than anything a supported stack pins (torch 2.0 is the
# oldest minor in compat.yaml; the others are the releases of that time).
# The oldest release read per package: the same floors as the names index (data/knowledge/surface.yaml `since`).
FLOORS = {name: row["since"] for name, row in api_index.surface().items()}
STACK = frozenset(canonicalize_name(p) for p in (*PACKAGES, "python"))
# Linux platforms the images run on; musllinux is left out: every base is a glibc distribution.
ARCHES = ("_x86_64", "_aarch64")
WORKERS = 8
# CPython and pure-Python wheels: the images run the base's CPython, never PyPy.
INTERPRETERS = ("cp", "py")


def folder() -> Path:
    return Path(str(resources.files("builder").joinpath(DATA)))


def final_releases(releases: dict, floor: str) -> list[str]:
    """The project's final releases (no pre/dev) from `floor` on that have files, oldest first."""
    found = []
    for raw, files in releases.items():
        try:
            version = Version(raw)
        except InvalidVersion:
            continue
        if files and not version.is_prerelease and not version.is_devrelease and version >= Version(floor):
            found.append(raw)
    return sorted(found, key=Version)


def wheel_tags(files: list[dict]) -> list[str]:
    """Distinct tags of the release's CPython wheels for Linux x86_64/aarch64 and of its pure-Python wheels, with
    PEP 600 platform names."""
    tags = set()
    for f in files:
        try:
            _, _, _, parsed = parse_wheel_filename(f["filename"])
        except (InvalidWheelFilename, InvalidVersion):
            continue  # not a wheel, or a name pip would reject too
        for t in parsed:
            platform = normalise_platform(t.platform)
            linux = platform.startswith(("manylinux_", "linux")) and platform.endswith(ARCHES)
            if t.interpreter.startswith(INTERPRETERS) and (platform == "any" or linux):
                tags.add(f"{t.interpreter}-{t.abi}-{platform}")
    return sorted(tags)


def yank(files: list[dict]) -> tuple[bool, str | None]:
    """PyPI yanks a whole release (PEP 592 marks each of its files): yanked when every file is."""
    yanked = bool(files) and all(f.get("yanked") for f in files)
    reasons = [f.get("yanked_reason") for f in files if f.get("yanked_reason")]
    return yanked, (reasons[0] if yanked and reasons else None)


def metadata_file(files: list[dict]) -> dict | None:
    """The file whose core metadata stands for the release: the smallest wheel (torch's Linux wheels are ~800 MB,
    its macOS one ~60 MB; Requires-Python and the stack's Requires-Dist do not differ by platform), else the
    smallest sdist."""
    def size(f: dict) -> tuple:
        return f.get("size") or 0, f["filename"]

    wheels = [f for f in files if f["filename"].endswith(".whl")]
    sdists = [f for f in files if f.get("packagetype") == "sdist" or f["filename"].endswith((".tar.gz", ".zip"))]
    return min(wheels, key=size) if wheels else min(sdists, key=size) if sdists else None


def parse_core_metadata(text: str) -> tuple[str | None, list[str]]:
    """(Requires-Python, every Requires-Dist line) of a METADATA / PKG-INFO text."""
    msg = email.parser.HeaderParser().parsestr(text)
    python = msg.get("Requires-Python")
    return (python.strip() if python else None), [" ".join(r.split()) for r in msg.get_all("Requires-Dist") or []]


def requires_txt(text: str) -> list[str]:
    """setuptools' egg-info/requires.txt as Requires-Dist lines (`[extra:marker]` sections become markers)."""
    out, extra, marker = [], "", ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            extra, _, marker = line[1:-1].partition(":")
            continue
        req, _, own = line.partition(";")
        conditions = [f"({m.strip()})" for m in (own, marker) if m.strip()]
        if extra:
            conditions.append(f'extra == "{extra.strip()}"')
        out.append(req.strip() + (f"; {' and '.join(conditions)}" if conditions else ""))
    return out


def _read_wheel(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not names:
            raise ValueError(f"{path.name}: no *.dist-info/METADATA")
        return z.read(names[0]).decode("utf-8", "replace")


def _read_sdist(path: Path) -> tuple[str, str | None]:
    """(PKG-INFO, egg-info/requires.txt or None) of an sdist; members are read, never extracted."""
    def shortest(names: list[str], suffix: str) -> str | None:
        hits = sorted((n for n in names if n.endswith(suffix)), key=lambda n: (n.count("/"), n))
        return hits[0] if hits else None

    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            info, req = shortest(names, "/PKG-INFO"), shortest(names, ".egg-info/requires.txt")
            if info is None:
                raise ValueError(f"{path.name}: no PKG-INFO")
            return z.read(info).decode("utf-8", "replace"), (z.read(req).decode("utf-8", "replace") if req else None)
    with tarfile.open(path, "r:*") as t:
        names = [m.name for m in t.getmembers() if m.isfile()]
        info, req = shortest(names, "/PKG-INFO"), shortest(names, ".egg-info/requires.txt")
        if info is None:
            raise ValueError(f"{path.name}: no PKG-INFO")
        return _member(t, info), (_member(t, req) if req else None)


def _member(archive: tarfile.TarFile, name: str) -> str:
    return archive.extractfile(name).read().decode("utf-8", "replace")


def core_metadata(name: str, file: dict) -> tuple[str | None, list[str], str]:
    """(Requires-Python, Requires-Dist lines, which part was read) of one release file."""
    if file["filename"].endswith(".whl"):
        try:
            text = pypi.wheel_metadata(name, file)  # PEP 658: no download where the index serves it
        except OSError:  # web.Failed: this index serves none for the file
            text = _read_wheel(pypi.fetch_file(name, file))
        python, dist = parse_core_metadata(text)
        return python, dist, "METADATA"
    info, req = _read_sdist(pypi.fetch_file(name, file))
    python, dist = parse_core_metadata(info)
    if dist or req is None:
        return python, dist, "PKG-INFO"
    return python, requires_txt(req), "PKG-INFO+requires.txt"


def stack_requirements(lines: list[str]) -> list[str]:
    """The Requires-Dist lines that name a package of the stack, marker text kept, in the metadata's order."""
    out = []
    for line in lines:
        try:
            name = Requirement(line).name
        except InvalidRequirement:
            continue  # pip cannot read it either; nothing to judge
        if canonicalize_name(name) in STACK:
            out.append(line)
    return out


def derive_release(name: str, files: list[dict], previous: dict | None = None) -> tuple[dict, bool]:
    """(the release's row, whether its metadata was reused from `previous`)."""
    yanked, reason = yank(files)
    row = {"yanked": yanked, "yanked_reason": reason, "wheel_tags": wheel_tags(files),
           "sdist": any(f.get("packagetype") == "sdist" for f in files)}
    chosen = metadata_file(files)
    declared = next((f["requires_python"] for f in files if f.get("requires_python")), None)
    if chosen is None:
        return {**row, "requires_python": declared, "requires_dist": [], "metadata": None}, False
    sha = chosen["digests"]["sha256"]
    old = (previous or {}).get("metadata") or {}
    if old.get("sha256") == sha:
        return {**row, "requires_python": previous["requires_python"], "requires_dist": previous["requires_dist"],
                "metadata": old}, True
    try:
        python, dist, part = core_metadata(name, chosen)
    except (ValueError, zipfile.BadZipFile, tarfile.TarError) as exc:
        log.info(f"note: {name}: {chosen['filename']}: core metadata not readable ({exc})")
        return {**row, "requires_python": declared, "requires_dist": [],
                "metadata": {"file": chosen["filename"], "sha256": sha, "part": None}}, False
    return {**row, "requires_python": python or declared, "requires_dist": stack_requirements(dist),
            "metadata": {"file": chosen["filename"], "sha256": sha, "part": part}}, False


def package(name: str, previous: dict | None = None) -> tuple[dict, int]:
    """(the package's document, how many releases reused the previous document's metadata)."""
    project = pypi.project(name)
    floor = FLOORS[name]
    old = (previous or {}).get("releases", {})
    raws = final_releases(project.get("releases", {}), floor)
    # Each release is a request or two (a PEP 658 try, a download): a few at a time keep a refresh to minutes.
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        rows = pool.map(lambda raw: derive_release(name, project["releases"][raw], old.get(str(Version(raw)))), raws)
        releases = {str(Version(raw)): row for raw, row in zip(raws, rows)}
    reused = sum(again for _, again in releases.values())
    releases = {key: row for key, (row, _) in releases.items()}
    doc = {"generated_by": GENERATED_BY, "package": name, "project": f"https://pypi.org/pypi/{name}/json",
           "floor": f">={floor}", "releases": releases}
    return doc, reused


def refresh(names=None, reuse: bool = True) -> dict[str, dict]:
    """{package: its signals document} for `names` (default: every package of the stack). reuse: keep the committed
    metadata of a release whose file did not change (False reads every release's metadata again)."""
    unknown = sorted(set(names or ()) - set(FLOORS))
    if unknown:
        raise UserError(f"no PyPI signals for {', '.join(unknown)}", f"name packages of the stack: {', '.join(FLOORS)}")
    out = {}
    for name in names or FLOORS:
        with log.step(f"PyPI signals of {name}") as note:
            out[name], reused = package(name, load(name) if reuse else None)
            rows = out[name]["releases"]
            yanked = sum(r["yanked"] for r in rows.values())
            note["result"] = f"{len(rows)} releases ({yanked} yanked), metadata of {len(rows) - reused} read"
    return out


def render(doc: dict) -> str:
    """The file's text: sorted keys and one value per line, so a refresh's diff shows exactly what changed."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def stale(docs: dict[str, dict], where: Path | None = None) -> list[str]:
    """The packages whose file under `where` (default builder/data/knowledge/pypi) differs from its document."""
    where = where or folder()
    return [name for name, doc in docs.items() if not (where / f"{name}.json").is_file()
            or (where / f"{name}.json").read_text(encoding="utf-8") != render(doc)]


def write(docs: dict[str, dict], where: Path | None = None) -> list[str]:
    """Write each changed document to `<where>/<name>.json`; the names written."""
    where = where or folder()
    changed = stale(docs, where)
    for name in changed:
        fsutil.write_atomic(where / f"{name}.json", render(docs[name]))
    if changed:
        load.cache_clear()
    return changed
