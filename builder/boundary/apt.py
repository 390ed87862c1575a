"""apt inside a base image: what `apt-get install --simulate` would install there, so versions are the base
archive's own. The container needs the network (the archive), nothing else."""

from __future__ import annotations

from collections.abc import Sequence

from builder.boundary import engine
from builder.errors import UserError

TIMEOUT_S = 300
# The base images' docker-clean hook deletes the package lists a simulation needs; lists are fetched fresh.
_PREPARE = "rm -f /etc/apt/apt.conf.d/docker-clean; "


def simulate(image: str, packages: Sequence[str], components: str | None = None) -> tuple[int, str]:
    """(exit code, apt's output: one `Inst NAME (VERSION …)` line per package it would install).

    `components`: archive components to enable besides main (e.g. `contrib non-free` for Debian's nvcc)."""
    enable = ""
    if components:
        enable = (f"sed -i -E 's/^(Components: .*main)$/\\1 {components}/; s/^(deb .* main)$/\\1 {components}/' "
                  "$(find /etc/apt/ -name '*.list' -o -name '*.sources') && ")
    script = (_PREPARE + enable + "apt-get update -qq >/dev/null && apt-get install -s --no-install-recommends "
              + " ".join(packages))
    return engine.run_container(image, ["sh", "-c", script], timeout=TIMEOUT_S, network="host")


def simulate_install(tag: str, image: str, packages: Sequence[str], components: str | None = None) -> str:
    """`simulate`'s output, or a one-line error naming the tag, the packages and apt's last word (exit 2)."""
    code, output = simulate(image, packages, components)
    if code != 0:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        raise UserError(f"{tag}: apt could not resolve {' '.join(packages)} in {image}: {last}")
    return output


def show_from_suite(tag: str, image: str, archive: str, suite: str, components: str, packages: Sequence[str]) -> str:
    """`apt-cache show` of `packages` in another suite's signed index (e.g. trixie from a bookworm base), read
    with its own source list and package lists: the base's sources and state are untouched. A one-line error
    naming the tag, the suite and apt's last word when apt cannot (exit 2)."""
    apart = ("-o Dir::Etc::SourceList=/tmp/suite.list -o Dir::Etc::SourceParts=/dev/null "
             "-o Dir::State::Lists=/tmp/suite-lists -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=")
    script = (_PREPARE + "mkdir -p /tmp/suite-lists/partial && "
              f"echo 'deb {archive} {suite} {components}' > /tmp/suite.list && "
              f"apt-get {apart} update -qq >/dev/null && apt-cache {apart} show --no-all-versions "
              + " ".join(packages))
    code, output = engine.run_container(image, ["sh", "-c", script], timeout=TIMEOUT_S, network="host")
    if code != 0:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        raise UserError(f"{tag}: apt could not read {' '.join(packages)} from {archive} {suite} in {image}: {last}")
    return output
