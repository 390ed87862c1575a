"""What changed between two images: packages upgraded, downgraded, added, removed (Python and OS) and the
size of each top-level directory. `--fail-on downgrade,removed` lets a release refuse silent removals.

Both sides are manifests (builder/boundary/imagesave.py), so nothing runs inside the images.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder import log
from builder.boundary import imagesave
from builder.errors import UserError
from builder.flags import arg
from builder.model import budget, paths, reference

KINDS = ("upgraded", "downgraded", "added", "removed")
_FAIL_WORDS = {"upgrade": "upgraded", "downgrade": "downgraded", "add": "added", "remove": "removed"}


@dataclass(frozen=True)
class Options:
    a: str = arg(metavar="A", help="the old image: a matrix tag (→ <image>:<tag>) or an image reference")
    b: str = arg(metavar="B", help="the new image")
    fail_on: str = arg("--fail-on", default="", metavar="KINDS",
                       help="comma list of upgrade,downgrade,add,remove: exit 1 when such a package change exists")


# --- version ordering ----------------------------------------------------------------------------------


def _order(c: str) -> int:
    # dpkg's lexical order: `~` sorts before everything (even the end), letters before other characters.
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or a revision (lib/dpkg/version.c)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        ni = i
        while ni < len(a) and a[ni].isdigit():
            ni += 1
        nj = j
        while nj < len(b) and b[nj].isdigit():
            nj += 1
        da, db = int(a[i:ni] or 0), int(b[j:nj] or 0)
        if da != db:
            return -1 if da < db else 1
        i, j = ni, nj
    return 0


def _split_deb(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.partition(":") if ":" in v else ("0", "", v)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0), upstream, revision


def compare_deb(a: str, b: str) -> int:
    """<0, 0, >0 as Debian orders versions a and b (what `dpkg --compare-versions` decides)."""
    ea, ua, ra = _split_deb(a)
    eb, ub, rb = _split_deb(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def compare_python(a: str, b: str) -> int:
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        va, vb = a, b  # not PEP 440: plain string order is the best available
    return (va > vb) - (va < vb)


# --- comparing manifests -------------------------------------------------------------------------------


def _python_index(m: dict) -> dict[tuple[str, str], str]:
    # Keyed by name and site directory, with the Python minor version folded, so moving from 3.11 to 3.12
    # reads as an upgrade rather than a removal plus an addition.
    out = {}
    for p in m["python_packages"]:
        where = re.sub(r"python3\.\d+", "python3.X", p["path"].rsplit("/", 1)[0])
        out[(str(canonicalize_name(p["name"])), "/" + where)] = p["version"] or ""
    return out


def _os_index(m: dict) -> dict[tuple[str, str], str]:
    return {(p["name"] + (f":{p['architecture']}" if p.get("architecture") not in (None, "all", "amd64") else ""),
             "dpkg"): p["version"] or "" for p in m["os_packages"]}


def package_changes(a: dict, b: dict) -> list[dict]:
    changes = []
    for kind, index, cmp in (("python", _python_index, compare_python), ("os", _os_index, compare_deb)):
        ia, ib = index(a), index(b)
        for key in sorted(set(ia) | set(ib)):
            va, vb = ia.get(key), ib.get(key)
            if va == vb:
                continue
            if va is None:
                change = "added"
            elif vb is None:
                change = "removed"
            else:
                order = cmp(va, vb)
                if order == 0:
                    continue  # equal by the ordering (e.g. 1.0 and 1.0.0)
                change = "upgraded" if order < 0 else "downgraded"
            changes.append({"kind": kind, "name": key[0], "where": key[1], "a": va, "b": vb, "change": change})
    return changes


def sizes(m: dict) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for path, entry in m["files"].items():
        if entry["type"] == "file":
            out["/" + path.split("/", 1)[0]] += entry.get("size", 0)
    return dict(out)


def size_changes(a: dict, b: dict) -> list[dict]:
    sa, sb = sizes(a), sizes(b)
    return [{"dir": d, "a": sa.get(d, 0), "b": sb.get(d, 0), "delta": sb.get(d, 0) - sa.get(d, 0)}
            for d in sorted(set(sa) | set(sb))]


def diff(a: dict, b: dict) -> dict:
    changes = package_changes(a, b)
    return {"packages": changes, "counts": {k: sum(c["change"] == k for c in changes) for k in KINDS},
            "sizes": size_changes(a, b)}


def grown(result: dict, top: int = 8) -> list[str]:
    """What made an image larger, from diff(): packages added or upgraded, then directories that grew (largest
    first), one short phrase each."""
    changed = [f"{c['kind']} {c['name']} {c['a'] + ' → ' if c['a'] else ''}{c['b']} ({c['change']})"
               for c in result["packages"] if c["change"] in ("added", "upgraded")]
    dirs = [f"{s['dir']} {_mb(s['delta'])}" for s in sorted(result["sizes"], key=lambda s: -s["delta"])
            if s["delta"] > 0][:top]
    more = [f"and {len(changed) - top} more packages"] if len(changed) > top else []
    return changed[:top] + more + dirs


def over_budget(entry, image, baselines: list[dict | None]) -> str | None:
    """Why the freshly built `image` (docker SDK Image) breaks its entry's size budget (model/budget.py), naming
    what grew since the first of `baselines` (the last publish, then build, report) whose image is still here;
    None when it is within budget or has none."""
    published = next((b for b in baselines if b and b.get("step") == "publish"), None)
    limit = budget.limit(entry.size_budget, f"{entry.source}:{entry.line('size_budget')} size_budget", published)
    size = image.attrs.get("Size") or 0
    if limit is None or size <= limit[0]:
        return None
    earlier = next((b["image_id"] for b in baselines if b and b.get("image_id") not in (None, image.id)
                    and imagesave.image_id(b["image_id"])), None)
    changes = grown(diff(imagesave.manifest(earlier), imagesave.manifest(image.id))) if earlier else None
    return budget.message(size, limit, changes, earlier)


# --- CLI -----------------------------------------------------------------------------------------------


def resolve(name: str, m) -> str:
    """A matrix tag names its local image; anything else is an image reference."""
    entry = next((e for e in m.entries if e.tag == name), None) if m is not None else None
    return paths.image_ref(entry) if entry else name


def parse_fail_on(text: str) -> set[str]:
    out = set()
    for word in filter(None, (w.strip() for w in text.split(","))):
        kind = _FAIL_WORDS.get(word) or (word if word in KINDS else None)
        if kind is None:
            raise UserError(f"--fail-on: unknown kind '{word}'", "use upgrade, downgrade, add, remove")
        out.add(kind)
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:+.1f} MB" if n else "0"


def main(options: Options, m) -> int:
    fail_on = parse_fail_on(options.fail_on)
    refs = [resolve(options.a, m), resolve(options.b, m)]
    for ref in refs:  # both names checked before the engine is asked about either
        if not imagesave.is_archive(ref):
            reference.check_image_name(ref)
    manifests = []
    for ref in refs:
        with log.step(f"manifest {ref}") as note:
            manifests.append(imagesave.manifest(ref))
            note["result"] = f"{manifests[-1]['totals']['files']} files in {manifests[-1]['stats']['seconds']}s"
    result = diff(*manifests)
    rows = [[c["change"], c["kind"], c["name"], c["where"], c["a"] or "—", c["b"] or "—"] for c in result["packages"]]
    log.out(f"Packages: {refs[0]} → {refs[1]}")
    log.out(log.table(("change", "kind", "package", "where", "A", "B"), rows) if rows else "(no package changes)")
    log.out()
    log.out(log.table(("directory", "A", "B", "change"),
                    [[s["dir"], f"{s['a'] / 1e6:.1f} MB", f"{s['b'] / 1e6:.1f} MB", _mb(s["delta"])]
                     for s in result["sizes"] if s["a"] or s["b"]]))
    counts = result["counts"]
    log.info(", ".join(f"{counts[k]} {k}" for k in KINDS))
    hit = [k for k in sorted(fail_on) if counts[k]]
    if hit:
        log.info(f"error: --fail-on: {', '.join(f'{counts[k]} {k}' for k in hit)}")
        return 1
    return 0
