"""What this host offers a GPU gate: its GPUs and driver (nvidia-smi, else NVML) and the NVIDIA runtime."""

from __future__ import annotations

import shutil
import socket

from builder.boundary import process
from builder.errors import EnvironmentProblem


def parse_nvidia_smi(text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"driver": parts[0], "name": parts[1], "memory_mb": parts[2]})
    return gpus


def gpus() -> tuple[list[dict], str]:
    """(GPUs, how we know). nvidia-smi first; NVML through pynvml when only the library is there."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            query = ["--query-gpu=driver_version,name,memory.total", "--format=csv,noheader,nounits"]
            proc = process.run([smi, *query], timeout=60, echo=False)
            if proc.returncode == 0:
                return parse_nvidia_smi(proc.stdout), "nvidia-smi"
            return [], f"nvidia-smi failed: {(proc.stderr or proc.stdout).strip()[:160]}"
        except EnvironmentProblem as exc:
            return [], f"nvidia-smi failed: {exc.message}"
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        gpus = [{"driver": driver, "name": str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))),
                 "memory_mb": ""} for i in range(pynvml.nvmlDeviceGetCount())]
        return gpus, "NVML"
    except Exception:  # noqa: BLE001 - no library, no driver: both mean "no GPU here"
        return [], "no nvidia-smi and no NVML on this host"


def nvidia_runtime(engine_info: dict) -> bool:
    """Can containers get GPUs here: an `nvidia` runtime in the engine, or the container toolkit's hook."""
    return "nvidia" in (engine_info.get("Runtimes") or {}) or bool(shutil.which("nvidia-container-runtime-hook"))


def name() -> str:
    """This machine's host name (a local run's provenance names it)."""
    return socket.gethostname()


def fabric() -> dict:
    """What this host offers between nodes: RDMA devices with driver and link layer, RoCE v2 GIDs, IPoIB
    interfaces, /dev/infiniband's uverbs files, this shell's locked-memory limit (smoke/transport.py reads them
    the same way inside the gate's containers)."""
    from smoke import transport

    return transport.host_facts()
