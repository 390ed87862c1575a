"""`compat TAG`: every rule checked for an entry, its outcome and evidence, and the facts derived from them."""

from __future__ import annotations

import re

from builder import log
from builder.model import compat
from builder.model.matrix import Entry

_MARK = {True: "pass", False: "FAIL", None: "n/a"}


def _base_cuda(entry: Entry) -> str | None:
    m = re.match(compat.rules()["base_cuda"]["pattern"], entry.base_name)
    return m.group("cuda") if m else None


def report(entry: Entry, recipe: bool = True) -> str:
    outcomes = compat.evaluate(entry, recipe)
    # Version constraints that do not apply to these pins are listed by id only, to keep the table readable.
    idle = [o for o in outcomes if o.ok is None and o.kind in ("requires", "forbids")]
    rows = [[o.rule, o.kind, "warn" if o.warn else _MARK[o.ok], o.reason, o.source or "—"] for o in outcomes
            if o not in idle]
    failed = [o for o in outcomes if o.ok is False and o.rule not in compat.RECIPE_RULES]
    limits = [o for o in outcomes if o.ok is False and o.rule in compat.RECIPE_RULES]
    head = f"{entry.tag}: torch {entry.torch} (CUDA {entry.cuda} build), Python {entry.python}, base {entry.base_name}"
    lines = [head, log.table(("rule", "kind", "result", "why", "evidence"), rows)]
    if idle:
        lines.append("not applicable to these pins: " + "; ".join(f"{o.rule} ({o.reason})" for o in idle))
    lines += ["", "derived by the recipe (not asked of the entry):",
              log.table(("what", "value", "why", "evidence"), [list(d) for d in compat.derivations(entry)])]
    if limits:
        lines.append(f"the recipe cannot build it here (build stops with exit 3, validate accepts it): "
                     f"{', '.join(o.rule for o in limits)}")
    if failed:
        lines.append(f"{len(failed)} compatibility rule(s) broken: {', '.join(o.rule for o in failed)}")
        return "\n".join(lines)
    facts = compat.derive(entry)
    base_cuda = _base_cuda(entry)
    lines += [
        f"flash-attn wheel: {facts['flash_attn_wheel'] or 'not installed'}",
        f"min driver: {facts['min_driver']} (CUDA {entry.cuda} minor-version compatibility); "
        f"full features from {facts['toolkit_driver']}",
        f"C++ ABI of torch's wheels: {'C++11' if facts['cxx11abi'] else 'pre-C++11'}; cuDNN {facts['cudnn_major']}",
    ]
    if base_cuda and base_cuda != entry.cuda:
        lines.append(f"base declares CUDA {base_cuda}: the NVIDIA container runtime requires a driver for CUDA "
                     f"{base_cuda} (NVIDIA_REQUIRE_CUDA) even though torch only needs {entry.cuda}")
    if entry.pins.get("flash-attn"):
        lines.append(f"flash-attn kernels need compute capability >= {compat.rules()['flash_attn']['min_capability']}")
    return "\n".join(lines)
