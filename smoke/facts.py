"""The image's facts file and pure comparison helpers (stdlib only, unit-tested)."""

import json
import os
import re

DEFAULT_FACTS = "/opt/train-image/image.json"


def facts_path():
    return os.environ.get("TRAIN_IMAGE_FACTS") or DEFAULT_FACTS


def load_facts(path=None):
    path = path or facts_path()
    with open(path) as f:
        return json.load(f)


def canon_name(name):
    """PEP 503 name normalisation: 'NVIDIA_ML_PY' == 'nvidia-ml-py'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def norm_version(v):
    """Public version for comparison: drop the local label (+cu130, +cpu) and trailing .0s.

    Pins are written as on PyPI ("2.13.0"); wheels from PyTorch's own index carry a
    local label ("2.13.0+cu130") that is the same release.  The CUDA flavour is checked
    separately (torch.version.cuda), so ignoring the label here loses nothing.
    """
    v = str(v).strip().lower().split("+", 1)[0]
    parts = v.split(".")
    while len(parts) > 1 and parts[-1] == "0":
        parts.pop()
    return ".".join(parts)


def compare_pins(pins, installed):
    """Compare facts pins with installed versions.

    pins: {name: version-or-None}; installed: {name: version-or-None} (None = absent).
    Returns [(name, ok, detail)].  A null pin means "must not be installed", except
    torch, which a training image always needs.
    """
    out = []
    for name, pin in pins.items():
        have = installed.get(name)
        if pin is None:
            if canon_name(name) == "torch":
                out.append((name, False, "torch pinned to null, but torch is always required"))
            elif have is None:
                out.append((name, True, "absent, as pinned (null)"))
            else:
                out.append((name, False, f"pinned null (absent) but {have} is installed"))
            continue
        if have is None:
            out.append((name, False, f"pinned {pin} but not installed"))
        elif norm_version(have) == norm_version(pin):
            out.append((name, True, have))
        else:
            out.append((name, False, f"installed {have} != pinned {pin}"))
    return out


def version_tuple(v):
    """'580.65.06' -> (580, 65, 6); non-numeric parts end the tuple."""
    out = []
    for p in re.split(r"[.\-]", str(v).strip()):
        if not p.isdigit():
            break
        out.append(int(p))
    return tuple(out)


def driver_ok(host, minimum):
    """True if host driver version >= minimum (dotted, numeric compare)."""
    return version_tuple(host) >= version_tuple(minimum)


def cuda_major_minor(v):
    """'13.0.3' / '13.0' / 13.0 -> '13.0'; None stays None."""
    if v is None:
        return None
    t = version_tuple(v)
    return f"{t[0]}.{t[1] if len(t) > 1 else 0}" if t else None


def shm_ok(size_bytes, min_mb):
    return size_bytes >= int(min_mb) * 1024 * 1024


def parse_arch(entry):
    """'sm_90' -> ('sm', 9, 0, ''); 'sm_100a' -> ('sm', 10, 0, 'a'); 'compute_80' -> ('compute', 8, 0, '')."""
    m = re.fullmatch(r"(sm|compute)_(\d+)(\w?)", entry.strip())
    if not m:
        return None
    num = m.group(2)
    return (m.group(1), int(num[:-1]), int(num[-1]), m.group(3))


def arch_supported(cap, arch_list):
    """Can code built for arch_list run on a GPU of capability cap=(major, minor)?

    Returns (ok, how).  SASS (sm_XY) runs on the same major with minor >= Y; arch-specific
    'a' variants only on the exact capability; PTX (compute_XY) JIT-compiles for any
    capability >= XY (slower first start, so reported).
    """
    major, minor = cap
    sass = ptx = None
    for e in arch_list:
        p = parse_arch(e)
        if not p:
            continue
        kind, M, m, suffix = p
        if kind == "sm" and (M, m) == (major, minor):
            return True, f"exact {e}"
        if kind == "sm" and suffix != "a" and M == major and m <= minor and sass is None:
            sass = (True, f"binary-compatible {e}")
        if kind == "compute" and (M, m) <= (major, minor) and ptx is None:
            ptx = (True, f"PTX JIT from {e}")
    return sass or ptx or (False, f"sm_{major}{minor} not in [{','.join(arch_list)}]")
