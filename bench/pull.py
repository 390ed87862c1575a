"""Pull + unpack of an image, gzip layers against zstd layers: what a node pays on its first `docker pull`.

The machine's Docker 26 engine holds the tag's image (`builder build TAG`). Each variant is that image with every
layer recompressed by BuildKit (`FROM` the image, `--output type=image,push=true,compression=…,
force-compression=true`) and pushed to a local registry on 127.0.0.1, so the network is not what is measured.
A fresh Docker 26 engine (its own data root, the containerd image store) then pulls the variant: download,
decompress and unpack into the snapshotter, timed. One run, the same layers; only the compression differs.
Each variant is pulled twice, in the order gzip, zstd, zstd, gzip, each time by a new engine after the page cache
was written out and dropped: the previous pull's gigabytes still being written must not slow the next one.

    DOCKER_ENGINE=modern make docker && .venv/bin/python -m builder build TAG --local-base
    .venv/bin/python bench/pull.py [--tag TAG]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.registry_fixture import Registry  # noqa: E402
from tests.integration.second_engine import Engine  # noqa: E402

DOCKER = os.environ.get("BUILDER_DOCKER", "/usr/bin/docker")
MODERN = Path(os.environ.get("MODERN_DOCKER", "/opt/docker-modern"))
VARIANTS = ("gzip", "zstd")


def run(argv: list[str], what: str, env: dict | None = None) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        print((proc.stdout + proc.stderr)[-3000:])
        raise SystemExit(f"✕ {what} failed (exit {proc.returncode}) after {seconds:.0f} s")
    return seconds


def settle() -> None:
    """Write out what earlier steps left dirty and drop the page cache (root only; else just sync)."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def push_variant(image: str, ref: str, compression: str, work: Path) -> float:
    context = work / f"ctx-{compression}"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {image}\n")
    level = ",compression-level=3" if compression == "zstd" else ""
    out = (f"type=image,name={ref},push=true,registry.insecure=true,oci-mediatypes=true,compression={compression},"
           f"force-compression=true{level}")
    return run([DOCKER, "buildx", "build", "--provenance=false", "--output", out, str(context)],
               f"recompress and push {ref}")


def layer_bytes(host: str, name: str, tag: str) -> tuple[int, set[str]]:
    request = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{tag}",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        manifest = json.load(answer)
    return sum(layer["size"] for layer in manifest["layers"]), {layer["mediaType"] for layer in manifest["layers"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="cu130-torch2.13-bookworm")
    args = parser.parse_args()
    image = f"ghcr.io/train-images/train:{args.tag}"
    server = subprocess.run([DOCKER, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    version = server.stdout.strip()
    if not version[:2].isdigit() or int(version.split(".")[0]) < 26:
        print(f"error: the machine's engine is {version or 'not answering'}; this needs Docker >= 26 "
              "(`DOCKER_ENGINE=modern make docker`)", file=sys.stderr)
        return 3
    if subprocess.run([DOCKER, "image", "inspect", image], capture_output=True).returncode != 0:
        print(f"error: {image} is not here: `python -m builder build {args.tag} --local-base` first", file=sys.stderr)
        return 3
    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    registry = Registry(work / "registry").start()
    rows = []
    try:
        pushed = {}
        for compression in VARIANTS:
            ref = f"{registry.host}/bench/train:{compression}"
            seconds = push_variant(image, ref, compression, work)
            size, types = layer_bytes(registry.host, "bench/train", compression)
            pushed[compression] = (ref, seconds, size)
            print(f"✓ {compression}: recompressed and pushed in {seconds:.0f} s, {size / 1e9:.2f} GB of layers "
                  f"({', '.join(sorted(types))})", flush=True)
        times: dict[str, list[float]] = {c: [] for c in VARIANTS}
        for compression in (*VARIANTS, *reversed(VARIANTS)):
            ref = pushed[compression][0]
            node = Engine(modern=MODERN)  # a node that has never seen the image
            try:
                node.start()
                settle()
                seconds = run([DOCKER, "pull", "-q", ref], f"pull {ref}", env=node.env())
            finally:
                node.cleanup()
            times[compression].append(seconds)
            print(f"✓ {compression}: a fresh engine pulled and unpacked it in {seconds:.1f} s", flush=True)
        for compression in VARIANTS:
            _, push_s, size = pushed[compression]
            rows.append((compression, size, push_s, sum(times[compression]) / len(times[compression]),
                         times[compression]))
    finally:
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0][3]
    print(f"\n{args.tag} on Docker {version}, {os.cpu_count()} cores, registry on 127.0.0.1\n")
    print("| layers | compressed size | recompress + push | pull + unpack, fresh engine (mean of 2) | pull / gzip's |")
    print("|---|---:|---:|---:|---:|")
    for compression, size, push_s, mean, each in rows:
        print(f"| {compression} | {size / 1e9:.2f} GB | {push_s:.0f} s | {mean:.1f} s "
              f"({', '.join(f'{s:.1f}' for s in each)}) | {mean / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
