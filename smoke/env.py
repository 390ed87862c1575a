"""env check: is the image's Python stack what its facts file says, and does the GPU work?

Runs in one process (no ranks).  Every probe is guarded: one broken piece must be reported
with its diagnosis, not abort the rest of the report.  torch is imported inside run() so the
module's helpers stay importable with only the stdlib.
"""

import importlib.metadata as md
import importlib.util
import os
import sys
import traceback

from smoke import facts as F

DEFAULT_MIN_SHM_MB = 1024


def installed_versions(names):
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def module_owners(module, pkg_dists=None):
    """Distributions (canonical names, dedup) that ship top-level `module`."""
    if pkg_dists is None:
        pkg_dists = md.packages_distributions()
    return sorted({F.canon_name(d) for d in pkg_dists.get(module, [])})


def owner_of_file(path):
    """The distribution whose RECORD lists `path` (the file Python actually imports)."""
    if not path:
        return None
    real = os.path.realpath(path)
    for dist in md.distributions():
        for f in dist.files or ():
            if f.name == os.path.basename(real) and os.path.realpath(str(dist.locate_file(f))) == real:
                return F.canon_name(dist.metadata["Name"])
    return None


def torch_dirs_on_path(paths):
    """Distinct directories providing a `torch` package across sys.path entries."""
    seen = []
    for entry in paths:
        d = os.path.join(entry or os.getcwd(), "torch")
        if os.path.isfile(os.path.join(d, "__init__.py")):
            r = os.path.realpath(d)
            if r not in seen:
                seen.append(r)
    return seen


def shm_size(path="/dev/shm"):
    st = os.statvfs(path)
    return st.f_frsize * st.f_blocks


def _err(res, name, exc):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    res.diagnose(text)
    msg = str(exc).strip()
    first = msg.splitlines()[0][:300] if msg else ""
    return res.add(name, False, f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


def check_packages(res, facts):
    pins = facts.get("pins", {})
    inst = installed_versions(pins)
    res.figures["versions"] = inst
    for name, ok, detail in F.compare_pins(pins, inst):
        res.add(f"pin {name}", ok, detail)


def check_pynvml(res):
    spec = importlib.util.find_spec("pynvml")
    if spec is None:
        return res.add("pynvml from nvidia-ml-py", False,
                       "pynvml not importable; install nvidia-ml-py (DeepSpeed needs it at run time)")
    owners = module_owners("pynvml")
    owner = owner_of_file(spec.origin)
    res.figures["pynvml_file"] = spec.origin
    res.figures["pynvml_owner"] = owner
    try:
        import pynvml  # noqa: F401
    except Exception as e:
        return _err(res, "pynvml from nvidia-ml-py", e)
    if owner != "nvidia-ml-py":
        return res.add("pynvml from nvidia-ml-py", False,
                       f"pynvml comes from {owner!r} ({spec.origin}) - want nvidia-ml-py, not pynvml/nvidia-ml-py3")
    others = [o for o in owners if o != "nvidia-ml-py"]
    if others:
        return res.add("pynvml from nvidia-ml-py", False,
                       "also shipped by {}: competing pynvml modules".format(",".join(others)))
    return res.add("pynvml from nvidia-ml-py", True, spec.origin)


def check_single_torch(res):
    owners = module_owners("torch")
    dirs = torch_dirs_on_path(sys.path)
    res.figures["torch_dirs"] = dirs
    if len(owners) > 1:
        return res.add("single torch", False, f"several distributions ship torch: {owners}")
    if len(dirs) > 1:
        return res.add("single torch", False, f"torch found in several sys.path entries: {dirs}")
    return res.add("single torch", True, dirs[0] if dirs else "")


def check_shm(res):
    min_mb = int(os.environ.get("SMOKE_MIN_SHM_MB", DEFAULT_MIN_SHM_MB))
    try:
        size = shm_size()
    except OSError as e:
        res.hint("no /dev/shm: run with `docker run --shm-size=8g` or `--ipc=host`")
        return res.add("/dev/shm size", False, f"cannot stat /dev/shm: {e}")
    res.figures["shm_mb"] = size // (1024 * 1024)
    if F.shm_ok(size, min_mb):
        return res.add("/dev/shm size", True, f"{size // 2**20} MB")
    res.hint(f"/dev/shm is {size // 2**20} MB (< {min_mb} MB): NCCL and DataLoader workers need more; "
             "run with `docker run --shm-size=8g` or `--ipc=host`")
    return res.add("/dev/shm size", False, f"{size // 2**20} MB < {min_mb} MB")


def check_torch_build(res, facts, mode):
    import torch
    res.figures["torch"] = torch.__version__
    res.figures["torch_cuda"] = torch.version.cuda
    want = F.cuda_major_minor(facts.get("cuda"))
    have = F.cuda_major_minor(torch.version.cuda)
    if want is None:
        res.add("torch CUDA build", have is None, f"facts: CPU image; torch.version.cuda={have}")
    elif have is None:
        res.add("torch CUDA build", False,
                f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None) but the image claims "
                f"CUDA {want}: a later install step probably replaced the CUDA torch")
    else:
        res.add("torch CUDA build", have == want, f"torch.version.cuda={have}, facts cuda={want}")
    if torch.version.cuda is None:
        res.figures["cudnn"] = res.figures["nccl"] = None
        return
    # cuDNN/NCCL load from the nvidia-* wheels even without a GPU: a missing .so shows here.
    try:
        v = torch.backends.cudnn.version()
        res.figures["cudnn"] = v
        res.add("cuDNN loads", v is not None, f"cudnn {v}")
    except Exception as e:
        _err(res, "cuDNN loads", e)
    try:
        v = torch.cuda.nccl.version()
        res.figures["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
        res.add("NCCL version", True, res.figures["nccl"])
    except Exception as e:
        _err(res, "NCCL version", e)


def check_gpus(res, facts):
    import torch
    if not torch.cuda.is_available():
        return res.add("CUDA available", False, "torch.cuda.is_available() is False")
    n = torch.cuda.device_count()
    res.add("CUDA available", n > 0, f"{n} device(s)")
    res.figures["gpu_count"] = n
    arch = torch.cuda.get_arch_list()
    res.figures["arch_list"] = arch
    gpus = []
    for i in range(n):
        cap = torch.cuda.get_device_capability(i)
        name = torch.cuda.get_device_name(i)
        gpus.append({"index": i, "name": name, "capability": "sm_{}{}".format(*cap)})
        ok, how = F.arch_supported(cap, arch)
        res.add("gpu{} {} sm_{}{} in arch list".format(i, name, *cap), ok, how)
    res.figures["gpus"] = gpus
    for i in range(n):
        try:
            dev = torch.device("cuda", i)
            torch.backends.cuda.matmul.allow_tf32 = False  # compare real fp32, not TF32
            g = torch.Generator().manual_seed(0)
            a = torch.randn(512, 512, generator=g)
            b = torch.randn(512, 512, generator=g)
            ref = a @ b
            got = (a.to(dev) @ b.to(dev)).cpu()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            res.add(f"gpu{i} matmul vs CPU", err < 1e-4, f"max rel err {err:.2e}")
        except Exception as e:
            _err(res, f"gpu{i} matmul vs CPU", e)
    try:
        torch.backends.cudnn.allow_tf32 = False
        g = torch.Generator().manual_seed(1)
        x = torch.randn(4, 8, 32, 32, generator=g)
        w = torch.randn(16, 8, 3, 3, generator=g)
        ref = torch.nn.functional.conv2d(x, w, padding=1)
        got = torch.nn.functional.conv2d(x.cuda(), w.cuda(), padding=1).cpu()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        res.add("cuDNN conv2d vs CPU", torch.backends.cudnn.is_available() and err < 1e-4,
                f"max rel err {err:.2e}")
    except Exception as e:
        _err(res, "cuDNN conv2d vs CPU", e)
    return True


def check_driver(res, facts):
    minimum = facts.get("min_driver")
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            drv = drv.decode() if isinstance(drv, bytes) else drv
            res.figures["driver"] = drv
            try:
                cv = pynvml.nvmlSystemGetCudaDriverVersion_v2()
                res.figures["driver_cuda"] = f"{cv // 1000}.{(cv % 1000) // 10}"
            except Exception:
                pass
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:
        return _err(res, "host driver via NVML", e)
    if not minimum:
        return res.add("host driver via NVML", True, drv)
    ok = F.driver_ok(drv, minimum)
    msg = "host driver {} {} image minimum {} (CUDA {})".format(drv, ">=" if ok else "<", minimum,
                                                           facts.get("cuda"))
    if not ok:
        res.hint(msg + ": upgrade the host driver or use an image built for an older CUDA")
    return res.add("host driver >= min_driver", ok, msg)


def check_flash_attn(res, facts, mode):
    if facts.get("pins", {}).get("flash-attn") is None:
        return None
    try:
        import flash_attn
        from flash_attn import flash_attn_func
    except Exception as e:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        if mode == "cpu" and "libcuda.so" in text:  # needs a driver to import: not the image's fault
            return res.add("flash-attn import", None, "skipped: needs a GPU driver to import")
        return _err(res, "flash-attn import", e)
    res.figures["flash_attn"] = flash_attn.__version__
    if mode == "cpu":
        return res.add("flash-attn import", True, f"{flash_attn.__version__} (forward/backward needs a GPU)")
    import torch
    cap = torch.cuda.get_device_capability(0)
    if cap < (8, 0):
        return res.add("flash-attn fwd+bwd", None, "skipped: sm_{}{} < sm_80 (flash-attn's floor)".format(*cap))
    try:
        dt = torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(2, 128, 4, 64, device="cuda", dtype=dt, generator=g, requires_grad=True)
                   for _ in range(3))
        out = flash_attn_func(q, k, v, causal=True)
        out.float().sum().backward()
        # Reference: torch SDPA in fp32 (B, H, S, D layout).
        qr, kr, vr = (t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
        ref.sum().backward()
        def rel(a, b):  # bf16 vs fp32 reference: error relative to the reference's scale
            return ((a.float() - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
        err = rel(out, ref.transpose(1, 2))
        gerr = rel(q.grad, qr.grad.transpose(1, 2))
        ok = err < 2e-2 and gerr < 5e-2 and bool(torch.isfinite(q.grad).all())
        return res.add("flash-attn fwd+bwd", ok, f"rel err out {err:.1e}, dq {gerr:.1e}")
    except Exception as e:
        return _err(res, "flash-attn fwd+bwd", e)


def check_transports(res):
    """Which transports NCCL can load between nodes: without rdma-core only sockets (the silent TCP fallback)."""
    from smoke import transport

    found, missing, devices = transport.loadable_transports()
    res.figures["nccl_transports"] = found
    res.figures["rdma_devices"] = devices
    detail = ", ".join(found) + f"; RDMA devices here: {', '.join(devices) or 'none'}"
    if missing:
        detail += f"; missing {', '.join(missing)}: NCCL can only use sockets between nodes (install rdma-core)"
    return res.add("NCCL transports loadable", not missing, detail)


def run(res, facts, mode):
    res.figures["facts"] = F.facts_path()
    res.figures["python"] = "{}.{}.{}".format(*sys.version_info[:3])
    want_py = facts.get("python")
    if want_py:
        res.add("python version", res.figures["python"].startswith(want_py + ".") or
                res.figures["python"] == want_py, "{} (facts {})".format(res.figures["python"], want_py))
    check_packages(res, facts)
    for fn in (check_pynvml, check_single_torch, check_shm, check_transports):
        try:
            fn(res)
        except Exception as e:
            _err(res, fn.__name__, e)
    try:
        check_torch_build(res, facts, mode)
    except Exception as e:
        _err(res, "import torch", e)
        return
    if mode == "gpu":
        for fn in (check_gpus, check_driver):
            try:
                fn(res, facts)
            except Exception as e:
                _err(res, fn.__name__, e)
    # DeepSpeed's prebuilt ops have their own check (smoke.ops), run without a compiler on PATH.
    for fn in (check_flash_attn,):
        try:
            fn(res, facts, mode)
        except Exception as e:
            _err(res, fn.__name__, e)
    f = res.figures
    res.summary = "torch {} cuda {} cudnn {} nccl {}{}".format(
        f.get("torch"), f.get("torch_cuda"), f.get("cudnn"), f.get("nccl"),
        (", driver {}".format(f["driver"])) if f.get("driver") else "")
