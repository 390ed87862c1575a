"""Pure parts of publish and verify: names, tag shortening, host checks and the verdict text."""

from __future__ import annotations

import pytest

from builder.boundary import host, registry
from builder.errors import UserError
from builder.steps import publish
from builder.steps import verify as hostverify

PINS = {"torch": "2.13.0", "transformers": "5.24.0", "deepspeed": "0.19.8", "peft": "0.21.2",
        "accelerate": "1.16.0", "nvidia-ml-py": "13.615.71"}


def test_full_tag_format():
    assert publish.full_tag("cu130-torch2.13", PINS, "20261202", "a94488e") == (
        "cu130-torch2.13-torch2.13.0-tf5.24.0-ds0.19.8-peft0.21.2-acc1.16.0-nvml13.615.71-20261202-a94488e")


def test_full_tag_shortened_to_docker_limit():
    long_tag = "cu130-torch2.13-" + "x" * 100
    full = publish.full_tag(long_tag, {**PINS, "flash-attn": "2.7.4.post1"}, "20261202", "a94488e-dirty")
    assert len(full) <= 128 and full.endswith("-20261202-a94488e-dirty") and "-pins" in full
    assert full == publish.full_tag(long_tag, {**PINS, "flash-attn": "2.7.4.post1"}, "20261202", "a94488e-dirty")


def test_revision_from_label():
    assert publish.revision_of({"org.opencontainers.image.revision": "d96edf968d43-dirty"}, None) == "d96edf9-dirty"
    assert publish.revision_of({}, None) == "unknown"
    assert publish.revision_of({}, "abc/def;rm") == "abcdefr"


@pytest.mark.parametrize("given,host,name,loopback", [
    ("ghcr.io/acme", "ghcr.io", "acme/train", False),
    ("127.0.0.1:5000", "127.0.0.1:5000", "train", True),
    ("localhost:5000/a/b/", "localhost:5000", "a/b/train", True),
    ("registry.example.org", "registry.example.org", "train", False),
])
def test_registry_repository(given, host, name, loopback):
    repo = registry.repository(given, "ghcr.io/train-images/train")
    assert (repo.host, repo.name, repo.loopback) == (host, name, loopback)


def test_registry_rejects_junk():
    with pytest.raises(UserError):
        registry.repository("https://ghcr.io/acme", "x/train")


def test_parse_nvidia_smi():
    gpus = host.parse_nvidia_smi("580.65.06, NVIDIA H100 80GB HBM3, 81559\n580.65.06, NVIDIA H100 80GB HBM3, 81559\n")
    assert len(gpus) == 2 and gpus[0]["driver"] == "580.65.06" and gpus[0]["name"] == "NVIDIA H100 80GB HBM3"


def test_driver_comparison():
    assert hostverify.driver_ok("580.65.06", "580.65.06")
    assert hostverify.driver_ok("590.1", "580.65.06")
    assert not hostverify.driver_ok("570.124.06", "580.65.06")
    assert not hostverify.driver_ok("garbage", "580.65.06")


INFO = {"ServerVersion": "20.10.24", "OperatingSystem": "Debian", "Runtimes": {"runc": {}}}


def test_cpu_host_runs_cpu_gate_and_says_so():
    rows, use_gpus = hostverify.host_checks({"min_driver": "580.65.06"}, INFO, [], "no nvidia-smi", False)
    assert not use_gpus
    assert all(ok is not False for name, ok, _, _ in rows if name != "host /dev/shm")
    ok, lines = hostverify.verdict("img", rows, {"passed": True, "checks": []}, use_gpus, "no usable GPU here")
    assert any("GPU checks" in line and "NOT run" in line for line in lines)


def test_old_driver_fails_with_what_to_do():
    gpus = [{"driver": "570.124.06", "name": "NVIDIA A100", "memory_mb": "81920"}]
    info = {**INFO, "Runtimes": {"runc": {}, "nvidia": {}}}
    rows, use_gpus = hostverify.host_checks({"min_driver": "580.65.06"}, info, gpus, "nvidia-smi", False)
    assert not use_gpus
    ok, lines = hostverify.verdict("img", rows, {"passed": True, "checks": []}, use_gpus, "host checks failed")
    assert not ok and any("upgrade the driver to 580.65.06" in line for line in lines)


def test_gpu_host_without_toolkit():
    gpus = [{"driver": "580.65.06", "name": "NVIDIA H100", "memory_mb": "81559"}]
    rows, use_gpus = hostverify.host_checks({"min_driver": "580.65.06"}, INFO, gpus, "nvidia-smi", False)
    if not hostverify.shutil.which("nvidia-container-runtime-hook"):
        assert not use_gpus
        assert any("NVIDIA Container Toolkit" in fix for _, ok, _, fix in rows if ok is False)
