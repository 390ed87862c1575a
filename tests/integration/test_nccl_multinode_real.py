"""`smoke nccl` across nodes for real: two containers of the CI image on a Docker network this test creates
(not the host network: rendezvous and gloo traffic only between those containers), 2 gloo ranks each, and a
node that never starts.  The worktree's smoke/ is bind-mounted over the image's copy, so no rebuild is needed."""

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.images import CI_TAG, DOCKER

pytestmark = pytest.mark.docker

IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"
SMOKE = Path(__file__).resolve().parents[2] / "smoke"
MARK = "@@NCCL_JSON@@"


@pytest.fixture
def network(require_docker):
    if subprocess.run([DOCKER, "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"{IMAGE} not built here")
    name = f"smoke-mn-{uuid.uuid4().hex[:8]}"
    subprocess.run([DOCKER, "network", "create", name], check=True, capture_output=True)
    started = []
    yield name, started
    for c in started:
        subprocess.run([DOCKER, "rm", "-f", c], capture_output=True)
    subprocess.run([DOCKER, "network", "rm", name], capture_output=True)


def start_node(network, started, rank, master, timeout, nnodes=2):
    """One node as a container named <network>-n<rank>; returns the running `docker run` process."""
    name = f"{network}-n{rank}"
    started.append(name)
    # The verdict is printed after a marker: files written by root in a bind mount would outlive the test.
    script = (f"smoke nccl --cpu --nnodes {nnodes} --node-rank {rank} --master-addr {master} --master-port 29511 "
              f"--nproc-per-node 2 --timeout {timeout} --out /tmp/o; rc=$?; echo {MARK}; cat /tmp/o/nccl.json; exit $rc")
    return subprocess.Popen([DOCKER, "run", "--rm", "--name", name, "--hostname", name, "--network", network,
                             "--shm-size=256m", "-v", f"{SMOKE}:/opt/train-image/smoke:ro", IMAGE, "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(p, limit):
    out, _ = p.communicate(timeout=limit)
    assert MARK in out, out[-3000:]
    return p.returncode, json.loads(out.split(MARK, 1)[1]), out


def test_two_nodes_two_gloo_ranks_each_all_reduce_exactly(network):
    net, started = network
    master = f"{net}-n0"
    t0 = time.monotonic()
    nodes = [start_node(net, started, r, master, 90) for r in (0, 1)]
    results = [finish(p, 150) for p in nodes]
    for rank, (rc, v, out) in enumerate(results):
        assert rc == 0, out[-3000:]
        assert v["passed"] is True and all(i["ok"] is not False for i in v["items"])
        f = v["figures"]
        assert (f["world_size"], f["nnodes"], f["nproc_per_node"], f["node_rank"]) == (4, 2, 2, rank)
        assert f["master"] == f"{master}:29511" and f["backend"] == "gloo"
        # Every size was checked on all 4 ranks (each adds rank+1: 10 everywhere) and timed.
        assert [s["wrong_elements"] for s in f["sizes"]] == [0, 0, 0, 0]
        assert all(s["busbw_gbps"] > 0 for s in f["sizes"])
        assert "4 ranks on 2 nodes gloo" in v["summary"]
        assert any(i["name"] == "all 2 nodes joined" and i["ok"] for i in v["items"])
    assert time.monotonic() - t0 < 120


def test_a_node_that_never_starts_fails_within_the_timeout(network):
    net, started = network
    t0 = time.monotonic()
    rc, v, out = finish(start_node(net, started, 0, f"{net}-n0", 20), 90)
    took = time.monotonic() - t0
    assert rc == 1 and v["passed"] is False
    joined = [i for i in v["items"] if i["name"] == "all 2 nodes joined"]
    assert joined and joined[0]["ok"] is False and "a node is missing or late" in joined[0]["detail"]
    assert v["figures"]["world_size"] == 4
    assert took < 20 + 15, f"took {took:.0f}s"  # the timeout plus container start, never a hang
