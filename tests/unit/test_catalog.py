"""The catalog: generated from the step reports, byte-identical from the same reports, staleness caught."""

from __future__ import annotations

import json

from builder import reports
from tests.conftest import run_cli

TAG = "cu130-torch2.13-bookworm"
IMAGE_ID = "sha256:" + "1" * 64
DIGEST = "sha256:" + "d" * 64
FULL = f"{TAG}-torch2.13.0-tf5.24.0-ds0.19.8-peft0.21.2-acc1.16.0-nvml13.615.71-20261202-a94488e"
VERSIONS = {"torch": "2.13.0", "transformers": "5.24.0", "deepspeed": "0.19.8", "peft": "0.21.2",
            "accelerate": "1.16.0", "nvidia-ml-py": "13.615.71", "flash-attn": None}


def write_reports(image_id: str = IMAGE_ID, smoke_id: str = IMAGE_ID) -> None:
    reports.write(TAG, "build", {"result": "built", "image_id": image_id, "size_bytes": 5_709_747_927,
                                 "versions": VERSIONS, "input_hash": "e" * 64, "duration_s": 200.0})
    reports.write(TAG, "smoke", {
        "image": f"example.org/team/train:{TAG}", "passed": True, "image_id": smoke_id, "mode": "cpu", "finished_at": "2026-12-02T15:30:00Z",
        "checks": [
            {"name": "env", "passed": True, "figures": {"shm_mb": 8192}},
            {"name": "train", "passed": True, "figures": {"steps_per_s": 0.4321, "loss_first": 5.48,
                                                          "loss_last": 5.33}},
            {"name": "nccl", "passed": True, "figures": {"ranks": 2, "backend": "gloo",
                                                         "largest": {"bytes": 67108864, "busbw_gbps": 1.234}}},
        ]})
    reports.write(TAG, "publish", {"result": "published", "image_id": image_id, "registry": "ghcr.io/acme",
                                   "repository": "ghcr.io/acme/train", "full_tag": FULL, "alias": TAG,
                                   "digest": DIGEST, "pull": f"ghcr.io/acme/train@{DIGEST}",
                                   "published_at": "2026-12-02T15:40:00Z", "size_bytes": 5_709_747_927,
                                   "layer_compression": "zstd"})


def write_repro() -> None:
    reports.write(TAG, "repro", {"result": "reproducible", "identical": False, "ok": True, "files_compared": 44989,
                                 "bytes_compared": 5_700_000_000, "differences": 0, "unexplained_count": 0,
                                 "allowlisted_count": 0, "layers": {"identical": False},
                                 "rebuild": {"image": "x:y-repro", "id": "sha256:" + "2" * 64},
                                 "finished_at": "2026-12-03T01:00:00Z", "duration_s": 389.0})


def test_generated_from_reports(project):
    write_reports()
    write_repro()
    assert run_cli("catalog") == 0
    md = (project / "IMAGES.md").read_text()
    assert f"`{FULL}`" in md and DIGEST in md and f"docker pull ghcr.io/acme/train@{DIGEST}" in md
    assert "5.71 GB" in md and "580.65.06" in md and "✓ passed (CPU, 2026-12-02)" in md
    assert "0.43 steps/s" in md and "busbw 1.23 GB/s (2 ranks gloo)" in md and "reproducible" in md
    assert "| cu121-torch2.3 " in md.replace("`", "") and "not published" in md  # every tag is listed
    data = json.loads((project / "images.json").read_text())
    entry = next(i for i in data["images"] if i["tag"] == TAG)
    assert entry["published"]["digest"] == DIGEST and entry["smoke"]["busbw_gbps"] == 1.234
    assert entry["versions"]["torch"] == "2.13.0" and entry["versions_source"] == "measured in the image"
    assert entry["repro"]["verdict"] == "reproducible" and entry["repro"]["date"] == "2026-12-03"
    assert entry["ci_builds"] is True and "built by our CI in every run; gate CPU" in md
    # who can pull it: zstd layers need a client that reads them
    assert entry["published"]["layer_compression"] == "zstd"
    assert "- layers: zstd (pulls need Docker >= 23 or containerd >= 1.5)" in md


def test_gate_level_and_exceptions_reach_the_catalog_list_and_readme(project, capsys):
    """How far a tag is proven reads the same in IMAGES.md, `list` and the README table."""
    assert run_cli("render") == 0
    write_reports()
    level = {"kind": "gpu", "gpu_model": "NVIDIA H200", "gpu_count": 1, "driver": "580.95.05"}
    smoke = reports.read(TAG, "smoke")
    reports.write(TAG, "smoke", {**{k: v for k, v in smoke.items() if k not in ("tag", "step")}, "mode": "gpu",
                                 "level": level})
    publish = reports.read(TAG, "publish")
    reports.write(TAG, "publish", {**{k: v for k, v in publish.items() if k not in ("tag", "step")},
                                   "exceptions": ["substituted-base"]})
    assert run_cli("catalog") == 0
    md = (project / "IMAGES.md").read_text()
    assert "✓ passed (GPU: 1 × NVIDIA H200, 2026-12-02)" in md
    assert "published with exceptions: substituted-base" in md
    capsys.readouterr()
    assert run_cli("list") == 0
    assert "CI build, gate GPU: 1 × NVIDIA H200 (2026-12-02)" in capsys.readouterr().out
    assert "| CI build, gate GPU: 1 × NVIDIA H200 (2026-12-02) |" in (project / "README.md").read_text()
    assert run_cli("render", "--check") == 0, "catalog keeps the README table in step"


def test_deterministic(project, tmp_path):
    write_reports()
    assert run_cli("catalog") == 0
    first = {n: (project / n).read_bytes() for n in ("IMAGES.md", "images.json")}
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert run_cli("catalog", "--out", str(other)) == 0
    assert run_cli("catalog") == 0
    for name, content in first.items():
        assert (project / name).read_bytes() == content == (other / name).read_bytes()


def test_staleness_detected(project, capsys):
    write_reports()
    assert run_cli("catalog", "--check") == 2  # never generated
    assert run_cli("catalog") == 0
    assert run_cli("catalog", "--check") == 0
    reports.write(TAG, "smoke", {**reports.read(TAG, "smoke"), "passed": False})
    assert run_cli("catalog", "--check") == 2
    err = capsys.readouterr().err
    assert "stale" in err and "python -m builder catalog" in err


def test_smoke_of_another_image_is_stale(project):
    write_reports(smoke_id="sha256:" + "2" * 64)
    assert run_cli("catalog") == 0
    data = json.loads((project / "images.json").read_text())
    assert next(i for i in data["images"] if i["tag"] == TAG)["smoke"]["verdict"] == "stale"
    assert "✕ stale" in (project / "IMAGES.md").read_text()


def test_reports_dir_option(project, tmp_path, monkeypatch):
    elsewhere = tmp_path / "ci-reports"
    monkeypatch.setenv("BUILDER_REPORTS", str(elsewhere))
    write_reports()
    monkeypatch.delenv("BUILDER_REPORTS")
    (project / "build/reports").mkdir(parents=True)
    assert run_cli("catalog") == 0
    assert FULL not in (project / "IMAGES.md").read_text()  # build/reports is empty here
    assert run_cli("catalog", "--reports", str(elsewhere)) == 0
    assert FULL in (project / "IMAGES.md").read_text()


def test_the_engine_that_built_the_image_is_named(project):
    write_reports()
    docker = {"binary": "docker", "mode": "buildx", "engine": "26.1.5+dfsg1", "image_store": "containerd"}
    report = reports.read(TAG, "build")
    reports.write(TAG, "build", {**report, "docker": docker})
    assert run_cli("catalog") == 0
    md = (project / "IMAGES.md").read_text()
    assert r"- built with: Docker 26.1.5+dfsg1 \(buildx, containerd image store\)" in md
    entry = next(i for i in json.loads((project / "images.json").read_text())["images"] if i["tag"] == TAG)
    assert entry["built_with"] == docker
    # A build of another image (the published one came from an earlier build) does not speak for it.
    reports.write(TAG, "build", {**report, "image_id": "sha256:" + "9" * 64,
                                 "docker": {**docker, "engine": "20.10.24+dfsg1", "mode": "legacy"}})
    assert run_cli("catalog") == 0
    assert "built with:" not in (project / "IMAGES.md").read_text()
