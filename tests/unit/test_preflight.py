"""preflight: the committed files and every source a build needs, with the mirror flag for each one that
does not answer. The probe is injected: these tests use the real matrix and dockerfiles/, and no network."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.model import context, lockfile, matrix
from builder.model.inputs import Inputs
from builder.steps import preflight
from tests.conftest import ROOT

ENTRIES = matrix.load(ROOT / "matrix.yaml").by_tag()
CI, FA, EXC = ENTRIES["cu130-torch2.13-bookworm"], ENTRIES["cu128-torch2.8"], ENTRIES["cu121-torch2.3"]


def probe_down(*hosts: str):
    """A probe under which the given hosts do not answer; records what was asked."""
    asked: list[str] = []

    def probe(url: str):
        asked.append(url)
        return "Name or service not known" if any(h in url for h in hosts) else None

    probe.asked = asked
    return probe


INPUT_FIELDS = ("local_base", "base_image", "apt_mirror", "flash_attn_mirror")


@pytest.fixture(autouse=True)
def repo(tmp_path, monkeypatch):
    """A copy of the committed dockerfiles/, locks/ and smoke/; cwd is the copy (the build context's sources)."""
    for name in ("dockerfiles", "locks", "smoke"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(entry, **kw):
    inputs = Inputs(**{k: kw.pop(k) for k in INPUT_FIELDS if k in kw})
    staged = context.stage(entry, inputs, root=Path("build/context"))
    return preflight.preflight(entry, inputs, staged, **kw)


def test_ci_entry_with_everything_reachable_passes_and_reports_what_it_checked():
    report = run(CI, probe=probe_down())
    assert [c["source"] for c in report["checked"]] == [
        "base image registry for debian:bookworm-slim", "Python package index", "apt archive (debian)"]
    assert all(c["ok"] for c in report["checked"])


def test_local_base_copy_needs_no_registry():
    probe = probe_down("registry-1.docker.io")
    report = run(CI, probe=probe, local_base=True, image_exists=lambda ref: ref == "debian:bookworm-slim")
    assert report["checked"][0]["url"] == "local image"
    assert not any("registry" in url for url in probe.asked)


def test_unreachable_registry_names_it_and_the_mirror_flag():
    with pytest.raises(EnvironmentProblem) as exc:
        run(FA, probe=probe_down("registry-1.docker.io"))
    assert exc.value.exit_code == 3
    assert ("cu128-torch2.8: cannot reach the base image registry for nvidia/cuda:12.8.1-runtime-ubuntu24.04: "
            "https://registry-1.docker.io/v2/") in exc.value.message
    assert "--base-image REF" in exc.value.message
    assert "run lock" not in exc.value.message


def test_a_base_mirror_is_probed_instead():
    probe = probe_down("registry-1.docker.io")
    run(FA, probe=probe, base_image="mirror.example:5000/nvidia/cuda:12.8.1-runtime-ubuntu24.04")
    assert "https://mirror.example:5000/v2/" in probe.asked


def test_unreachable_github_names_the_wheel_and_the_mirror_flag():
    with pytest.raises(EnvironmentProblem) as exc:
        run(FA, probe=probe_down("github.com"))
    assert "cannot reach the flash-attn wheel on GitHub: https://github.com/Dao-AILab/flash-attention/releases/" \
           "download/v2.8.3/flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl" in exc.value.message
    assert "--flash-attn-mirror URL" in exc.value.message


def test_flash_attn_mirror_keeps_the_file_name_and_the_hash():
    probe = probe_down("github.com")
    run(FA, probe=probe, flash_attn_mirror="http://wheels.local/fa/")
    wanted = "http://wheels.local/fa/flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    assert wanted in probe.asked
    text = (ROOT / "locks" / FA.tag / lockfile.FLASH_LOCK).read_text()
    rewritten = lockfile.rewrite_flash_lock(text, "http://wheels.local/fa")
    assert f"flash-attn @ {wanted} \\\n" in rewritten
    assert "--hash=sha256:f25da18657a87fc83dc1bfb8b7751b82246e9db355510226b674fd437c34b5fb" in rewritten


def test_unreachable_index_names_pip_index_url(monkeypatch):
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    with pytest.raises(EnvironmentProblem) as exc:
        run(CI, probe=probe_down("pypi.org"))
    assert "cannot reach the Python package index: https://pypi.org/simple/" in exc.value.message
    assert "PIP_INDEX_URL=<mirror>" in exc.value.message


def test_apt_needs_live_archive_or_snapshot():
    probe = probe_down("deb.debian.org")
    run(CI, probe=probe)  # the snapshot answers: the build's fallback will use it
    snapshot = lockfile.snapshot((ROOT / "locks" / CI.tag / lockfile.APT_LOCK).read_text())["ts"]  # committed date
    assert f"http://snapshot.debian.org/archive/debian/{snapshot}/" in probe.asked
    with pytest.raises(EnvironmentProblem) as exc:
        run(CI, probe=probe_down("deb.debian.org", "snapshot.debian.org"))
    assert "cannot reach the apt archive (debian): http://deb.debian.org/debian/" in exc.value.message
    assert f"http://snapshot.debian.org/archive/debian/{snapshot}/" in exc.value.message
    assert "--apt-mirror URL" in exc.value.message


def test_every_unreachable_source_is_named_at_once():
    with pytest.raises(EnvironmentProblem) as exc:
        run(EXC, probe=probe_down("registry-1.docker.io", "github.com"))
    lines = exc.value.message.splitlines()
    assert len(lines) == 2 and "base image registry" in lines[0] and "flash-attn wheel" in lines[1]


def test_a_declared_flash_attn_exception_stops_reachable_builds_with_its_reason():
    with pytest.raises(UserError) as exc:
        run(EXC, probe=probe_down())
    assert "cu121-torch2.3: the flash-attn wheel has no sourced sha256 (no two public sources" in exc.value.message


@pytest.mark.parametrize("where,name", [("dockerfiles", "image.json"), ("locks", "ops.lock")])
def test_a_file_the_dockerfile_copies_is_missing(repo, where, name):
    (repo / where / CI.tag / name).unlink()
    with pytest.raises(StepFailed) as exc:
        run(CI, probe=probe_down())
    assert (f"{CI.tag}: {name} is missing from dockerfiles/{CI.tag}/ and locks/{CI.tag}/ (the Dockerfile copies it)"
            in exc.value.message)


def test_a_stale_lock_stops_before_any_probe(repo):
    path = repo / "locks" / CI.tag / lockfile.APT_LOCK
    path.write_text(path.read_text().replace("g++=4:12.2.0-3", "g++"))
    probe = probe_down()
    with pytest.raises(StepFailed) as exc:
        run(CI, probe=probe)
    assert "apt.lock has unpinned packages: g++" in exc.value.message and probe.asked == []


def test_every_committed_dockerfile_copies_only_files_that_exist():
    """What render and lock committed together make a complete build context for every entry."""
    for tag, entry in ENTRIES.items():
        staged = context.stage(entry, Inputs(), root=Path("build/context"))
        names = preflight.copied_files(staged / "Dockerfile")
        assert {"apt.lock", "torch.lock", "requirements.lock", "image.json", "compile-new.py", "torch-cuda.lock"} <= set(names)
        assert all((staged / name).exists() for name in names), tag


def test_registry_of_a_reference():
    assert preflight.registry_url("nvidia/cuda:12.1.1-runtime-ubuntu22.04") == preflight.DOCKER_HUB
    assert preflight.registry_url("debian:bookworm-slim") == preflight.DOCKER_HUB
    assert preflight.registry_url("nvcr.io/nvidia/cuda:13.0.1-runtime") == "https://nvcr.io/v2/"
    assert preflight.registry_url("localhost:5000/x:1") == "https://localhost:5000/v2/"
