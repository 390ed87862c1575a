"""Known failure signatures of training images, recognised in exception text and logs.

One table, used by every check: a failure is far more useful when it says *why*
("host driver too old for CUDA 13") than when it only shows a traceback.
Patterns come from field reports of these failures; keep them specific so a
match is a real diagnosis, not a guess.
"""

import re

# (id, regex, explanation).  Order matters only for output order.
SIGNATURES = [
    ("cudnn_missing",
     r"libcudnn[\w.]*\.so(\.\d+)*: cannot open shared object file",
     "cuDNN library missing: the image's cuDNN does not match the torch build "
     "(torch wheels bring their own nvidia-cudnn-cuXX; a cuDNN 8 name means a torch built for an "
     "older CUDA, or LD_LIBRARY_PATH points at another CUDA install)."),
    ("driver_too_old",
     r"CUDA driver version is insufficient for CUDA runtime version|"
     r"driver on your system is too old",
     "Host NVIDIA driver is older than the image's CUDA needs (CUDA 12.x needs >= 525.60.13, "
     "CUDA 13.x >= 580). Upgrade the host driver or use an image built for an older CUDA."),
    ("no_kernel_image",
     r"no kernel image is available for execution on the device",
     "This GPU's compute capability is not in the arch list the code was compiled for "
     "(torch.cuda.get_arch_list(), TORCH_CUDA_ARCH_LIST for DeepSpeed ops / flash-attn)."),
    ("ptx_toolchain",
     r"provided PTX was compiled with an unsupported toolchain|cudaErrorUnsupportedPtxVersion|"
     r"CUDA error 222",
     "PTX built by a newer CUDA toolkit than the host driver supports; minor-version "
     "compatibility does not cover PTX JIT. Upgrade the driver or ship SASS for this GPU."),
    ("fabric_manager",
     r"Error 802|system not yet initialized|cudaErrorSystemNotReady",
     "CUDA error 802: on NVSwitch hosts (HGX/DGX) the nvidia-fabricmanager service is not running "
     "or its version differs from the driver. Start/align fabric manager on the host."),
    ("driver_mismatch",
     r"Error 803|unsupported display driver / cuda driver combination|"
     r"cudaErrorSystemDriverMismatch",
     "CUDA error 803: a user-mode libcuda inside the image does not match the host kernel driver. "
     "Do not ship libcuda.so / the cuda-compat package in the image; let the NVIDIA container "
     "runtime inject the host's."),
    ("libcuda_missing",
     r"libcuda\.so(\.1)?: cannot open shared object file|"
     r"NVML Shared Library Not Found|NVMLError_LibraryNotFound|Found no NVIDIA driver",
     "No NVIDIA driver visible in the container: run with `--gpus all` (nvidia-container-toolkit) "
     "or use --cpu mode."),
    ("ninja_missing",
     r"Ninja is required to load C\+\+ extensions|due to ninja not being installed",
     "A C++/CUDA extension is being JIT-built but `ninja` is not on PATH (install ninja in the venv "
     "and put the venv's bin on PATH), or prebuild the op at image build time."),
    ("python_headers_missing",
     r"Python\.h: No such file or directory",
     "The Python headers are missing: torch.compile (inductor's C++ and triton's launcher) and DeepSpeed's "
     "JIT ops (CPUAdam, shm_comm) include Python.h. Install python3.X-dev (libpython3.X-dev) in the image."),
    ("op_not_prebuilt",
     r"Unable to JIT load the (\w+) op|not prebuilt into the image",
     "A DeepSpeed op the image should ship prebuilt is being JIT-built at run time: build the image's ops "
     "stage with DS_BUILD_<OP>=1 and DS_ACCELERATOR=cuda, and check installed_ops."),
    ("compiler_missing",
     r"(?<![\w+-])(c\+\+|g\+\+|gcc|cc|x86_64-linux-gnu-g\+\+): (not found|command not found)|"
     r"No such file or directory: '(c\+\+|g\+\+|gcc)'|Failed to find C compiler",
     "A C/C++ compiler is needed at run time (DeepSpeed JIT ops, e.g. shm_comm on CPU; Triton's "
     "launcher) but none is on PATH: install g++ in the image or prebuild the op."),
    ("cuda_home_missing",
     r"CUDA_HOME does not exist|CUDA_HOME environment variable is not set",
     "An op is being JIT-compiled with nvcc but the image has no CUDA toolkit (runtime image). "
     "Prebuild the op (DS_BUILD_*=1 with TORCH_CUDA_ARCH_LIST) in a devel stage."),
    ("cuda_version_mismatch",
     r"Installed CUDA version \S+ does not match the version torch was compiled with|"
     r"detected CUDA version \(\S+\) mismatches the version that was used to compile PyTorch",
     "The CUDA toolkit (nvcc) in the image differs from torch's CUDA; extensions built with it "
     "will not load. Build against the toolkit matching torch.version.cuda."),
    ("undefined_symbol",
     r"undefined symbol: (\w+)",
     "A compiled extension does not match the torch it is loaded into (C++ ABI, or torch was "
     "replaced by a later pip install, e.g. ncclCommResume). Rebuild/reinstall it against the "
     "pinned torch and re-check torch after every install step."),
    ("shm_too_small",
     r"No space left on device.*shm|/dev/shm.*No space left|unable to allocate shared memory|"
     r"Error while creating shared memory segment|bus error \(core dumped\)|Bus error",
     "/dev/shm is too small (Docker's default is 64 MB): run with `--shm-size=8g` or `--ipc=host`."),
    ("collective_timeout",
     r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout|"
     r"DistNetworkError|Timed out (initializing|waiting)",
     "A collective or the rendezvous timed out: a rank died or hangs, or the ranks cannot reach "
     "each other (interfaces, firewall, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)."),
    ("port_in_use",
     r"Address already in use|EADDRINUSE",
     "The rendezvous port is taken; rerun (a fresh port is chosen each run)."),
    ("cuda_oom",
     r"CUDA out of memory|OutOfMemoryError",
     "GPU out of memory: another process holds the GPU, or the GPU is too small."),
    ("exit_abort",
     r"terminate called without an active exception",
     "A rank was ended by std::terminate from a C++ thread. Seen on CPU at interpreter exit, after the rank's work "
     "and destroy_process_group(): a gloo worker thread freeing tensors while Python finalizes "
     "(pytorch/pytorch#190489, docs/training.md). If the rank's work was done, the job still exited non-zero."),
]

_COMPILED = [(sid, re.compile(rx, re.IGNORECASE if sid in ("shm_too_small",) else 0), text)
             for sid, rx, text in SIGNATURES]


def diagnose(text):
    """Return [{"id", "explanation", "evidence"}] for every signature found in text.

    evidence is the (trimmed) line that matched, so a reader sees the raw cause too.
    Each signature is reported once.
    """
    if not text:
        return []
    found = []
    for sid, rx, expl in _COMPILED:
        m = rx.search(text)
        if not m:
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        line = text[start:end if end != -1 else len(text)].strip()
        found.append({"id": sid, "explanation": expl, "evidence": line[:300]})
    # NCCL's own failure lines (smoke/data/nccl_failures.json, each row with its source); a line one of the
    # signatures above already explained is not explained twice.
    from smoke import ncclfail

    seen = {d["evidence"] for d in found}
    for row in ncclfail.explain(text):
        if row["line"] not in seen:
            found.append({"id": "nccl_" + row["id"], "evidence": row["line"],
                          "explanation": "{} Check: {} (source: {})".format(row["cause"], row["check"],
                                                                            row["source"][0])})
    return found


def explain(text):
    """Diagnosis as short strings "id: explanation [evidence]" for reports."""
    return ["{}: {} [{}]".format(d["id"], d["explanation"], d["evidence"]) for d in diagnose(text)]
