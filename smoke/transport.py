"""Which interconnect NCCL used between nodes, read from NCCL_DEBUG=INFO output (a pure function).

NCCL names its network in three places: the plugin/device line ("NET/IB : Using [0]mlx5_0:1/IB",
".../RoCE", "NET/OFI Selected Provider is efa", "NET/Socket : Using [0]eth0"), the chosen network
("Using network IB|Socket|Libfabric|AWS Libfabric") and each connected channel ("via NET/IB/0/GDRDMA",
"via NET/Socket/1", "via NET/AWS Libfabric/0").  A run whose inter-node channels go over sockets
while the host has RDMA devices (IB, RoCE, EFA) is the silent TCP fallback: 2-40x slower, no error.
"""

import os
import re

_CHANNEL = re.compile(r"via NET/([A-Za-z][\w ]*?)(?:/\d|\s*$)", re.M)  # names may hold spaces
_NETWORK = re.compile(r"Using network ([\w ]+?)\s*$", re.M)
_IB_PORT = re.compile(r"NET/IB : Using (\[\d+\]\S+?:\d+/(IB|RoCE).*?)(?:;|$)", re.M)
_DEV = re.compile(r"\](\w+):\d+/")
_INTRA = re.compile(r"via (P2P/direct pointer|P2P/[\w/]+|SHM[\w/]*|NVLS)")

HINT = ("NCCL fell back to TCP sockets between nodes although RDMA devices exist ({devs}): "
        "check the image has libibverbs1/ibverbs-providers/librdmacm1 (EFA: libfabric + aws-ofi-nccl), "
        "the pod/container sees /dev/infiniband (--device, rdma device plugin), and NCCL_IB_DISABLE/NCCL_NET are unset")


def _fabric(name, roce):
    """Our name for a NCCL network: IB, RoCE, EFA (OFI/libfabric plugin), Socket, or the raw name."""
    low = name.lower()
    if low.startswith("ib"):  # IB, IBext, IBext_v8: NCCL's verbs transport, IB or RoCE by link layer
        return "RoCE" if roce else "IB"
    if "libfabric" in low or low.startswith("ofi"):
        return "EFA"
    if low.startswith("socket"):
        return "Socket"
    return name


def diagnose(log, rdma_devices=()):
    """Summarise NCCL's inter-node transport.

    rdma_devices: RDMA device names this host has (e.g. from /sys/class/infiniband), besides any the log names.
    Returns {"fabric": "IB"|"RoCE"|"EFA"|"Socket"|None (no net channel: one node),
             "channels": {fabric: count}, "network": str|None, "rdma_devices": [..], "intra": [..],
             "ok": bool, "line": one-line verdict}.
    """
    ib_ports = _IB_PORT.findall(log)
    roce = any(kind == "RoCE" for _, kind in ib_ports)
    channels = {}
    for m in _CHANNEL.finditer(log):
        f = _fabric(m.group(1).strip(), roce)
        channels[f] = channels.get(f, 0) + 1
    nets = [n.strip() for n in _NETWORK.findall(log)]
    network = nets[0] if nets else None
    devs = set(rdma_devices) | {d for p, _ in ib_ports for d in _DEV.findall(p)}
    if "Selected Provider is efa" in log:
        devs.add("efa")
    devs = sorted(devs)
    intra = sorted({"/".join(m.group(1).split("/")[:2]) for m in _INTRA.finditer(log)})
    fabric = max(channels, key=channels.get) if channels else None
    if fabric is None and network:
        fabric = _fabric(network, roce)  # no channel connected across nodes yet: the network NCCL chose
    ok, line = _verdict(fabric, channels, devs, intra)
    return {"fabric": fabric, "channels": channels, "network": network, "rdma_devices": devs,
            "intra": intra, "ok": ok, "line": line}


def _verdict(fabric, channels, devs, intra):
    if (fabric == "Socket" or channels.get("Socket")) and devs:
        return False, HINT.format(devs=", ".join(devs))
    if fabric is None:
        return True, "no inter-node channel (one node): " + (", ".join(intra) or "no channel lines")
    if fabric == "Socket":
        return True, "between nodes via sockets (TCP); no RDMA device on this host, so nothing faster to use"
    return True, f"between nodes via {fabric}" + (f" ({', '.join(devs)})" if devs else "")


def rdma_devices(root="/sys/class/infiniband"):
    """RDMA devices the kernel exposes to this container (IB, RoCE and EFA all appear here)."""
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


# What NCCL dlopens for its IB/RoCE transport (ibvwrap: libibverbs.so, then .so.1; the providers plug into it).
VERBS_LIBS = ("libibverbs.so.1", "librdmacm.so.1")


def loadable_transports(load=None, devices=None):
    """(transports NCCL can use here, missing libraries): sockets always; IB verbs when rdma-core loads.
    Needs no GPU: it is what the image carries, judged before any node is joined."""
    import ctypes

    load = load or ctypes.CDLL
    missing = []
    for name in VERBS_LIBS:
        try:
            load(name)
        except OSError:
            missing.append(name)
    found = ["sockets"] + ([] if missing else ["IB verbs (IB/RoCE)"])
    return found, missing, rdma_devices() if devices is None else devices
