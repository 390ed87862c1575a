"""The rendered apt RUN block, run as written (install simulated) in the local Debian 12 base.

Proves the committed bookworm apt.lock still installs from the live archive, and that when the live archive
lacks a pinned version the block rewrites both source formats to the recorded snapshot and, if that does not
serve it either (here: snapshot.debian.org is unreachable), stops with the one clear error.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT
from tests.integration.images import CI_TAG, DOCKER

BASE = "debian:bookworm-slim"
LOCK = ROOT / "locks" / CI_TAG / "apt.lock"
SNAPSHOT = re.search(r"^# snapshot: \S+ (\d{8}T\d{6}Z)$", LOCK.read_text(), re.M).group(1)  # the committed date
# A deb822 source like the published debian:bookworm-slim has (the local debootstrap base has sources.list).
DEB822 = "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n"


def apt_block(dockerfile) -> str:
    """The RUN script of the apt step as BuildKit runs it (continuations joined), install simulated."""
    text = dockerfile.read_text()
    start = text.index("    rm -f /etc/apt/apt.conf.d/docker-clean")
    block = text[start:text.index("aux-cache", start) + len("aux-cache")]  # the step's layer_end is not run here
    return "set -o pipefail\n" + block.replace("\\\n", "").replace("apt-get install -y -q", "apt-get install -s -q")


def run_block(tmp_path, lock_text: str, extra: str = "") -> subprocess.CompletedProcess:
    script = tmp_path / "apt.sh"
    script.write_text(extra + apt_block(ROOT / "dockerfiles" / CI_TAG / "Dockerfile")
                      .replace("|| { echo \"error: neither", "|| { cat /etc/apt/sources.list.d/*.sources "
                               "/etc/apt/sources.list 2>/dev/null; echo \"error: neither"))
    lock = tmp_path / "apt.lock"
    lock.write_text(lock_text)
    return subprocess.run([DOCKER, "run", "--rm", "--network", "host", "-v", f"{script}:/s.sh:ro",
                           "-v", f"{lock}:/opt/train-image/locks/apt.lock:ro", BASE, "bash", "/s.sh"],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.docker
def test_committed_bookworm_pins_install_from_the_live_archive(require_docker, tmp_path):
    proc = run_block(tmp_path, LOCK.read_text())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Inst g++ (4:12.2.0-3 " in proc.stdout
    assert "retrying from snapshot" not in proc.stderr


@pytest.mark.docker
def test_a_version_gone_from_the_archive_falls_back_to_the_snapshot_then_fails_clearly(require_docker, tmp_path):
    lock_text = LOCK.read_text().replace("g++=4:12.2.0-3\n", "g++=4:12.2.0-999\n")
    extra = f"mkdir -p /etc/apt/sources.list.d && printf '{DEB822}' > /etc/apt/sources.list.d/sec.sources\n"
    proc = run_block(tmp_path, lock_text, extra)
    assert proc.returncode == 1
    assert f"retrying from snapshot http://snapshot.debian.org/archive {SNAPSHOT}" in proc.stderr
    assert f"URIs: http://snapshot.debian.org/archive/debian-security/{SNAPSHOT}/" in proc.stdout
    assert f"http://snapshot.debian.org/archive/debian/{SNAPSHOT}/ bookworm main" in proc.stdout
    assert ("error: neither the live apt archive nor snapshot http://snapshot.debian.org/archive/<archive>/"
            f"{SNAPSHOT} serves every version in apt.lock") in proc.stderr
