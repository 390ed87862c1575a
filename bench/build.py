"""Build benchmark: our rendered Dockerfile vs a naive single-stage one, same pins, same machine, same run.

For each: cold (no image, no build cache, no pip cache), warm (nothing changed), and after changing one
package pin. Prints times, image sizes and ours/naive ratios. Runs in a temporary copy of the repo so the
working tree is untouched. Takes ~15-25 minutes and prunes the BuildKit cache (cache mounts included).

    .venv/bin/python bench/build.py [--tag TAG] [--pin peft=0.21.1]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER = os.environ.get("BUILDER_DOCKER", "/usr/bin/docker")

NAIVE = """\
FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends python{py} python{py}-venv ca-certificates g++ \\
    && rm -rf /var/lib/apt/lists/*
RUN python{py} -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_PROGRESS_BAR=off
# The usual hand-written way: torch first (DeepSpeed's setup.py imports it), then the rest; no lock, no cache.
RUN --mount=type=secret,id=pip_cert,required=false export PIP_CERT=/run/secrets/pip_cert \\
    && pip install --no-cache-dir torch=={torch} && pip install --no-cache-dir ninja {pins}
COPY smoke/ /opt/train-image/smoke/
"""


def sh(argv, cwd=None, env=None) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, argv))}\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - start


def size(ref: str) -> int:
    out = subprocess.run([DOCKER, "image", "inspect", "-f", "{{.Size}}", ref], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def cold_reset(refs) -> None:
    subprocess.run([DOCKER, "rmi", "-f", *refs], capture_output=True)
    subprocess.run([DOCKER, "builder", "prune", "-af"], capture_output=True)


def ours(work: Path, tag: str) -> tuple[float, str]:
    env = dict(os.environ, BUILDER_REPORTS=str(work / "build/reports"))
    # No --force: with nothing changed, our build is skipped on its input hash, which is the point.
    seconds = sh([sys.executable, "-m", "builder", "build", tag, "--local-base"], cwd=work, env=env)
    return seconds, f"ghcr.io/train-images/train:{tag}"


def naive(work: Path, tag: str) -> tuple[float, str]:
    sys.path.insert(0, str(work))
    from builder.model import matrix

    e = matrix.load(work / "matrix.yaml").by_tag()[tag]
    pins = " ".join(f"{n}=={v}" for n, v in e.pins.items() if v and n != "torch")
    ctx = work / "naive"
    ctx.mkdir(exist_ok=True)
    shutil.copytree(work / "smoke", ctx / "smoke", dirs_exist_ok=True)
    (ctx / "Dockerfile").write_text(NAIVE.format(base=e.base_name, py=e.python, pins=pins, torch=e.torch))
    ref = f"bench/naive:{tag}"
    argv = [DOCKER, "build", "--network=host", "-t", ref]
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if ca:
        argv += ["--secret", f"id=pip_cert,src={ca}"]
    return sh(argv + [str(ctx)], env=dict(os.environ, DOCKER_BUILDKIT="1")), ref


def change_pin(work: Path, tag: str, pin: str) -> None:
    name, version = pin.split("=", 1)
    text = (work / "matrix.yaml").read_text()
    start = text.index(f"- tag: {tag}\n")
    end = text.find("\n  - tag:", start + 1)
    end = len(text) if end < 0 else end
    block = text[start:end]
    line = next(ln for ln in block.splitlines() if ln.strip().startswith(f"{name}:"))
    text = text[:start] + block.replace(line, line.split(":")[0] + f": {version}") + text[end:]
    (work / "matrix.yaml").write_text(text)
    sh([sys.executable, "-m", "builder", "lock", tag, "--local-base"], cwd=work)
    sh([sys.executable, "-m", "builder", "render", tag], cwd=work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="cu130-torch2.13-bookworm")
    parser.add_argument("--pin", default="peft=0.21.1", help="NAME=VERSION to change for the third build")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-build-"))
    shutil.copytree(ROOT, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".venv", "build", ".git"))
    results: dict[str, dict[str, tuple[float, int]]] = {"ours": {}, "naive": {}}
    for name, fn in (("ours", ours), ("naive", naive)):
        refs = ["ghcr.io/train-images/train:" + args.tag, "bench/naive:" + args.tag]
        cold_reset(refs)
        if name == "naive":  # the same starting matrix for both
            shutil.copy(ROOT / "matrix.yaml", work / "matrix.yaml")
            shutil.copytree(ROOT / "dockerfiles", work / "dockerfiles", dirs_exist_ok=True)
        for phase in ("cold", "warm", "one pin changed"):
            if phase == "one pin changed":
                change_pin(work, args.tag, args.pin)
            seconds, ref = fn(work, args.tag)
            results[name][phase] = (seconds, size(ref))
            print(f"{name:5} {phase:16} {seconds:7.1f}s  {size(ref) / 1e9:5.2f} GB", flush=True)
    print(f"\nmachine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}; tag {args.tag}; pin {args.pin}")
    print("| phase | ours (s) | naive (s) | ours/naive time | ours GB | naive GB |")
    print("|---|---|---|---|---|---|")
    for phase in ("cold", "warm", "one pin changed"):
        (ot, osz), (nt, nsz) = results["ours"][phase], results["naive"][phase]
        print(f"| {phase} | {ot:.1f} | {nt:.1f} | {ot / nt:.2f} | {osz / 1e9:.2f} | {nsz / 1e9:.2f} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
