"""`builder diagnose-nccl` and the gate's NCCL judgment: the transport verdict from every signal, and the failure table.

The logs under data/nccl_logs/ are excerpts of real reports, each naming its source; the cases built here from
NCCL's line formats say so.
"""

import json
import re

import pytest

from smoke import ncclfail, nccllog, signatures, transport
from tests.conftest import run_cli
from tests.unit.test_nccl_transport import DATA, load

# (log, verdict, fabric, failures found in it, causes first)
REAL = [
    ("ib_gdrdma.log", "rdma", "IB", []),
    ("roce.log", "rdma", "RoCE", []),
    ("efa_ofi_channels.log", "rdma", "EFA", []),
    ("efa_p5en.log", "rdma", "EFA", []),
    ("nvlink_single_node.log", "single-node", None, []),
    ("socket_channels_no_ib.log", "socket-only", "Socket", []),
    ("socket_network_no_ib.log", "socket-only", "Socket", []),
    ("ib_disabled_refused.log", "fallback", "Socket", ["socket_connect"]),
    ("roce_open_failed_container.log", "fallback", "Socket", ["ib_open_device"]),
    ("verbs_missing_aws.log", "socket-only", "Socket", ["verbs_missing"]),
    ("socket_timeout_no_ib.log", "socket-only", "Socket", ["socket_connect"]),
    ("ipoib_create_qp.log", "rdma", "IB", ["ib_memlock"]),
    ("roce_modify_qp.log", "rdma", "RoCE", ["ib_modify_qp"]),
    ("family_zero.log", "socket-only", "Socket", ["socket_family"]),
    ("duplicate_gpu.log", "unknown", None, ["duplicate_gpu"]),
    ("shm_fallocate.log", "single-node", None, ["shm_exhausted"]),
    ("connect_abort_followon.log", "unknown", None, ["socket_connect", "peer_closed"]),
    ("memlock_reg_mr.log", "unknown", None, ["ib_memlock"]),
]


@pytest.mark.parametrize("name, verdict, fabric, failures", REAL, ids=[r[0] for r in REAL])
def test_real_logs_get_their_verdict_fabric_and_failures(name, verdict, fabric, failures):
    log = load(name)
    d = transport.diagnose(log)
    assert (d["verdict"], d["fabric"]) == (verdict, fabric), d["line"]
    assert d["ok"] is (verdict != "fallback") and "\n" not in d["line"]
    assert [f["id"] for f in ncclfail.explain(log)] == failures


def test_every_fixture_is_in_the_table():
    assert sorted(p.name for p in DATA.glob("*.log")) == sorted(r[0] for r in REAL)


def test_a_fallback_names_its_cause_and_the_fix():
    d = transport.diagnose(load("ib_disabled_refused.log"))
    assert d["reason"] == "NCCL_IB_DISABLE=1 in the environment" and "unset NCCL_IB_DISABLE" in d["fix"]
    d = transport.diagnose(load("roce_open_failed_container.log"))
    assert "cannot open the RDMA device" in d["reason"] and "--device=/dev/infiniband" in d["fix"]


def test_without_libibverbs_sockets_are_not_called_a_fallback_unless_something_shows_a_fabric():
    """An AWS node without EFA (ens5) whose image lacks rdma-core: nothing shows a faster fabric, so it is
    socket-only, with what the image would lack on a host that has one. With the host's mlx5 named: fallback."""
    log = load("verbs_missing_aws.log")
    d = transport.diagnose(log)
    assert d["verdict"] == "socket-only" and "libibverbs" in d["line"]
    d = transport.diagnose(log, rdma_devices=["mlx5_0"])
    assert d["verdict"] == "fallback" and d["reason"] == "NCCL could not load libibverbs"


# Built from NCCL's line formats (init.cc, net_ib.cc, net_socket.cc, aws-ofi-nccl): the signals the issue's
# held-out logs carry, one at a time.
def _lines(host, *body):
    return "".join(f"{host}:100:200 [0] NCCL INFO {b}\n" for b in body)


def test_sockets_over_an_ipoib_interface_are_a_fallback():
    log = _lines("gpu-a", "NET/IB : No device found.", "NET/Socket : Using [0]ibp12s0:10.0.0.1<0>",
                 "Using network Socket", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0")
    d = transport.diagnose(log)
    assert d["verdict"] == "fallback" and "IPoIB ibp12s0" in d["reason"]


def test_libfabric_over_tcp_on_an_efa_image_is_a_fallback_not_efa():
    log = _lines("ip-10-0-0-1", "NET/OFI Initializing aws-ofi-nccl 1.13.2", "NET/OFI Selected Provider is tcp",
                 "Using network AWS Libfabric", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0")
    d = transport.diagnose(log)
    assert (d["verdict"], d["fabric"]) == ("fallback", "Socket") and "tcp provider" in d["reason"]


def test_an_efa_host_without_the_plugin_is_a_fallback_from_the_host_facts():
    log = _lines("ip-10-0-0-1", "NET/Plugin : No plugin found (libnccl-net.so)", "NET/IB : No device found.",
                 "NET/Socket : Using [0]ens32:10.0.0.1<0>", "Using network Socket",
                 "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0")
    assert transport.diagnose(log)["verdict"] == "socket-only"
    host = {"rdma": [{"name": "rdmap16s27", "driver": "efa", "ports": {}}], "efa": True, "ipoib": []}
    d = transport.diagnose(log, host=host)
    assert d["verdict"] == "fallback" and "no net plugin" in d["reason"] and "aws-ofi-nccl" in d["fix"]


@pytest.mark.parametrize("device", ["rdmap16s27", "efa_0"])
def test_an_efa_device_named_by_the_user_makes_a_missing_plugin_the_cause(device):
    """The host's device list handed over with the log (`--rdma-device`): EFA by the kernel's names for it."""
    log = _lines("ip-10-0-0-1", "NET/Plugin : No plugin found (libnccl-net.so)", "NET/IB : No device found.",
                 "NET/Socket : Using [0]ens32:10.0.0.1<0>", "Using network Socket",
                 "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0")
    d = transport.diagnose(log, rdma_devices=[device])
    assert d["verdict"] == "fallback" and "no net plugin" in d["reason"]
    mlx = transport.diagnose(log, rdma_devices=["mlx5_0"])
    assert mlx["reason"].startswith("the host has RDMA devices (mlx5_0) but NCCL found none in the container")


def test_a_single_node_job_that_lists_roce_nics_is_single_node_not_between_nodes():
    log = _lines("dgx-1", "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>",
                 "Using network IB", "comm 0x55d0 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0",
                 "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
    d = transport.diagnose(log)
    assert (d["verdict"], d["fabric"], d["nodes"]) == ("single-node", None, 1)
    assert "via RoCE" not in d["line"]


def test_two_nodes_that_each_ran_their_own_job_are_explained():
    log = (_lines("node-a", "comm 0x1 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0",
                  "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
           + _lines("node-b", "comm 0x2 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0",
                    "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"))
    (apart,) = ncclfail.explain(log)
    assert apart["id"] == "separate_single_node_jobs" and "node-a, node-b" in apart["cause"]
    assert "--nnodes" in apart["check"]
    one = _lines("node-a", "comm 0x1 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0")
    assert ncclfail.explain(one) == []  # one host, nothing expected: a single-node job is fine
    d = transport.diagnose(one, expected_nodes=2)
    assert d["verdict"] == "single-node" and d["ok"] is False and "2 were expected" in d["line"]
    assert [f["id"] for f in ncclfail.explain(one, expected_nodes=2)] == ["separate_single_node_jobs"]


def test_nodes_come_from_nccl_s_own_communicator_line_first():
    sig = nccllog.read(_lines("h", "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0"))
    assert (sig["nnodes"], sig["nranks"], sig["local_ranks"]) == ([2], [16], [8])
    assert transport.diagnose(_lines("h", "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
                                     "Using network IB", "NET/IB : Using [0]mlx5_0:1/IB"))["verdict"] == "rdma"


def test_every_row_has_a_source_and_matches_its_own_examples_and_no_other_rows():
    rows = ncclfail.rows()
    assert len({r["id"] for r in rows}) == len(rows) >= 15
    for row in rows:
        assert row["source"] and all(s.startswith(("https://", "ibv_poll_cq", "NCCL")) for s in row["source"])
        assert row["cause"].strip() and row["check"].strip()
        for line in row["examples"]:
            assert [r["id"] for r in rows if r["rx"].search(line)] == [row["id"]], line


def test_causes_come_before_follow_on_errors_whatever_their_order_in_the_log():
    log = ("a:1:2 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer b<1>\n"
           "a:1:2 [0] misc/ibvwrap.cc:284 NCCL WARN Call to ibv_modify_qp failed with error No such device\n")
    assert [f["id"] for f in ncclfail.explain(log)] == ["ib_modify_qp", "peer_closed"]


def test_the_gate_s_failure_signatures_carry_the_table_once_per_line():
    found = signatures.diagnose(load("roce_modify_qp.log"))
    assert [d["id"] for d in found] == ["nccl_ib_modify_qp"] and "NCCL_IB_GID_INDEX" in found[0]["explanation"]
    # posix_fallocate's line is the table's alone; a line the gate's own /dev/shm signature explains is not
    # explained twice
    assert [d["id"] for d in signatures.diagnose(load("shm_fallocate.log"))] == ["nccl_shm_exhausted"]
    both = "h:1:2 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment nccl-shm-recv-1 (size 9637888)"
    assert [d["id"] for d in signatures.diagnose(both)] == ["shm_too_small"]


def test_host_facts_read_the_fabric_the_container_sees(tmp_path):
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    (port / "gid_attrs/types").mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    (port / "gid_attrs/types/3").write_text("RoCE v2\n")
    drivers = tmp_path / "drivers"
    (drivers / "efa").mkdir(parents=True)
    (drivers / "mlx5_core").mkdir()
    (sysfs / "class/infiniband/mlx5_0/device").mkdir(parents=True)
    (sysfs / "class/infiniband/mlx5_0/device/driver").symlink_to(drivers / "mlx5_core")
    (sysfs / "class/infiniband/rdmap16s27/device").mkdir(parents=True)
    (sysfs / "class/infiniband/rdmap16s27/device/driver").symlink_to(drivers / "efa")
    for name, kind in (("ib0", "32"), ("eth0", "1")):
        (sysfs / "class/net" / name).mkdir(parents=True)
        (sysfs / "class/net" / name / "type").write_text(kind + "\n")
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband/uverbs0").write_text("")
    facts = transport.host_facts(str(sysfs), str(dev))
    assert [d["name"] for d in facts["rdma"]] == ["mlx5_0", "rdmap16s27"] and facts["efa"] is True
    assert facts["rdma"][0]["ports"] == {"1": {"link_layer": "Ethernet", "roce_v2_gid": True}}
    assert facts["ipoib"] == ["ib0"] and facts["uverbs"] == ["uverbs0"]
    assert facts["memlock_kib"] is None or facts["memlock_kib"] >= 0
    empty = transport.host_facts(str(tmp_path / "none"), str(tmp_path / "none"))
    assert (empty["rdma"], empty["efa"], empty["ipoib"], empty["uverbs"]) == ([], False, [], [])


def test_the_cli_judges_a_log_and_exits_by_what_it_found(capsys):
    assert run_cli("diagnose-nccl", str(DATA / "roce.log")) == 0
    out = capsys.readouterr().out
    assert out.startswith("✓ transport: rdma — between nodes via RoCE") and "no failure line found" in out
    assert run_cli("diagnose-nccl", str(DATA / "roce_open_failed_container.log")) == 1
    out = capsys.readouterr().out
    assert "✕ transport: fallback" in out and "ib_open_device" in out and "github.com/NVIDIA/nccl/issues/451" in out
    assert run_cli("diagnose-nccl", "--json", str(DATA / "ib_disabled_refused.log")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["transport"]["verdict"] == "fallback" and [f["id"] for f in doc["failures"]] == ["socket_connect"]


def test_the_cli_refuses_what_is_not_an_nccl_log_in_one_line(tmp_path, capsys):
    plain = tmp_path / "train.log"
    plain.write_text("epoch 1 loss 2.3\n")
    for argv, expected in ((["diagnose-nccl", str(plain)], "no NCCL line in it"),
                           (["diagnose-nccl", str(tmp_path / "absent.log")], "no such file"),
                           (["diagnose-nccl", str(tmp_path)], "a directory, not a log"),
                           (["diagnose-nccl", "--nodes", "0", str(plain)], "--nodes 0")):
        assert run_cli(*argv) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err
        assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


def test_a_log_from_several_nodes_is_read_as_one(capsys):
    assert run_cli("diagnose-nccl", "--json", str(DATA / "socket_network_no_ib.log"),
                   str(DATA / "roce_open_failed_container.log")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["transport"]["verdict"] == "fallback"


def test_nccl_version_and_environment_are_read_as_nccl_prints_them():
    sig = nccllog.read(load("ib_disabled_refused.log"))
    assert sig["versions"] == ["2.4.8"] and sig["env"] == {"NCCL_IB_DISABLE": "1"}
    assert sig["hosts"] == ["tj1-asr-train-v100-11"] and sig["plugin_missing"]
    assert re.match(nccllog.IPOIB, "ibp12s0") and not re.match(nccllog.IPOIB, "ibmveth")
