"""The matrix entry a maintainer would add for new upstream releases, derived and written into matrix.yaml's text.

Pure (no network, no files): `builder.steps.propose` reads PyPI's project JSON and hands it here, so the
derivation is unit-tested on fixtures of PyPI's shapes.

The proposal follows the newest `ci: true` entry (the *template*: its base, Python, runner and base-bound lock
exceptions), with torch's newest final release on PyPI, the CUDA line that release's metadata names (the build
PyPI serves), the newest final release of every stack package the template pins, flash-attn only where
compat.yaml lists a prebuilt wheel for it, and `ci: false`. Its tag is the template's with the CUDA and torch
part replaced (cu130-torch2.13-bookworm -> cu132-torch2.15-bookworm).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import yaml
from packaging.version import Version

from builder.model import compat, knowledge
from builder.model.matrix import REQUIRED_PACKAGES, Entry, Matrix

STACK = tuple(p for p in REQUIRED_PACKAGES if p != "torch")  # what the newest releases are read for
TAG_HEAD = re.compile(r"cu\d+-torch\d+\.\d+")  # the project's tag scheme: cu<CUDA>-torch<minor>[-<base>]
# Lock exceptions that belong to the base (copied from the template); a flash-attn.lock exception is per wheel.
BASE_EXCEPTIONS = ("apt.lock",)


class NotProposable(ValueError):
    """PyPI's data does not say enough to derive an entry (no final release, no CUDA build named)."""


@dataclass(frozen=True)
class Proposal:
    entry: Entry  # the derived entry (the step judges the text below as matrix.load reads it)
    fields: dict  # matrix.yaml field -> value, in the file's order

    @property
    def tag(self) -> str:
        return self.entry.tag

    def text(self, note: list[str]) -> str:
        """The entry as matrix.yaml writes one, below its comment lines: two-space list indent, versions and
        references bare, short versions quoted."""
        lines = [f"  # {line}" for line in note] + [f"  - tag: {self.fields['tag']}"]
        for key, value in self.fields.items():
            if key == "tag":
                continue
            if isinstance(value, dict):
                lines.append(f"    {key}:")
                lines += [f"      {k}: {_scalar(v)}" for k, v in value.items()]
            else:
                lines.append(f"    {key}: {_scalar(value)}")
        return "\n".join(lines) + "\n"


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    text = str(value)
    # Bare where YAML reads the text back as the same string (2.15.0); quoted where it would not ("3.11", "13.2").
    plain = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*", text) and yaml.safe_load(text) == text
    return text if plain else json.dumps(text)


# --- what PyPI says ---------------------------------------------------------------------------------------


def newest(releases: dict) -> str | None:
    """The newest final release that has a file not yanked (pre-releases, dev releases skipped)."""
    per_minor = knowledge.latest_per_minor(releases, since="0")
    return max(per_minor.values(), key=Version) if per_minor else None


def torch_release(project: dict, metadata: str | None = None) -> dict:
    """Facts of torch's newest final release: release, python, cxx11abi, pypi_cuda, cudnn (where known).

    `metadata`: the release's core metadata (PEP 658) when it could be fetched. Without it, the project JSON's
    `info.requires_dist` is the same metadata, but only of the release `info` describes (the newest)."""
    releases = project.get("releases") or {}
    version = newest(releases)
    if version is None:
        raise NotProposable("PyPI lists no final torch release with files")
    info = project.get("info") or {}
    if metadata is None and info.get("version") == version:
        metadata = "\n".join(f"Requires-Dist: {line}" for line in info.get("requires_dist") or [])
    return knowledge.torch_facts(version, releases[version], metadata)


# --- the entry --------------------------------------------------------------------------------------------


def template(m: Matrix) -> Entry:
    """The newest CI entry (highest torch; the first in the file on a tie): what a proposal is shaped like."""
    built = [e for e in m.entries if e.ci]
    if not built:
        raise ValueError(f"{m.path}: no entry has `ci: true`, so there is no CI entry to shape a proposal on")
    return max(built, key=lambda e: Version(e.torch))


def tag_for(template_tag: str, cuda: str, torch: str) -> str:
    head = f"cu{cuda.replace('.', '')}-torch{knowledge.minor_of(torch)}"
    m = TAG_HEAD.match(template_tag)
    return head + (template_tag[m.end():] if m else "")


def flash_attn_for(entry: Entry) -> str | None:
    """The newest flash-attn release whose prebuilt wheel compat.yaml lists for the entry (torch minor, CUDA
    major, Python, C++ ABI): judged by the same rules `validate` applies. None where no release has one."""
    releases = compat.rules()["flash_attn"]["releases"]
    for version in sorted(releases, key=Version, reverse=True):
        candidate = replace(entry, pins={**entry.pins, "flash-attn": version})
        outcomes = [o for o in compat.evaluate(candidate, recipe=False) if o.rule.startswith("flash-attn")]
        if outcomes and all(o.ok is not False for o in outcomes):
            return version
    return None


def derive(base: Entry, torch: dict, stack: dict[str, str]) -> Proposal:
    """The entry for torch's newest release and the newest stack, shaped like `base` (the template)."""
    cuda = torch.get("pypi_cuda")
    if cuda is None:
        raise NotProposable(f"PyPI's metadata of torch {torch['release']} names no CUDA build (no cuda-toolkit or "
                            "nvidia-cuda-runtime requirement), so the entry's CUDA line cannot be derived")
    pins = {"torch": torch["release"], **{p: stack[p] for p in STACK if base.pins.get(p)}, "flash-attn": None}
    entry = replace(base, tag=tag_for(base.tag, cuda, torch["release"]), cuda=cuda, pins=pins, ci=False,
                    default=False, nvcc=False, cuda_archs=None, gpus=None, size_budget=None, lines={},
                    lock_exceptions={k: v for k, v in base.lock_exceptions.items() if k in BASE_EXCEPTIONS})
    entry = replace(entry, pins={**pins, "flash-attn": flash_attn_for(entry)})
    fields = {"tag": entry.tag, "base": entry.base}
    if entry.base_source:
        fields["base_source"] = entry.base_source
    fields.update(python=entry.python, cuda=entry.cuda)
    fields.update({p: v for p, v in entry.pins.items() if v})
    fields["runner"] = list(entry.runner)
    if entry.lock_exceptions:
        fields["lock_exceptions"] = dict(entry.lock_exceptions)
    fields["ci"] = False
    return Proposal(entry, fields)


def already(m: Matrix, proposal: Proposal) -> str | None:
    """Why the proposal is nothing new (the matrix has its tag, or this torch release or a newer one), else None."""
    if proposal.tag in m.by_tag():
        return f"the matrix already has {proposal.tag}"
    newer = [e for e in m.entries if Version(e.torch) >= Version(proposal.entry.torch)]
    if newer:
        return f"the matrix already pins torch {newer[0].torch} ({newer[0].tag}), not older than PyPI's newest " \
               f"{proposal.entry.torch}"
    return None


# --- matrix.yaml's text -----------------------------------------------------------------------------------


def append(text: str, block: str, tag: str) -> str:
    """matrix.yaml's text with `block` (the entry `tag`) added as the last item of `entries:`; every other line, comment
    and blank line kept as it was. Comments after the last entry that open what follows stay after it."""
    lines = text.splitlines(keepends=True)
    try:
        start = next(i for i, ln in enumerate(lines) if re.match(r"entries:\s*(#.*)?$", ln))
    except StopIteration:
        raise ValueError("no top-level `entries:` line") from None
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"[^\s#]", lines[i])), len(lines))
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1  # blank lines and top-level comments before the next key belong to it
    if lines[end - 1] and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    out = "".join(lines[:end]) + "\n" + block + "".join(lines[end:])
    entries = (yaml.safe_load(out) or {}).get("entries") or []
    if not entries or not isinstance(entries[-1], dict) or entries[-1].get("tag") != tag:
        raise ValueError("the appended entry is not the last item of `entries:` (unexpected layout)")
    return out
