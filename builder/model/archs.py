"""Kernels that must exist (issue 45): does the GPU code of the entry's torch build and flash-attn wheel run on
every GPU the entry claims?

Pure: the arch lists come from builder/data/knowledge/archs.yaml, which `refresh-compat --archs`
(builder/derive/archs.py) reads out of the published binaries and build scripts. A GPU without code fails at its
first kernel with "no kernel image is available for execution on the device"; flash-attn also refuses GPUs its
capability check does not accept.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from packaging.version import Version

from builder.model import rulebook
from builder.model.matrix import Entry
from builder.model.verdict import Outcome

NO_KERNEL = "no kernel image is available for execution on the device"
FA_REFUSES = "FlashAttention only supports Ampere GPUs or newer."
REFRESH = "not in the data: run `python -m builder refresh-compat --archs`"
DATA = "builder/data/knowledge/archs.yaml"


@lru_cache(maxsize=1)
def data() -> dict:
    path = resources.files("builder").joinpath("data/knowledge/archs.yaml")
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _cap(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def covers(arch: dict, capability: str) -> bool:
    """Does code with these lists run on a GPU of `capability`? SASS X.y runs on X.z for z >= y; PTX X.y is
    JIT-compiled for any capability >= X.y. "a" code (sm_90a) runs on exactly that capability; "f" code (family,
    sm_100f) on the same major from that minor on, PTX included."""
    want = _cap(capability)
    for kind in ("sass", "ptx"):
        for token in arch.get(kind) or ():
            have = _cap(token.rstrip("af"))
            if token.endswith("a"):
                ok = have == want
            elif kind == "sass" or token.endswith("f"):
                ok = have[0] == want[0] and have[1] <= want[1]
            else:
                ok = have <= want
            if ok:
                return True
    return False


def runs_on(guard: list[str], capability: str) -> bool:
    """Does flash-attn's capability check accept the GPU? "8.x" (major 8), "9.0" (exactly), ">=8.0" (or newer)."""
    want = _cap(capability)
    for term in guard:
        if term.startswith(">="):
            ok = want >= _cap(term[2:])
        elif term.endswith(".x"):
            ok = want[0] == int(term[:-2])
        else:
            ok = want == _cap(term)
        if ok:
            return True
    return False


def torch_archs(torch_version: str, cuda: str) -> dict | None:
    """The row of torch `torch_version`'s CUDA `cuda` build (its minor's newest release), None when not in the data."""
    v = Version(torch_version)
    return ((data().get("torch") or {}).get(f"{v.major}.{v.minor}") or {}).get(cuda)


def flash_attn_archs(version: str, cuda: str | None = None) -> dict | None:
    """flash-attn `version`'s row, with the sass/ptx of its CUDA-`cuda` wheels where they differ; None if absent."""
    row = (data().get("flash_attn") or {}).get(version)
    if row is None or cuda is None:
        return row
    return {**row, **((row.get("by_cuda") or {}).get(str(Version(cuda).major)) or {})}


def whole(row: dict) -> dict:
    """The code every kernel of the build carries: a torch row less its `partial` archs (per-file kernels)."""
    few = set(row.get("partial") or ())
    return {kind: [a for a in row.get(kind) or () if a not in few] for kind in ("sass", "ptx")}


def evidence(row: dict) -> str:
    """Where a row's lists were read: the file and its sha256, or the build script's URL."""
    if row.get("source") == "build-script":
        return f"{DATA}: build script {row['url']}"
    if "sdist" in row:
        return f"{DATA}: {row['sdist']} sha256 {row['sha256']}"
    return f"{DATA}: {row['wheel']} ({row.get('member', 'libtorch_cuda.so')}) sha256 {row['sha256']}"


def _listed(row: dict) -> str:
    return f"sass {', '.join(row.get('sass') or ()) or '-'}; ptx {', '.join(row.get('ptx') or ()) or '-'}"


def capability(gpu: str) -> str | None:
    return rulebook.gpu_capability(gpu)


def evaluate(entry: Entry, gpus: tuple[str, ...], explicit: bool) -> list[Outcome]:
    """For each GPU (of compat.yaml toolchain.gpus; unknown ones are compat's gpu-known rule), whether the torch
    build has code for it, and, when flash-attn is pinned, whether flash-attn's wheel does and accepts it.
    explicit: the entry names the GPUs (`gpus:`), so a failure points at that field; else at `cuda`."""
    found = []
    torch_row = torch_archs(entry.torch, entry.cuda)
    fa = entry.pins.get("flash-attn")
    fa_row = flash_attn_archs(fa, entry.cuda) if fa else None
    build = f"torch {entry.torch}+cu{entry.cuda.replace('.', '')}"
    for gpu in gpus:
        cap = capability(gpu)
        if cap is None:
            continue
        found.append(_torch_outcome(entry, gpu, cap, torch_row, build, explicit))
        if fa:
            found.append(_flash_attn_outcome(fa, gpu, cap, fa_row, explicit))
    return found


def toolkit_bound(cuda: str) -> list[str] | None:
    """The SM versions CUDA `cuda`'s nvcc can compile (compat.yaml toolchain.cuda_archs): no build of that CUDA
    line carries SASS for a newer GPU, whatever its arch list."""
    row = rulebook.rules()["toolchain"]["cuda_archs"].get(cuda)
    return row["nvcc"] if row else None


def _no_ptx_seen() -> bool:
    """Does no torch build read from a binary carry PTX? Then a build without a row carries none either."""
    rows = [b for minor in data().get("torch", {}).values() for b in minor.values() if b.get("source") == "binary"]
    return bool(rows) and not any(whole(b).get("ptx") for b in rows)


def _torch_outcome(entry: Entry, gpu: str, cap: str, row: dict | None, build: str, explicit: bool) -> Outcome:
    field = "gpus" if explicit else "cuda"
    if row is None:
        bound = toolkit_bound(entry.cuda)
        if bound and _cap(cap) > max(_cap(a) for a in bound) and _no_ptx_seen():
            # No arch list for this build, but CUDA's own compiler bounds it: nvcc X cannot emit SASS for a newer
            # GPU, and no torch build read from its binary carries PTX for the driver to JIT.
            return Outcome("torch-archs", "toolkit", field, False,
                           f"{build} cannot have kernels for {gpu} (compute capability {cap}): CUDA {entry.cuda}'s "
                           f"nvcc compiles sm_{max(bound, key=_cap).replace('.', '')} at most, and no torch build "
                           f"read from its binary carries PTX; every CUDA op fails with 'CUDA error: {NO_KERNEL}'; "
                           "use a torch build for a newer CUDA", "compat.yaml toolchain.cuda_archs; " + DATA)
        return Outcome("torch-archs", "binary", field, None, f"{build}: {REFRESH}", DATA)
    release = row.get("release", entry.torch)
    if covers(whole(row), cap):
        return Outcome("torch-archs", "binary", field, True, f"{gpu} (compute capability {cap}) runs {build}'s "
                       f"kernels ({_listed(whole(row))}, read from {release})", evidence(row))
    fix = "drop the GPU from gpus:" if explicit else "set gpus: to the GPUs this build runs on"
    return Outcome("torch-archs", "binary", field, False,
                   f"{build} has no kernels for {gpu} (compute capability {cap}): its build carries "
                   f"{_listed(whole(row))} "
                   f"(read from {release}); every CUDA op fails with 'CUDA error: {NO_KERNEL}'; use a torch build "
                   f"whose arch list covers {cap}, or {fix}", evidence(row))


def _flash_attn_outcome(version: str, gpu: str, cap: str, row: dict | None, explicit: bool) -> Outcome:
    del explicit  # the flash-attn pin is what to change either way
    if row is None:
        return Outcome("flash-attn-archs", "binary", "flash-attn", None, f"flash-attn {version}: {REFRESH}", DATA)
    if not runs_on(row["runs_on"], cap):
        return Outcome("flash-attn-archs", "binary", "flash-attn", False,
                       f"flash-attn {version} refuses {gpu} (compute capability {cap}): its check accepts "
                       f"{', '.join(row['runs_on'])} and raises 'RuntimeError: {FA_REFUSES}'; drop flash-attn "
                       "(torch's SDPA runs there) or the GPU", evidence(row))
    if not covers(row, cap):
        nvcc = f", built with CUDA {', '.join(row['wheel_nvcc'].values())}" if row.get("wheel_nvcc") else ""
        return Outcome("flash-attn-archs", "binary", "flash-attn", False,
                       f"flash-attn {version}'s wheels carry no kernels for {gpu} (compute capability {cap}): "
                       f"{_listed(row)}{nvcc}; its kernels fail with 'CUDA error: {NO_KERNEL}'; use a flash-attn "
                       f"release built for {cap}, or drop flash-attn or the GPU", evidence(row))
    return Outcome("flash-attn-archs", "binary", "flash-attn", True,
                   f"{gpu} (compute capability {cap}) runs flash-attn {version} ({_listed(row)})", evidence(row))


def default_gpus(entry: Entry) -> tuple[str, ...]:
    """The GPUs an entry without `gpus:` claims: compat.yaml toolchain.claims for its CUDA major, less those the
    torch build (and a pinned flash-attn) has no code for or refuses. Derived, so a default never rejects an
    entry; a GPU whose data is missing stays (evaluate says it could not be judged)."""
    claims = rulebook.rules()["toolchain"]["claims"].get(str(Version(entry.cuda).major), ())
    torch_row = torch_archs(entry.torch, entry.cuda)
    fa = entry.pins.get("flash-attn")
    fa_row = flash_attn_archs(fa, entry.cuda) if fa else None
    kept = []
    for gpu in claims:
        cap = capability(gpu)
        if cap is None:
            kept.append(gpu)
            continue
        if torch_row is not None and not covers(whole(torch_row), cap):
            continue
        if fa_row is not None and not (runs_on(fa_row["runs_on"], cap) and covers(fa_row, cap)):
            continue
        kept.append(gpu)
    return tuple(kept)
