"""Names that must exist: what each pinned package imports from the other pinned packages, checked against what
those releases have (data/knowledge/api/<package>.json, built from the published files by `refresh-compat --api`).

One outcome per (consumer, provider) pair of the entry's pins. A name the consumer needs at import time that the
provider's release lacks is the `ImportError: cannot import name …` / `AttributeError: module … has no attribute`
a job meets on its first line: the entry is rejected. A name needed only inside a function (the call happens when
that code path runs) rejects too when it lies on the training surface; the reason says which phase. A release
that is not indexed, or a provider module that makes its names at run time, is not judged, and the outcome says so.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from builder.model.matrix import Entry
from builder.model.verdict import Outcome

SHOWN = 3  # missing names quoted per pair; the rest are counted


@lru_cache(maxsize=1)
def index() -> dict[str, dict]:
    """{package: its document}; an empty dict when no index is shipped."""
    folder = resources.files("builder").joinpath("data/knowledge/api")
    out = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name) if folder.is_dir() else []:
        if item.name.endswith(".json"):
            doc = json.loads(item.read_text(encoding="utf-8"))
            doc["_order"] = {v: i for i, v in enumerate(doc["releases"])}
            out[doc["package"]] = doc
    return out


def _never(doc: dict) -> frozenset[str]:
    """Paths that no indexed release of the package has. A shipped consumer release cannot fail on every provider
    release ever made, so such a path is not a version mismatch: the provider makes the name at run time where the
    static reading cannot see it (torch.cuda.FloatTensor comes from torch._C at import), or the consumer's line is
    dead code (peft's `torch.nn.Mmodule`). Either way the index cannot judge it, and says so instead of rejecting."""
    order = list(doc["releases"])
    return frozenset(path for path, status in doc["interest"].items()
                     if status.get("absent") and len(expand(status["absent"], order)) == len(order))


def ranges(members, order: list[str]) -> str:
    """'a..b c' for the releases `members`, as runs of consecutive releases of `order` (sorted)."""
    wanted = set(members)
    runs, start, prev = [], None, None
    for v in order:
        if v in wanted:
            start, prev = start or v, v
        elif start:
            runs.append(start if start == prev else f"{start}..{prev}")
            start = None
    if start:
        runs.append(start if start == prev else f"{start}..{prev}")
    return " ".join(runs)


def expand(text: str, order: list[str]) -> set[str]:
    position = {v: i for i, v in enumerate(order)}
    out: set[str] = set()
    for run in text.split():
        a, _, b = run.partition("..")
        out.update(order[position[a]:position[b or a] + 1])
    return out


def within(version: str, text: str, order: dict[str, int]) -> bool:
    """Is `version` (an indexed release) in the ranges `text`? Positions, not numbers: an unindexed release is not."""
    at = order.get(version)
    if at is None:
        return False
    for run in text.split():
        a, _, b = run.partition("..")
        if order[a] <= at <= order[b or a]:
            return True
    return False


def _file(doc: dict, version: str) -> str:
    rel = doc["releases"][version]
    return f"{rel['file']} sha256:{rel['sha256'][:12]}"


def evaluate(entry: Entry) -> list[Outcome]:
    data = index()
    pins = {name: v for name, v in entry.pins.items() if v}
    out = []
    for consumer, c_version in pins.items():
        doc = data.get(consumer)
        if doc is None:
            continue
        providers = sorted({row["provider"] for row in doc["uses"] if row["provider"] in pins})
        if c_version not in doc["_order"]:
            if providers:
                out.append(Outcome(f"names-{consumer}", "names", consumer, None,
                                   f"{consumer} {c_version} is not in the names index (indexed: {_span(doc)}): what it "
                                   "imports is not judged; run refresh-compat --api", "data/knowledge/api"))
            continue
        for provider in providers:
            out.append(_pair(entry, doc, consumer, c_version, data.get(provider), provider, pins[provider]))
    return out


def _span(doc: dict) -> str:
    order = list(doc["releases"])
    return f"{order[0]}..{order[-1]}" if order else "none"


def _pair(entry: Entry, doc: dict, consumer: str, c_version: str, pdoc: dict | None, provider: str,
          p_version: str) -> Outcome:
    rule = f"names-{consumer}-{provider}"
    if pdoc is None or p_version not in pdoc["_order"]:
        span = _span(pdoc) if pdoc else "none"
        return Outcome(rule, "names", consumer, None, f"{provider} {p_version} is not in the names index (indexed: "
                       f"{span}): what {consumer} {c_version} imports from it is not judged; run refresh-compat --api",
                       "data/knowledge/api")
    needed = [row for row in doc["uses"] if row["provider"] == provider and not _dunder(row["path"])
              and within(c_version, row["releases"], doc["_order"])]
    missing, unjudged, stale = [], [], []
    if pdoc.get("_never") is None:
        pdoc["_never"] = _never(pdoc)
    for row in needed:
        status = pdoc["interest"].get(row["path"])
        if status is None:
            stale.append(row)
        elif row["path"] in pdoc["_never"]:
            unjudged.append(row)
        elif within(p_version, status.get("absent", ""), pdoc["_order"]):
            missing.append((row, status["why"]))
        elif within(p_version, status.get("open", ""), pdoc["_order"]):
            unjudged.append(row)
    evidence = f"{_file(doc, c_version)} -> {_file(pdoc, p_version)} (refresh-compat --api)"
    # At import time a missing name is certain to fail (`from transformers import Trainer` raises). Inside a
    # function it fails only if that code runs, and shipped stacks carry many such lines on paths a CUDA
    # training job never takes (XPU branches, dead code): those are listed, not rejected.
    at_import = [m for m in missing if m[0]["phase"] == "import"]
    in_calls = [m for m in missing if m[0]["phase"] != "import"]
    if at_import:
        shown = "; ".join(_say(row, why) for row, why in sorted(at_import, key=lambda m: m[0]["path"])[:SHOWN])
        more = f" (+{len(at_import) - SHOWN} more)" if len(at_import) > SHOWN else ""
        return Outcome(rule, "names", consumer, False,
                       f"{consumer} {c_version} imports names {provider} {p_version} lacks: {shown}{more}; "
                       f"choose {provider}/{consumer} releases that agree", evidence)
    note = ""
    if in_calls:
        shown = "; ".join(_say(row, why) for row, why in sorted(in_calls, key=lambda m: m[0]["path"])[:SHOWN])
        note = f"; inside functions only, not judged: {shown}" + (
            f" (+{len(in_calls) - SHOWN} more)" if len(in_calls) > SHOWN else "")
    note += (f"; {len(unjudged)} not judged (in modules that make names at run time, or in no indexed release "
             f"of {provider})") if unjudged else ""
    note += f"; {len(stale)} not yet checked against {provider} (run refresh-compat --api)" if stale else ""
    return Outcome(rule, "names", consumer, True,
                   f"the {len(needed) - len(in_calls)} names {consumer} {c_version} uses from {provider} exist in "
                   f"{p_version}{note}", evidence)


def _dunder(path: str) -> bool:
    """module.__dict__, __file__, __version__…: what every module or class has, whatever its source binds."""
    return any(p.startswith("__") and p.endswith("__") for p in path.split(".")[1:])


def _say(row: dict, why: str) -> str:
    error = "ImportError at import" if row["phase"] == "import" else "fails when called"
    return f"{row['in']} uses {row['path']} ({why}: {error})"

