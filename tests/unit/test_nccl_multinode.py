"""`smoke nccl` across nodes: the flags a user types, the rank layout each node starts, the rendezvous item."""

import pytest

from smoke import cli, launch, nccl, report, transport


@pytest.mark.parametrize("argv, message", [
    (["nccl", "--nnodes", "2", "--node-rank", "0"], "--master-addr: required"),
    (["nccl", "--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2: must be in 0..1"),
    (["nccl", "--nnodes", "0"], "--nnodes 0"),
    (["nccl", "--nnodes", "2", "--master-addr", "h", "--master-port", "70000"], "--master-port 70000"),
    (["nccl", "--nproc-per-node", "0"], "--nproc-per-node 0"),
    (["train", "--nnodes", "2", "--master-addr", "h"], "only the nccl check runs across nodes"),
])
def test_bad_flags_are_a_one_line_user_error(argv, message, capsys, tmp_path):
    assert cli.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("smoke: ") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_each_node_starts_its_own_slice_of_global_ranks():
    node = nccl.node_layout(3, 2, "node0.example", 29500)
    got = [launch.rank_vars(local, 2, None, node) for local in (0, 1)]
    assert [(v["RANK"], v["LOCAL_RANK"], v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"]) for v in got] == \
        [("4", "0", "6", "2"), ("5", "1", "6", "2")]
    assert {(v["MASTER_ADDR"], v["MASTER_PORT"], v["GROUP_RANK"]) for v in got} == {("node0.example", "29500", "2")}


def test_one_node_keeps_the_loopback_layout():
    assert nccl.node_layout(1, 0, None, 29500) is None
    v = launch.rank_vars(1, 2, 4242, None)
    assert (v["RANK"], v["WORLD_SIZE"], v["MASTER_ADDR"], v["MASTER_PORT"]) == ("1", "2", "127.0.0.1", "4242")


def test_rendezvous_item_tells_a_missing_node_from_a_joined_one():
    node = nccl.node_layout(2, 1, "n0", 29511)
    res = report.Result("nccl", "cpu")
    nccl.check_rendezvous(res, "==> nccl.rank0.log <==\nconnect timeout\n", node, 20)
    nccl.check_rendezvous(res, f"{nccl.RENDEZVOUS_MARK}: rank 2 of 4\n", node, 20)
    assert [i["ok"] for i in res.items] == [False, True]
    assert "no rendezvous at n0:29511 within 20s" in res.items[0]["detail"]


def test_rdma_devices_are_read_from_sysfs(tmp_path):
    (tmp_path / "mlx5_1").mkdir()
    (tmp_path / "mlx5_0").mkdir()
    assert transport.rdma_devices(str(tmp_path)) == ["mlx5_0", "mlx5_1"]
    assert transport.rdma_devices(str(tmp_path / "absent")) == []
