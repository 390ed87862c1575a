"""Helpers for tests that use the real engine: the docker binary, the CI tag, small derived images."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from smoke import signatures

CI_TAG = "cu130-torch2.13-bookworm"
# The CI entry is built the way a user behind mirrors builds it: the base through a mirror reference (a local
# copy of the base tagged under a mirror's name), apt through a mirror URL (the archive itself, named as the
# mirror), flash-attn through a wheel mirror (unused by this entry: it has no flash-attn). repro must rebuild it
# from the same flags (`mirror_flags()`), as a user's repro would.
BASE_MIRROR = "mirror.local:5000/library/debian:bookworm-slim"
MIRROR_FLAGS = ("--base-image", BASE_MIRROR, "--apt-mirror", "http://deb.debian.org/debian",
                "--flash-attn-mirror", "http://127.0.0.1:9/flash-attn")
# The CUDA 12 line CI builds and gates: Debian 12, Python 3.11, nvcc from Debian 13 .debs unpacked in the ops stage.
CI_TAG_CUDA12 = "cu124-torch2.6-bookworm"
# The client the tests call directly: the one the builder is told to use, else Debian's (BuildKit built in).
DOCKER = os.environ.get("BUILDER_DOCKER", "/usr/bin/docker")


def aborted_at_exit(returncode: int, output: str) -> bool:
    """A training run that failed with PyTorch's gloo exit race (pytorch/pytorch#190489, docs/training.md): a rank
    aborted at interpreter exit, after its work. Tests that train check everything else, then report it as xfail."""
    return returncode != 0 and "exit_abort" in {d["id"] for d in signatures.diagnose(output)}


def gate_output(out: Path) -> dict:
    """A gate's output directory (all.json, <check>.json) read as builder reads it: the verdict, with each check's
    own result (its assertions) under "details", as in builder's smoke report."""
    from builder.boundary import gate

    verdict, per_check, broken = gate.read_gate_output(out)
    assert verdict is not None, broken or f"the gate wrote no {out}/all.json"
    return dict(verdict, details=per_check)


def gate_once(run_gate, read_report):
    """Run the gate (run_gate() -> process) once, as a user's `make image` does: a rank that only failed to leave
    after its work (PyTorch's gloo teardown bugs) is the gate's own decision (smoke/ranks.py teardown_faults, a
    pass with the clean exit not proven), not a test's rerun. Returns (process, report)."""
    proc = run_gate()
    return proc, read_report()


def docker_available() -> bool:
    try:
        from builder.boundary import engine

        engine.sdk()
        engine.client()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no engine here"
        return False


def remove_images(*refs: str) -> None:
    """Untag and delete images a test no longer needs (absent ones are fine): the suite's disk, not a check."""
    subprocess.run([DOCKER, "rmi", "-f", *refs], capture_output=True, timeout=300)


def prune_build_cache() -> None:
    """Drop the whole BuildKit cache (a no-cache build needs none of it; multi-GB per CI image)."""
    subprocess.run([DOCKER, "builder", "prune", "-af"], capture_output=True, timeout=600)


def canary_bundle(directory: Path) -> tuple[Path, str]:
    """The host CA bundle plus a freshly generated certificate nobody else has: its bytes must never
    appear in the image, its history or the logs, although pip reads the bundle during the build."""
    key, cert = directory / "canary.key", directory / "canary.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=builder-test-canary", "-keyout", str(key), "-out", str(cert)], check=True,
                   capture_output=True)
    body = [line for line in cert.read_text().splitlines() if not line.startswith("-----")]
    marker = body[3]  # 64 base64 characters unique to this certificate
    host = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
    bundle = directory / "bundle.pem"
    bundle.write_text((host.read_text() if host.exists() else "") + "\n" + cert.read_text())
    return bundle, marker


def need_full_build(ci_build) -> None:
    if ci_build["fast"]:
        pytest.skip("needs the full no-cache build: unset BUILDER_TEST_FAST")


def derived_image(name: str, base: str, run_lines: list[str], tmp: Path) -> str:
    """A small image FROM `base` with extra RUN lines (pip behind the proxy gets the CA as a secret)."""
    context = tmp / name
    context.mkdir()
    body = "".join(f"RUN --mount=type=secret,id=pip_cert,required=false "
                   f"PIP_CERT=/run/secrets/pip_cert PIP_PROGRESS_BAR=off {line}\n" for line in run_lines)
    (context / "Dockerfile").write_text(f"FROM {base}\n{body}")
    ref = f"builder-test/{name}:latest"
    argv = [DOCKER, "build", "--network=host", "-q", "-t", ref]
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if ca:
        argv += ["--secret", f"id=pip_cert,src={ca}"]
    proc = subprocess.run(argv + [str(context)], capture_output=True, text=True, env=dict(os.environ, DOCKER_BUILDKIT="1"),
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ref


def build_small(tmp_path, name: str, dockerfile: str, no_cache: bool = False) -> str:
    """A small image from the local debian:bookworm-slim, built with BuildKit like the real ones."""
    context = tmp_path / name
    context.mkdir(exist_ok=True)
    (context / "Dockerfile").write_text(dockerfile)
    ref = f"builder-test/{name}:latest"
    argv = [DOCKER, "build", "-q", "-t", ref] + (["--no-cache"] if no_cache else []) + [str(context)]
    proc = subprocess.run(argv, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin",
                                                   **{k: v for k, v in os.environ.items() if k == "DOCKER_HOST"}}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ref






def one_check(image: str, name: str, tmp_path: Path, timeout: int = 600, shm_size: str = "2g") -> dict:
    """Run one gate check (`smoke NAME --cpu`) in a fresh container with no network; return its JSON report.
    For broken-image tests that target one check: the whole gate on CPU takes about two minutes on 2 cores."""
    import json

    out = tmp_path / f"out-{name}"
    out.mkdir(exist_ok=True)
    proc = subprocess.run([DOCKER, "run", "--rm", "--network", "none", "--shm-size", shm_size, "-v",
                           f"{out}:/smoke-out", image, "smoke", name, "--cpu", "--out", "/smoke-out"],
                          capture_output=True, text=True, timeout=timeout)
    path = out / f"{name}.json"
    assert path.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(path.read_text())
    assert (proc.returncode == 0) == report["passed"], "exit status and report disagree"
    return report


def default_sigint() -> None:
    """preexec_fn for a child the test will Ctrl-C: SIGINT as in a terminal, even when the test runner itself
    was started in the background (a non-interactive shell's `&` makes SIGINT ignored, and children inherit it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
