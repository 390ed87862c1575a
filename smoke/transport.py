"""Which interconnect NCCL used between nodes, and why, from every signal a log and the host carry (pure).

The verdict is one of
  rdma         between nodes over InfiniBand, RoCE or EFA;
  fallback     between nodes over TCP sockets although the host has a faster fabric: 2-40x slower, no error.
               The reason is the signal that shows it (NCCL_IB_DISABLE=1, no libibverbs, a device the container
               cannot open, IPoIB under the sockets, libfabric's tcp provider on EFA, no aws-ofi-nccl), with the fix;
  socket-only  between nodes over TCP on a host with nothing faster (no RDMA device in the log or on the host);
  single-node  no channel crosses nodes (NICs listed at init are not used by a one-node job);
  unknown      the log shows too little to tell.
Host facts (`host_facts()`, read inside the container: /sys/class/infiniband, IPoIB interfaces, /dev/infiniband,
`ulimit -l`) complete what a log cannot show: a log of a job whose NCCL found no device is silent about devices.
"""

import os

from smoke import nccllog

_TCP_PROVIDERS = ("tcp", "sockets", "udp", "shm")
# How EFA devices are named in /sys/class/infiniband on AWS (`rdmap16s27`; `efa_0` in some AMIs and in users' notes).
_EFA_NAMES = ("efa", "rdmap")


def is_efa(name):
    return str(name).lower().startswith(_EFA_NAMES)


def _fabric(name, roce, providers=()):
    """Our name for a NCCL network: IB, RoCE, EFA (OFI/libfabric plugin), Socket, or the raw name."""
    low = name.lower()
    if low.startswith("ib"):  # IB, IBext, IBext_v8: NCCL's verbs transport, IB or RoCE by link layer
        return "RoCE" if roce else "IB"
    if "libfabric" in low or low.startswith("ofi"):
        # libfabric over its tcp provider is sockets with extra steps: EFA only with the efa provider
        return "Socket" if providers and all(p in _TCP_PROVIDERS for p in providers) else "EFA"
    if low.startswith("socket"):
        return "Socket"
    return name


def diagnose(log, rdma_devices=(), host=None, expected_nodes=None):
    """Judge NCCL's inter-node transport from `log` (NCCL_DEBUG=INFO text) and what is known of the host.

    rdma_devices: RDMA device names this host has (e.g. from /sys/class/infiniband), besides any the log names.
    host: host_facts() of the host the log came from (None: unknown). expected_nodes: the nodes the job was
    started on, where known. Returns {"verdict", "fabric": "IB"|"RoCE"|"EFA"|"Socket"|None, "channels",
    "network", "rdma_devices", "intra", "nodes", "evidence": [..], "reason", "fix", "ok", "line"}.
    """
    sig = nccllog.read(log)
    host = dict(host or {})
    if any(is_efa(d) for d in rdma_devices):  # a device list handed over names EFA the way the kernel does
        host["efa"] = True
    roce = any(kind == "RoCE" for _, kind in sig["ib_ports"])
    providers = sig["providers"]
    channels = {}
    for name, count in sig["channels"].items():
        f = _fabric(name, roce, providers)
        channels[f] = channels.get(f, 0) + count
    network = sig["network"][0] if sig["network"] else None
    devs = set(rdma_devices) | {d["name"] for d in host.get("rdma", ())} | {d for d, _ in sig["ib_ports"]}
    if "efa" in providers or host.get("efa"):
        devs.add("efa")
    devs = sorted(devs)
    nodes = _nodes(sig, channels)
    evidence = _evidence(sig, host, devs)
    fabric = max(channels, key=channels.get) if channels else None
    if fabric is None and network:
        fabric = _fabric(network, roce, providers)  # no channel connected across nodes yet: the network chosen
    verdict, reason, fix = _verdict(sig, host, fabric, nodes, devs, evidence, expected_nodes)
    # One node where several were meant is the job's failure (two single-node jobs train apart, silently).
    ok = verdict in ("rdma", "socket-only", "unknown") or (verdict == "single-node" and not (expected_nodes or 0) > 1)
    line = _line(verdict, fabric, devs, sig, reason, fix)
    return {"verdict": verdict, "fabric": fabric if nodes != 1 else None, "network": network, "channels": channels,
            "rdma_devices": devs, "intra": sig["intra"], "nodes": nodes, "hosts": sig["hosts"],
            "evidence": evidence, "reason": reason, "fix": fix, "ok": ok, "line": line, "signals": sig}


def _nodes(sig, channels):
    """How many nodes the communicator spans: NCCL's own nNodes, else ranks beyond the local ones, else net
    channels or lines from several hosts (2+), else 1 when channels connected only within the node and no
    connection to another host failed, else None (unknown)."""
    if sig["nnodes"]:
        return max(sig["nnodes"])
    if sig["local_ranks"] and sig["nranks"] and max(sig["nranks"]) > max(sig["local_ranks"]):
        return -(-max(sig["nranks"]) // max(sig["local_ranks"]))
    if channels or len(sig["hosts"]) > 1:
        return 2 if len(sig["hosts"]) <= 2 else len(sig["hosts"])
    if sig["intra"] and not sig["remote_trouble"]:
        return 1  # channels connected, none over a network, and no failed connection to another host
    return None


def _evidence(sig, host, devs):
    """[(signal, what it shows, kind)]: kind "hardware" (a fabric faster than TCP is there), "disabled" (the job's
    environment keeps NCCL from it) or "blocker" (the image could not use one if it were there). Without
    hardware or disabled entries nothing says the host has anything but Ethernet."""
    ev = []
    env = sig["env"]
    if env.get("NCCL_IB_DISABLE") == "1":
        ev.append(("NCCL_IB_DISABLE=1", "set by the environment: NCCL may not use InfiniBand or RoCE", "disabled"))
    if env.get("NCCL_NET", "").strip("'\"").lower() == "socket":
        ev.append(("NCCL_NET=Socket", "set by the environment: NCCL may use sockets only", "disabled"))
    if sig["ib_open_failed"]:
        ev.append(("ibv_open_device failed", "an RDMA device exists but this process cannot open it", "hardware"))
    if sig["ipoib_ifaces"]:
        ev.append(("IPoIB " + ", ".join(sig["ipoib_ifaces"]),
                   "the sockets run over an InfiniBand interface: the host has an InfiniBand fabric", "hardware"))
    if any(p in _TCP_PROVIDERS for p in sig["providers"]):
        ev.append(("libfabric provider " + ",".join(sig["providers"]),
                   "aws-ofi-nccl (an EFA image) chose a TCP provider, not efa", "hardware"))
    if sig["ib_ports"]:
        ev.append(("NET/IB devices " + ", ".join(d for d, _ in sig["ib_ports"]), "NCCL listed RDMA ports", "hardware"))
    if host.get("efa") and (sig["plugin_missing"] or not sig["ofi"]):
        ev.append(("EFA without aws-ofi-nccl", "the host has EFA devices but NCCL loaded no libfabric plugin",
                   "hardware"))
    elif devs and not sig["ib_ports"]:
        ev.append(("RDMA devices " + ", ".join(devs), "the host has RDMA devices", "hardware"))
    for name in host.get("ipoib", ()):
        if name not in sig["ipoib_ifaces"]:
            ev.append((f"IPoIB {name}", "the host has an InfiniBand interface", "hardware"))
    if sig["verbs_missing"]:
        ev.append(("no libibverbs", "NCCL could not load libibverbs: this image cannot use InfiniBand or RoCE",
                   "blocker"))
    return ev


def _verdict(sig, host, fabric, nodes, devs, evidence, expected_nodes):
    """(verdict, reason, fix)."""
    kept = [e for e in evidence if e[2] in ("hardware", "disabled")]
    if nodes == 1:
        if expected_nodes and expected_nodes > 1:
            return ("single-node", f"NCCL's communicator spans one node, {expected_nodes} were expected",
                    "start every node with the same --nnodes, --master-addr/--rdzv-endpoint and rendezvous id")
        return "single-node", "no channel crosses nodes", ""
    if fabric in ("IB", "RoCE", "EFA"):
        return "rdma", "" if nodes else "no channel line shows the job crossing nodes", ""
    if fabric is None and nodes is None and not kept:
        if sig["nccl_lines"]:
            return "unknown", "no network or channel line: NCCL stopped before it chose a network (see the failures)", \
                "the failures below first; then NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET for the transport"
        return "unknown", "no network, channel or communicator line", \
            "run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and hand over the whole log"
    # sockets between nodes (or a network not named): is there anything faster the job was kept from?
    if not kept:
        blocker = next((e for e in evidence if e[2] == "blocker"), None)
        return ("socket-only", "no RDMA device in the log or on the host",
                f"{blocker[1]}: where the host has InfiniBand or RoCE, install rdma-core in the image"
                if blocker else "")
    return ("fallback",) + _cause(sig, host, devs)


def _cause(sig, host, devs):
    """The first signal that explains the fallback, most specific first, with its fix."""
    env = sig["env"]
    if env.get("NCCL_IB_DISABLE") == "1":
        return "NCCL_IB_DISABLE=1 in the environment", "unset NCCL_IB_DISABLE (and NCCL_NET) in the job's environment"
    if env.get("NCCL_NET", "").strip("'\"").lower() == "socket":
        return "NCCL_NET=Socket in the environment", "unset NCCL_NET, or set it to IB / 'AWS Libfabric'"
    if any(p in _TCP_PROVIDERS for p in sig["providers"]) or (host.get("efa") and sig["ofi"]):
        return ("aws-ofi-nccl runs over libfabric's {} provider, not efa".format(",".join(sig["providers"]) or "tcp"),
                "pass the EFA devices into the container (/dev/infiniband/uverbs*, EKS: vpc.amazonaws.com/efa), "
                "unset FI_PROVIDER, and check `fi_info -p efa` inside it")
    if host.get("efa") or ("efa" in devs and sig["plugin_missing"]):
        return ("the host has EFA but NCCL found no net plugin (libnccl-net.so)",
                "an image with aws-ofi-nccl on the loader path (this project's EFA images), or LD_LIBRARY_PATH to it")
    if sig["verbs_missing"]:
        return ("NCCL could not load libibverbs", "install rdma-core's libibverbs1, ibverbs-providers and librdmacm1 "
                "in the image (this project's images carry them)")
    if sig["ib_open_failed"]:
        return ("the container cannot open the RDMA device",
                "docker run --device=/dev/infiniband --ulimit memlock=-1 (Kubernetes: the RDMA device plugin)")
    if sig["ipoib_ifaces"] or host.get("ipoib"):
        names = ", ".join(sig["ipoib_ifaces"] or host.get("ipoib"))
        return (f"InfiniBand is there (IPoIB {names}) but NCCL found no RDMA device in the container",
                "pass /dev/infiniband into the container (--device=/dev/infiniband, --ulimit memlock=-1) and "
                "check the image loads libibverbs")
    if sig["ib_none"] and devs:
        return ("the host has RDMA devices ({}) but NCCL found none in the container (NET/IB : No device found)"
                .format(", ".join(devs)),
                "pass them in (--device=/dev/infiniband --ulimit memlock=-1; Kubernetes: the RDMA device plugin) and "
                "check the image has libibverbs1 and ibverbs-providers (the NIC's user-space driver)")
    return ("RDMA devices exist ({}) but NCCL connected the nodes over sockets".format(", ".join(devs) or "listed"),
            "check the image has libibverbs1/ibverbs-providers/librdmacm1 (EFA: libfabric + aws-ofi-nccl), "
            "the container sees /dev/infiniband, and NCCL_IB_DISABLE/NCCL_NET are unset")


def _line(verdict, fabric, devs, sig, reason, fix):
    if verdict == "rdma":
        return (f"between nodes via {fabric}" + (f" ({', '.join(devs)})" if devs else "")
                + (f"; {reason}" if reason else ""))
    if verdict == "single-node":
        head = "no inter-node channel (one node): " + (", ".join(sig["intra"]) or "no channel lines")
        return head + (f"; {reason}: {fix}" if fix else "")
    if verdict == "socket-only":
        return ("between nodes via sockets (TCP); no RDMA device on this host, so nothing faster to use"
                + (f" (but {fix})" if fix else ""))
    if verdict == "unknown":
        return f"cannot tell: {reason}; {fix}"
    return f"NCCL fell back to TCP sockets between nodes: {reason}. Fix: {fix}"


def host_facts(sys_root="/sys", dev_root="/dev"):
    """What this container sees of the fabric: RDMA devices (name, driver, link layer per port, RoCE v2 GIDs),
    whether any is EFA, IPoIB interfaces, the uverbs device files, and the locked-memory limit (KiB, None:
    unlimited). Read inside the container: what the job can use, not what the host has."""
    import resource

    rdma = []
    base = os.path.join(sys_root, "class", "infiniband")
    for name in _listdir(base):
        dev = os.path.join(base, name)
        driver = os.path.basename(os.path.realpath(os.path.join(dev, "device", "driver")))
        ports = {}
        for port in _listdir(os.path.join(dev, "ports")):
            layer = _read(os.path.join(dev, "ports", port, "link_layer"))
            types = os.path.join(dev, "ports", port, "gid_attrs", "types")
            v2 = any(_read(os.path.join(types, g)) == "RoCE v2" for g in _listdir(types))
            ports[port] = {"link_layer": layer, "roce_v2_gid": v2}
        rdma.append({"name": name, "driver": driver, "ports": ports})
    ipoib = [n for n in _listdir(os.path.join(sys_root, "class", "net"))
             if _read(os.path.join(sys_root, "class", "net", n, "type")) == "32"]  # ARPHRD_INFINIBAND
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {"rdma": rdma, "efa": any(d["driver"] == "efa" or is_efa(d["name"]) for d in rdma),
            "ipoib": sorted(ipoib), "uverbs": sorted(n for n in _listdir(os.path.join(dev_root, "infiniband"))
                                                     if n.startswith("uverbs")),
            "memlock_kib": None if soft == resource.RLIM_INFINITY else soft // 1024}


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


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
