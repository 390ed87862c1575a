"""Registry build cache between two builders: what a second runner pays for a tag a first one built.

Two Docker 26 engines with separate data roots and their own containerd stand for two CI runners: the
machine's engine (A, started by `DOCKER_ENGINE=modern make docker`) and a private one (B, started here from
the same packages, tests/integration/second_engine.py). A local registry (Debian's docker-registry on
127.0.0.1) holds the cache. Both run `builder build TAG --cache-ref REGISTRY/cache:TAG`, as the workflow does:

  A cold   A's build cache pruned, the tag's image removed: everything built, the cache exported (mode=max)
  B        a fresh engine that has only the base image: every step comes from the registry cache

and the ratio B / A is printed, with each build's time from the same run. The target (issue 25): B ≤ 0.15 × A.

    DOCKER_ENGINE=modern make docker && .venv/bin/python bench/cache.py [--tag TAG]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.registry_fixture import Registry  # noqa: E402
from tests.integration.second_engine import Engine, base_archive  # noqa: E402

DOCKER = os.environ.get("BUILDER_DOCKER", "/usr/bin/docker")
MODERN = Path(os.environ.get("MODERN_DOCKER", "/opt/docker-modern"))


# BuildKit's plain progress: "#31 rewriting layers with source-date-epoch … 80.1s done", "#12 importing cache
# manifest from … 0.4s done": the phases that are not Dockerfile steps, where a build from the cache spends its time.
PHASE = re.compile(r"^\s*#\d+ ((?:exporting|rewriting|sending|importing|writing|preparing|resolving|copying"
                   r"|unpacking|naming)[^\n]*?) ([0-9.]+)s done$", re.M)


def phases(output: str) -> list[tuple[str, float]]:
    """The slowest named phases of a build's output, with "docker load" as builder logs it."""
    found: dict[str, float] = {}
    for name, seconds in PHASE.findall(output):
        name = re.sub(r"sha256:[0-9a-f]{64}", "…", re.sub(r" from \S+| [0-9a-z.:/-]*cache:\S+", "", name))[:70]
        found[name] = found.get(name, 0.0) + float(seconds)
    return sorted(found.items(), key=lambda kv: -kv[1])[:6]


def build(tag: str, cache_ref: str, env: dict, label: str, compression: str) -> float:
    argv = [sys.executable, "-m", "builder", "build", tag, "--local-base", "--force", "--cache-ref", cache_ref,
            "--compression", compression]
    print(f"▶ {label}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    tail = (proc.stdout + proc.stderr).splitlines()
    log = Path(tempfile.gettempdir()) / f"bench-cache-{label.split()[0]}.log"
    log.write_text(proc.stdout + proc.stderr)  # every step's timing, for a closer look
    if proc.returncode != 0:
        print("\n".join(tail[-40:]))
        raise SystemExit(f"✕ {label} failed (exit {proc.returncode}) after {seconds:.0f} s")
    cached = sum(1 for line in tail if line.rstrip().endswith(" CACHED"))
    print(f"✓ {label}: {seconds:.0f} s ({cached} steps from a cache); slowest phases: "
          + ", ".join(f"{name} {s:.1f} s" for name, s in phases(proc.stdout + proc.stderr)), flush=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="cu130-torch2.13-bookworm")
    parser.add_argument("--compression", default="zstd", choices=("zstd", "gzip"),
                        help="of the image's layers and the cache's blobs (build --compression)")
    args = parser.parse_args()
    server = subprocess.run([DOCKER, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    if not server.stdout.strip()[:2].isdigit() or int(server.stdout.split(".")[0]) < 26:
        print(f"error: the machine's engine is {server.stdout.strip() or 'not answering'}; this needs Docker >= 26 "
              "(`DOCKER_ENGINE=modern make docker`)", file=sys.stderr)
        return 3
    work = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    registry = Registry(work / "registry").start()
    cache_ref = f"{registry.host}/cache:{args.tag}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    second = None
    try:
        subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, capture_output=True)
        subprocess.run([DOCKER, "rmi", "-f", f"ghcr.io/train-images/train:{args.tag}"], capture_output=True)
        cold = build(args.tag, cache_ref, env, "A cold", args.compression)
        second = Engine(modern=MODERN)
        second.start()
        second.load(base_archive(work))
        warm = build(args.tag, cache_ref, second.env(PYTHONUNBUFFERED="1"), "B from the registry cache",
                     args.compression)
    finally:
        if second is not None:
            second.cleanup()
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| tag | layers | A cold (build + cache export) | B, another engine, from the cache | B / A |\n"
          "|---|---|---:|---:|---:|")
    print(f"| {args.tag} | {args.compression} | {cold:.0f} s | {warm:.0f} s | {warm / cold:.2f} |")
    print(f"engine {server.stdout.strip()} (both), target B / A ≤ 0.15: {'met' if warm / cold <= 0.15 else 'not met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
