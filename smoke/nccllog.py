"""Every signal an NCCL_DEBUG=INFO log carries about the network NCCL chose and why (a pure function).

NCCL states its choice in pieces spread over a log, each missing in some versions or cut out of what users paste:
the net plugin (`NET/Plugin : No plugin found (libnccl-net.so)`, `Loaded net plugin …`), each transport's device
list (`NET/IB : Using [0]mlx5_0:1/RoCE`, `NET/IB : No device found.`, `NET/Socket : Using [0]ib0:…`, `NET/OFI
Selected Provider is efa`), the environment it was given (`NCCL_IB_DISABLE set by environment to 1.`), the
network it picked (`Using network IB`), the communicator's shape (`comm … nRanks 16 nNodes 2 localRanks 8`) and
each connected channel (`… [send] via NET/IB/0/GDRDMA`, `via P2P/IPC`, `via SHM/direct/direct`). `read` collects
them all; smoke/transport.py judges them.
"""

import re

# `host:pid:tid [dev] NCCL INFO …` anywhere on the line (launchers prefix `[1,3]<stdout>:`, times, colours).
_PREFIX = re.compile(r"(?:^|[\s>\]:])([A-Za-z0-9][\w.-]*):(\d+):(\d+) \[\d+\] (?:[\w/.]+:\d+ )?NCCL (?:INFO|WARN)",
                     re.M)
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_ENV = re.compile(r"\b((?:NCCL|FI|OFI_NCCL)_[A-Z0-9_]+) set by environment to ([^\s.][^\s]*?)\.?\s*$", re.M)
_NETWORK = re.compile(r"Using network ([\w ]+?)\s*$", re.M)
_CHANNEL = re.compile(r"via NET/([A-Za-z][\w ]*?)(?:/\d|\s*$)", re.M)
_INTRA = re.compile(r"via (P2P/direct pointer|P2P/[\w/]+|SHM[\w/]*|NVLS|direct shared memory|CollNet[\w/]*)")
_IB_USING = re.compile(r"NET/IB\w* ?: Using ((?:\[\d+\]\S+?:\d+/(?:IB|RoCE)\S*\s*)+)", re.M)
_IB_PORT = re.compile(r"\[\d+\](\S+?):\d+/(IB|RoCE)")
_SOCK_USING = re.compile(r"(?:NET/Socket|Bootstrap) ?: Using ((?:\[\d+\])?\S+?:\S+?<\d+>(?:\s+\[\d+\]\S+?:\S+?<\d+>)*)")
_IFACE = re.compile(r"(?:\[\d+\])?([\w.@-]+?):[\w.:%\[\]-]+<\d+>")
_PROVIDER = re.compile(r"Selected [Pp]rovider is (\w+)")
_SHAPE_NEW = re.compile(r"\bnRanks (\d+) nNodes (\d+)(?: localRanks (\d+))?")
_NRANKS = re.compile(r"\bcomm 0x[0-9a-f]+ rank \d+ nranks (\d+)\b")
_COMM_ID = re.compile(r"commId (0x[0-9a-f]+)")
_PLUGIN_MISSING = re.compile(r"NET/Plugin ?: ?(?:No plugin found|Plugin load \(?libnccl-net\S*\)? returned|"
                             r"Could not find:? libnccl-net|dlerror=libnccl-net\S*: cannot open)|"
                             r"Plugin load returned \d+ : libnccl-net")
_PLUGIN_LOADED = re.compile(r"(?:NET/Plugin ?: ?Loaded net plugin|Loaded net plugin) ([\w ]+?)(?: \(v\d+\))?\s*$|"
                            r"NET/OFI Initializing (aws-ofi-nccl)|Initializing (aws-ofi-nccl)", re.M)
# IPoIB interfaces: the kernel's `ib0`, systemd's predictable `ibp12s0` / `ibs3` / `ibP…` names.
IPOIB = re.compile(r"^ib(?:\d|p\d|s\d|P\d)")


def read(log):
    """The signals in `log` (text). Values are what the log says; nothing is inferred here."""
    hosts = sorted({m.group(1) for m in _PREFIX.finditer(log)})
    env = {}
    for m in _ENV.finditer(log):
        env[m.group(1)] = m.group(2)
    ib_ports = []
    for m in _IB_USING.finditer(log):
        for dev, kind in _IB_PORT.findall(m.group(1)):
            if (dev, kind) not in ib_ports:
                ib_ports.append((dev, kind))
    socket_ifaces = []
    for m in _SOCK_USING.finditer(log):
        for name in _IFACE.findall(m.group(1)):
            if name not in socket_ifaces:
                socket_ifaces.append(name)
    channels = {}
    for m in _CHANNEL.finditer(log):
        name = m.group(1).strip()
        channels[name] = channels.get(name, 0) + 1
    shapes = [(int(r), int(n), int(lr) if lr else None) for r, n, lr in _SHAPE_NEW.findall(log)]
    nranks = sorted({int(n) for n in _NRANKS.findall(log)} | {r for r, _, _ in shapes})
    plugins = [next(g for g in m.groups() if g) for m in _PLUGIN_LOADED.finditer(log)]
    versions = sorted(set(_VERSION.findall(log)))
    return {
        "hosts": hosts,
        "versions": versions,
        "env": env,
        "network": [n.strip() for n in _NETWORK.findall(log)],
        "channels": channels,
        "intra": sorted({"/".join(m.group(1).split("/")[:2]) for m in _INTRA.finditer(log)}),
        "ib_ports": ib_ports,
        "ib_none": bool(re.search(r"NET/IB\w* ?: No device found", log)),
        "ib_open_failed": bool(re.search(r"Call to ibv_open_device failed|NET/IB\w* : Unable to open device", log)),
        "verbs_missing": bool(re.search(r"Failed to open libibverbs|libibverbs\.so(?:\.1)?: cannot open shared", log)),
        "socket_ifaces": socket_ifaces,
        "ipoib_ifaces": [i for i in socket_ifaces if IPOIB.match(i)],
        "providers": sorted(set(_PROVIDER.findall(log))),
        "ofi": bool(re.search(r"NET/OFI|aws-ofi-nccl", log)),
        "plugin_missing": bool(_PLUGIN_MISSING.search(log)),
        "plugins": sorted(set(plugins)),
        "nnodes": sorted({n for _, n, _ in shapes}),
        "nranks": nranks,
        "local_ranks": sorted({lr for _, _, lr in shapes if lr}),
        "comm_ids": sorted(set(_COMM_ID.findall(log))),
        "nccl_lines": len(re.findall(r"NCCL (?:INFO|WARN)", log)),
        # a connection to another address that failed or was closed: channels may be missing for that reason
        "remote_trouble": bool(re.search(r"Connect to \S+ failed|closed by remote peer|socketStartConnect|"
                                         r"Call to connect (?:failed|returned)", log)),
    }
