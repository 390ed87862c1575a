"""Transport diagnosis on real NCCL_DEBUG=INFO logs from public reports (each fixture names its source)."""

import pathlib

import pytest

from smoke import transport

DATA = pathlib.Path(__file__).parent / "data" / "nccl_logs"


def load(name):
    text = (DATA / name).read_text()
    assert text.startswith("# source: https://github.com/"), f"{name} must state its source URL"
    return text


@pytest.mark.parametrize("name, fabric, devs", [
    ("ib_gdrdma.log", "IB", []),
    ("roce.log", "RoCE", ["mlx5_10", "mlx5_11"]),
    ("efa_ofi_channels.log", "EFA", []),
    ("efa_p5en.log", "EFA", ["efa"]),
])
def test_rdma_fabrics_pass_and_are_named(name, fabric, devs):
    d = transport.diagnose(load(name))
    assert (d["fabric"], d["rdma_devices"], d["ok"]) == (fabric, devs, True)
    assert d["line"].startswith(f"between nodes via {fabric}")


def test_ib_channels_outnumber_intra_node_ones_and_both_are_counted():
    d = transport.diagnose(load("ib_gdrdma.log"))
    assert d["channels"] == {"IB": 2} and d["intra"] == ["P2P/IPC"]


def test_single_node_nvlink_has_no_inter_node_fabric():
    d = transport.diagnose(load("nvlink_single_node.log"))
    assert d["fabric"] is None and d["ok"] and d["intra"] == ["P2P/direct pointer"]


@pytest.mark.parametrize("name", ["socket_channels_no_ib.log", "socket_network_no_ib.log"])
def test_sockets_without_rdma_devices_are_not_a_fallback(name):
    d = transport.diagnose(load(name))
    assert (d["fabric"], d["ok"]) == ("Socket", True)
    assert "no RDMA device" in d["line"]


@pytest.mark.parametrize("name", ["socket_channels_no_ib.log", "socket_network_no_ib.log"])
def test_sockets_where_the_host_has_rdma_devices_fail_in_one_line(name):
    # The issue-26 case: the host has mlx5 HCAs but the image lacks libibverbs, so NCCL says
    # "NET/IB : No device found" and connects the nodes over TCP.
    d = transport.diagnose(load(name), rdma_devices=["mlx5_0"])
    assert d["ok"] is False and "\n" not in d["line"]
    assert "mlx5_0" in d["line"] and "libibverbs1" in d["line"]


def test_roce_log_with_a_socket_channel_fails():
    log = load("roce.log") + "x:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
    assert transport.diagnose(log)["ok"] is False


def test_an_empty_log_is_not_judged_and_says_what_to_capture():
    d = transport.diagnose("")
    assert (d["verdict"], d["fabric"], d["ok"]) == ("unknown", None, True)
    assert "NCCL_DEBUG=INFO" in d["line"]


def test_transports_loadable_without_a_gpu_name_what_is_missing():
    """The env check judges the image, not the fabric: rdma-core loads → IB verbs; without it, sockets only."""
    from smoke import transport

    def missing_verbs(name):
        raise OSError(f"{name}: cannot open shared object file")

    found, missing, devices = transport.loadable_transports(load=lambda name: None, devices=["mlx5_0"])
    assert found == ["sockets", "IB verbs (IB/RoCE)"] and missing == [] and devices == ["mlx5_0"]
    found, missing, _ = transport.loadable_transports(load=missing_verbs, devices=[])
    assert found == ["sockets"] and missing == list(transport.VERBS_LIBS)


def test_env_reports_the_socket_only_fallback_as_a_failure(monkeypatch):
    from smoke import env, report, transport

    monkeypatch.setattr(transport, "loadable_transports", lambda: (["sockets"], ["libibverbs.so.1"], []))
    res = report.Result("env", "cpu")
    env.check_transports(res)
    (item,) = res.items
    assert item["name"] == "NCCL transports loadable" and item["ok"] is False
    assert "NCCL can only use sockets between nodes" in item["detail"]
