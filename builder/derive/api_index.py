"""The names index (data/knowledge/api/<package>.json): for every indexed release of every package of the stack,
which names it imports from the others (`uses`) and, for every name some indexed release imports from it, the
releases that lack it (`interest`). Built by `refresh-compat --api` from the published files alone; each release
is read from its smallest file on PyPI (a 60 MB macOS wheel of torch carries the same Python files as the 900 MB
Linux one; DeepSpeed ships only sdists), sha256-checked, and named with its hash in the data.

Releases are written as ranges over the package's indexed releases ("0.20.0..0.27.2 0.28.1"): a release that is
not indexed is never inside a range, whatever its number, so the judge says "not indexed" instead of guessing.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from builder import fsutil
from builder.derive import api
from builder.model.names import expand, ranges

FORMAT = 1
GENERATED_BY = "python -m builder refresh-compat --api (builder/derive/api_index.py)"


def surface() -> dict:
    text = resources.files("builder").joinpath("data/knowledge/surface.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)["packages"]


def data_dir() -> Path:
    return Path(str(resources.files("builder").joinpath("data/knowledge/api")))


def sort_versions(versions: Iterable[str]) -> list[str]:
    return sorted(versions, key=Version)


# --- the in-memory index ---------------------------------------------------------------------------------


@dataclass
class Index:
    """Expanded form: per package, its releases (with the file read), its uses per release, and per provider path
    the status in each provider release (None = present, 'open: …' = cannot be judged, else why it is absent)."""

    releases: dict[str, dict[str, dict]] = field(default_factory=lambda: defaultdict(dict))
    uses: dict[str, dict[str, set[tuple]]] = field(default_factory=lambda: defaultdict(dict))
    status: dict[str, dict[str, dict[str, str | None]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict)))
    # Modules of a provider (among the prefixes of paths consumers use) that exist in at least one indexed release.
    modules: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def interest(self, provider: str) -> set[str]:
        return {u[1] for per in self.uses.values() for found in per.values() for u in found if u[0] == provider}

    # files ----------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder: Path | None = None) -> Index:
        idx = cls()
        for path in sorted((folder or data_dir()).glob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            name = doc["package"]
            order = sort_versions(doc["releases"])
            idx.releases[name] = dict(doc["releases"])
            idx.modules[name] = set(doc.get("modules", ()))
            per: dict[str, set[tuple]] = defaultdict(set)
            for row in doc["uses"]:
                for v in expand(row["releases"], order):
                    per[v].add((row["provider"], row["path"], row["in"], row["phase"]))
            idx.uses[name] = dict(per)
            for v in order:
                idx.uses[name].setdefault(v, set())
            for path_, row in doc["interest"].items():
                absent = expand(row.get("absent", ""), order)
                opened = expand(row.get("open", ""), order)
                for v in order:
                    idx.status[name][path_][v] = (row["why"] if v in absent else
                                                  f"open: {row.get('why_open', '')}" if v in opened else None)
        return idx

    def documents(self) -> dict[str, dict]:
        out = {}
        pkgs = surface()
        for name, rels in sorted(self.releases.items()):
            order = sort_versions(rels)
            grouped: dict[tuple, set[str]] = defaultdict(set)
            for v, found in self.uses.get(name, {}).items():
                for u in found:
                    grouped[u].add(v)
            uses = [{"provider": p, "path": path, "in": where, "phase": phase, "releases": ranges(vs, order)}
                    for (p, path, where, phase), vs in sorted(grouped.items())]
            interest = {}
            for path in sorted(self.interest(name)):
                st = self.status[name].get(path, {})
                absent = {v for v in order if st.get(v) and not st[v].startswith("open:")}
                opened = {v for v in order if st.get(v, "") and st[v].startswith("open:")}
                row: dict = {}
                if absent:
                    row["absent"] = ranges(absent, order)
                    row["why"] = st[max(absent, key=Version)]
                if opened:
                    row["open"] = ranges(opened, order)
                    row["why_open"] = st[max(opened, key=Version)][len("open: "):]
                interest[path] = row
            out[name] = {"format": FORMAT, "package": name, "import": pkgs[name]["import"],
                         "generated_by": GENERATED_BY,
                         "releases": {v: rels[v] for v in order}, "modules": sorted(self.modules.get(name, ())),
                         "uses": uses, "interest": interest}
        return out

    def texts(self) -> dict[str, str]:
        """{file name under data/knowledge/api: its text}: what `refresh-compat --api --write` writes."""
        return {f"{name}.json": json.dumps(doc, indent=1) + "\n" for name, doc in self.documents().items()}

    def write(self, folder: Path | None = None) -> list[Path]:
        folder = folder or data_dir()
        written = []
        for name, text in self.texts().items():
            path = folder / name
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                fsutil.write_atomic(path, text)
                written.append(path)
        return written


# --- building it from the published files ----------------------------------------------------------------


def release_files(project: dict, since: str) -> dict[str, dict]:
    """{version: the smallest file to read} for the final releases since `since` that have files."""
    out = {}
    for raw, files in project.get("releases", {}).items():
        try:
            v = Version(raw)
        except InvalidVersion:
            continue
        if v.is_prerelease or v.is_devrelease or v < Version(since) or str(v) != raw:
            continue
        usable = [f for f in files if f.get("digests", {}).get("sha256") and (
            f["filename"].endswith(".whl") or f["filename"].endswith((".tar.gz", ".zip")))]
        wheels = [f for f in usable if f["filename"].endswith(".whl")]
        pool = wheels or [f for f in usable if f["filename"].endswith(".tar.gz")]
        if pool:
            out[raw] = min(pool, key=lambda f: (f.get("size") or 0, f["filename"]))
    return out


def refresh(index: Index, fetch: Callable[[str, dict], Path], projects: Callable[[str], dict],
            only: dict[str, list[str]] | None = None, progress: Callable[[str], None] = lambda _: None) -> Index:
    """Read the releases (`only`: {package: [versions]}, default every release since the package's floor), then
    check every provider path some consumer uses against the provider releases that need it: the new releases
    against all paths, and all releases against the paths that are new."""
    pkgs = surface()
    stack = {p["import"]: name for name, p in pkgs.items()}
    wanted: dict[str, dict[str, dict]] = {}
    for name, p in pkgs.items():
        if only is not None and name not in only:
            continue
        files = release_files(projects(name), p["since"])
        chosen = {v: f for v, f in files.items() if only is None or v in only[name]}
        missing = set(only[name]) - set(chosen) if only is not None else set()
        if missing:
            raise ValueError(f"{name}: no such final release on the index: {', '.join(sorted(missing))}")
        wanted[name] = chosen
    before = {prov: index.interest(prov) for prov in pkgs}
    opened: dict[tuple[str, str, str], str] = {}
    for name, chosen in wanted.items():
        p = pkgs[name]
        for v, f in sorted(chosen.items(), key=lambda kv: Version(kv[0])):
            start = time.monotonic()
            path = fetch(name, f)
            index.releases[name][v] = {"file": f["filename"], "sha256": f["digests"]["sha256"]}
            pkg = api.Package.read(path, [p["import"]])
            found = api.uses(pkg, p["import"], p["surface"], stack) if p["surface"] else []
            index.uses[name][v] = {(stack[u.path.split(".")[0]], u.path, u.module, u.phase) for u in found}
            progress(f"{name} {v}: {f['filename']} (sha256 {f['digests']['sha256'][:12]}): {len(found)} uses "
                     f"({time.monotonic() - start:.1f} s)")
    for prov, p in pkgs.items():
        interest = index.interest(prov)
        grown = interest - before.get(prov, set())
        new_releases = set(wanted.get(prov, {}))
        todo = {v: (interest if v in new_releases else grown) for v in index.releases.get(prov, {})}
        todo = {v: paths for v, paths in todo.items() if paths}
        if not todo:
            continue
        files = release_files(projects(prov), p["since"]) if set(todo) - new_releases else wanted[prov]
        for v, paths in sorted(todo.items(), key=lambda kv: Version(kv[0])):
            path = fetch(prov, files[v]) if v in files else None
            if path is None:
                continue
            pkg = api.Package.read(path, [p["import"]])
            cache: dict = {}
            for dotted in paths:
                status = api.resolve(pkg, dotted, cache)
                parts = dotted.split(".")
                prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                index.modules[prov].update(m for m in prefixes if m in pkg.files)
                if status and status.startswith("open:"):
                    opened[(prov, dotted, v)] = next(m for m in prefixes if m not in pkg.files)
                index.status[prov][dotted][v] = status
            progress(f"{prov} {v}: {len(paths)} names checked")
    # A parent that makes names at run time (torch's __init__ writes globals() from its C extension) still does not
    # make a name that is a *module* of the package in other releases: torch.compiler is a package from 2.1, so a
    # release without the package has no torch.compiler, whatever torch.__getattr__ does.
    for (prov, dotted, v), missing in opened.items():
        if missing in index.modules[prov]:
            index.status[prov][dotted][v] = f"no module {missing} (a module in other releases of {prov})"
    return index
