"""Turn published release data into compat.yaml facts, and compare them with what compat.yaml says.

Pure functions only (no network, no files): `builder.steps.refresh` fetches PyPI metadata and release
files and hands their text here, so the parsing and the diff are unit-tested on fixtures.

Sources understood:
- PyPI's project JSON for torch (file names per release) plus one wheel's core metadata (PEP 658
  `.metadata`): the CUDA build PyPI serves, the bundled cuDNN major, the CPython range, the C++ ABI.
- flash-attention's `.github/workflows/publish.yml` and `setup.py` at a release tag: which torch
  minors, CUDA builds and CPython versions got a prebuilt wheel, and which torch build each wheel was
  compiled against (that build decides the wheel's real C++ ABI).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

import yaml
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

# torch's Linux x86_64 wheels: manylinux1/2014 wheels were built with the pre-C++11 ABI, the
# manylinux_2_28 ones (torch 2.6 cu126 on PyTorch's index, every build from 2.7) with the C++11 ABI.
# https://github.com/pytorch/pytorch/issues/149044 and issue 152790 (comment by malfet).
_NEW_ABI_PLATFORM = re.compile(r"manylinux_2_(2[89]|[3-9]\d)_x86_64")
_OLD_ABI_PLATFORM = re.compile(r"manylinux(1|2010|2014)_x86_64|manylinux_2_(5|12|17)_x86_64")
# Requires-Dist lines that name the CUDA runtime a torch wheel is built for.
_CUDA_REQ = re.compile(
    r"^Requires-Dist:\s*(?:nvidia-cuda-runtime-cu\d+|cuda-toolkit(?:\[[^\]]*\])?)\s*\(?\s*==\s*(\d+)\.(\d+)", re.M)
_CUDNN_REQ = re.compile(r"^Requires-Dist:\s*nvidia-cudnn-cu\d+\s*\(?\s*==\s*(\d+)\.", re.M)
_REQUIRES_PYTHON = re.compile(r"^Requires-Python:\s*(\S+)", re.M)


def minor_of(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


# --- torch from PyPI ----------------------------------------------------------------------------------


def latest_per_minor(releases: dict, since: str = "2.0") -> dict[str, str]:
    """{minor: newest final release} from PyPI's `releases` mapping (pre-releases and yanked files skipped)."""
    best: dict[str, Version] = {}
    for raw, files in releases.items():
        try:
            v = Version(raw)
        except InvalidVersion:
            continue
        if v.is_prerelease or v.is_devrelease or v < Version(since):
            continue
        if not any(not f.get("yanked") for f in files):
            continue
        key = f"{v.major}.{v.minor}"
        if key not in best or v > best[key]:
            best[key] = v
    return {k: str(best[k]) for k in sorted(best, key=Version)}


def linux_wheels(files: list[dict]) -> list[dict]:
    """CPython Linux x86_64 wheels of one release (no free-threaded `t` builds, nothing yanked)."""
    out = []
    for f in files:
        name = f.get("filename", "")
        if not name.endswith(".whl") or f.get("yanked") or "x86_64" not in name or "linux" not in name:
            continue
        _, _, _, tags = parse_wheel_filename(name)
        if any(t.interpreter.startswith("cp") and not t.abi.endswith("t") for t in tags):
            out.append(f)
    return out


def python_range(wheel_names: list[str]) -> str | None:
    """'>=3.9,<3.14' from the cpXY tags present (assumes the range is contiguous, as torch's is)."""
    found = set()
    for name in wheel_names:
        for tag in parse_wheel_filename(name)[3]:
            m = re.fullmatch(r"cp3(\d+)", tag.interpreter)
            if m and not tag.abi.endswith("t"):
                found.add(int(m.group(1)))
    if not found:
        return None
    return f">=3.{min(found)},<3.{max(found) + 1}"


def abi_of(wheel_names: list[str]) -> bool | None:
    """True/False for the C++11 ABI, from the manylinux platform tag; None when it cannot be told."""
    new = any(_NEW_ABI_PLATFORM.search(n) for n in wheel_names)
    old = any(_OLD_ABI_PLATFORM.search(n) for n in wheel_names)
    if new == old:
        return None
    return new


def facts_from_metadata(metadata: str) -> dict:
    """CUDA build (major.minor) and cuDNN major from a torch wheel's core metadata."""
    facts: dict = {}
    m = _CUDA_REQ.search(metadata)
    if m:
        facts["pypi_cuda"] = f"{m.group(1)}.{m.group(2)}"
    m = _CUDNN_REQ.search(metadata)
    if m:
        facts["cudnn"] = int(m.group(1))
    return facts


def torch_facts(version: str, files: list[dict], metadata: str | None) -> dict:
    """What PyPI says about one torch release: python, cxx11abi, pypi_cuda, cudnn (keys only where known)."""
    names = [f["filename"] for f in linux_wheels(files)]
    facts: dict = {"release": version}
    py = python_range(names)
    if py:
        facts["python"] = py
    abi = abi_of(names)
    if abi is not None:
        facts["cxx11abi"] = abi
    if metadata:
        facts.update(facts_from_metadata(metadata))
    return facts


# --- flash-attn from its release workflow ------------------------------------------------------------


def _build_map(script: str, name: str) -> dict[str, int]:
    m = re.search(name + r"\s*=\s*(\{[^}]*\})", script)
    if not m:
        raise ValueError(f"no `{name} = {{...}}` torch->CUDA map in the workflow")
    return ast.literal_eval(m.group(1))


def _cuda_of(code: int) -> str:
    text = str(code)
    return f"{text[:-1]}.{text[-1]}"  # 118 -> 11.8, 124 -> 12.4, 129 -> 12.9


def _cuda_tags(setup_py: str, majors: set[int]) -> dict[str, str]:
    """The wheel-name CUDA tag per CUDA major, as setup.py's get_wheel_url spells it."""
    live = [ln for ln in setup_py.splitlines() if not ln.strip().startswith("#")]
    code = "\n".join(live)
    if re.search(r'cuda_version\s*=\s*f"\{torch_cuda_version\.major\}"', code):
        return {str(m): f"cu{m}" for m in sorted(majors)}
    m = re.search(r'parse\("(\d+)\.(\d+)"\)\s+if torch_cuda_version\.major == 11 else parse\("(\d+)\.(\d+)"\)', code)
    if m and re.search(r'cuda_version\s*=\s*f"\{torch_cuda_version\.major\}\{torch_cuda_version\.minor\}"', code):
        tags = {"11": f"cu{m.group(1)}{m.group(2)}", "12": f"cu{m.group(3)}{m.group(4)}"}
        return {k: v for k, v in tags.items() if int(k) in majors}
    raise ValueError("setup.py: cannot tell how the wheel name spells the CUDA version")


def flash_attn_release(publish_yml: str, setup_py: str, since: str = "2.0") -> dict:
    """One release's wheel matrix in compat.yaml's shape.

    torch: {minor: [torch CUDA builds the wheels were compiled against]}. The CI installs torch from
    PyTorch's index for CUDA `minv` (CUDA 11 wheels) or `maxv` (CUDA 12+) per torch minor; the
    cxx11abi flag only sets -D_GLIBCXX_USE_CXX11_ABI, so a wheel works only with a torch whose ABI
    equals the ABI of the build it was compiled against.
    """
    doc = yaml.safe_load(publish_yml)
    try:
        job = doc["jobs"]["build_wheels"]
        matrix = job["strategy"]["matrix"]
    except (KeyError, TypeError) as exc:
        raise ValueError("publish.yml: no jobs.build_wheels.strategy.matrix (unrecognised layout)") from exc
    script = "\n".join(str(s.get("run", "")) for s in job.get("steps", []) if isinstance(s, dict))
    minv, maxv = _build_map(script, "minv"), _build_map(script, "maxv")
    excludes = matrix.get("exclude") or []
    pythons = [str(p) for p in matrix["python-version"]]
    cudas = [int(str(c).split(".")[0]) for c in matrix["cuda-version"]]
    torch: dict[str, list[str]] = {}
    python_excludes: set[tuple[str, str]] = set()
    for raw in matrix["torch-version"]:
        version = Version(str(raw))
        if version.is_devrelease or version.is_prerelease or version < Version(since):
            continue  # nightly builds get no stable wheel name worth recording
        minor = f"{version.major}.{version.minor}"
        builds = []
        for cuda in sorted(set(cudas)):
            if any(str(x.get("torch-version")) == str(raw) and "cuda-version" in x
                   and int(str(x["cuda-version"]).split(".")[0]) == cuda for x in excludes):
                continue
            builds.append(_cuda_of(minv[minor] if cuda < 12 else maxv[minor]))
        if builds:
            torch[minor] = builds
        for x in excludes:
            if str(x.get("torch-version")) == str(raw) and "python-version" in x:
                python_excludes.add((minor, str(x["python-version"])))
    majors = {int(b.split(".")[0]) for builds in torch.values() for b in builds}
    release = {
        "python": pythons,
        "cuda_tag": _cuda_tags(setup_py, majors),
        "torch": torch,
    }
    exclude = sorted([t, p] for t, p in python_excludes if t in torch and p in pythons)
    if exclude:
        release["exclude"] = exclude
    return release


# --- diff against compat.yaml ------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    section: str  # "torch" or "flash_attn"
    key: str  # torch minor or flash-attn version
    field: str  # "" for a whole new key
    old: object
    new: object

    def render(self) -> str:
        where = f"{self.section}.{self.key}" + (f".{self.field}" if self.field else "")
        if self.old is None:
            return f"+ {where}: {self.new if isinstance(self.new, str) else _show(self.new)}"
        if self.new is None:
            return f"- {where}: {_show(self.old)}"
        return f"~ {where}: {_show(self.old)} -> {_show(self.new)}"


def _show(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


TORCH_FIELDS = ("python", "pypi_cuda", "cxx11abi", "cudnn")
FLASH_FIELDS = ("python", "cuda_tag", "torch", "exclude")


def diff_torch(current: dict, fetched: dict[str, dict]) -> list[Change]:
    """Changes that PyPI's facts make to compat.yaml's `torch:` section (only fields PyPI can tell)."""
    changes = []
    for minor, facts in fetched.items():
        known = current.get(minor)
        if known is None:
            new = {k: facts[k] for k in TORCH_FIELDS if k in facts}
            if all(k in new for k in TORCH_FIELDS):
                # PyTorch's per-CUDA indexes are not read: the PyPI build is the one build known for sure.
                changes.append(Change("torch", minor, "", None, {"cuda_builds": [new["pypi_cuda"]], **new}))
            else:
                # Without its wheel metadata the CUDA build is unknown: an entry would be incomplete.
                missing = ", ".join(k for k in TORCH_FIELDS if k not in new)
                changes.append(Change("torch", minor, "", None, f"{facts.get('release', minor)} on PyPI "
                                      f"({_show(new)}); {missing} unknown: add by hand with a source"))
            continue
        for field in TORCH_FIELDS:
            if field in facts and facts[field] != known.get(field):
                changes.append(Change("torch", minor, field, known.get(field), facts[field]))
    return changes


def diff_flash_attn(current: dict, fetched: dict[str, dict | None]) -> list[Change]:
    """Changes for flash-attn releases; a release fetched as None is known to exist but has no wheel data."""
    changes = []
    for version, release in fetched.items():
        known = current.get(version)
        if release is None:
            if known is None:
                changes.append(Change("flash_attn", version, "", None, "released on PyPI; wheel list not read"))
            continue
        if known is None:
            changes.append(Change("flash_attn", version, "", None, release))
            continue
        for field in FLASH_FIELDS:
            old, new = known.get(field), release.get(field)
            if field == "torch" and old is not None:
                old = {k: v for k, v in old.items()}
            if new is not None and old != new:
                changes.append(Change("flash_attn", version, field, old, new))
    return changes


def _flow(value) -> str:
    return json.dumps(value)  # JSON is YAML flow style: one line, quoted strings, stable key order


def _block_span(lines: list[str], start: int, indent: int) -> int:
    """Index after the block starting at `start`: up to the next line indented <= indent (or blank)."""
    end = start + 1
    while end < len(lines) and lines[end].strip() and (len(lines[end]) - len(lines[end].lstrip())) > indent:
        end += 1
    return end


def apply_text(text: str, changes: list[Change], source) -> str:
    """compat.yaml's text with the changes applied in place, comments and layout kept.

    Torch entries are one flow mapping per key (possibly over several lines); a changed field's value
    is replaced where it stands. New torch minors and new flash-attn releases are appended at the end
    of their section, each with its source (`source`: text, or a function of the change). The result is
    re-read to prove it still parses.
    """
    lines = text.splitlines()
    source_of = source if callable(source) else (lambda _change: source)
    for c in changes:
        source = source_of(c)
        if c.section == "torch":
            head = next((i for i, ln in enumerate(lines) if ln.startswith(f'  "{c.key}": {{')), None)
            if head is None:
                if not c.field and isinstance(c.new, dict):
                    end = _section_end(lines, "torch:")
                    body = ", ".join(f"{k}: {_flow(v)}" for k, v in {**c.new, "source": source}.items())
                    lines.insert(end, f'  "{c.key}": {{{body}}}')
                continue
            end = _block_span(lines, head, 2)
            block = "\n".join(lines[head:end])
            pattern = re.compile(rf"(\b{re.escape(c.field)}:\s*)(\"[^\"]*\"|[^,}}\s]+)")
            m = pattern.search(block)
            if m:
                block = block[:m.start(2)] + _flow(c.new) + block[m.end(2):]
            else:
                block = block.replace("source:", f"{c.field}: {_flow(c.new)}, source:", 1)
            # The changed value carries its evidence: appended to the entry's source.
            note = f"; {c.field} from {source}"
            block = re.sub(r'(source:\s*"[^"]*)"', lambda m, note=note: f'{m.group(1)}{note}"', block, count=1)
            lines[head:end] = block.split("\n")
        else:
            head = next((i for i, ln in enumerate(lines) if ln.startswith(f'    "{c.key}":')), None)
            if head is None:
                if not c.field and isinstance(c.new, dict):
                    end = _section_end(lines, "flash_attn:")
                    new = [f'    "{c.key}":'] + [f"      {k}: {_flow(v)}" for k, v in c.new.items()]
                    lines[end:end] = new + [f"      source: {_flow(source)}"]
                continue
            end = _block_span(lines, head, 4)
            at = next((i for i in range(head + 1, end) if lines[i].strip().startswith(f"{c.field}:")), None)
            if at is None:
                lines.insert(end - 1, f"      {c.field}: {_flow(c.new)}")
            else:
                lines[at] = f"      {c.field}: {_flow(c.new)}"
    out = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    yaml.safe_load(out)  # never hand back a file that does not parse
    return out


def _section_end(lines: list[str], header: str) -> int:
    """Index of the blank line (or next top-level key) that ends a top-level section."""
    start = lines.index(header)
    end = start + 1
    while end < len(lines) and (not lines[end] or lines[end][0] in " #") and not (
            lines[end] == "" and end + 1 < len(lines) and lines[end + 1][:1] not in (" ", "#", "")):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return end
