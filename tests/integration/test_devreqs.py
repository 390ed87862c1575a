"""requirements-dev.txt installs, hash-checked, on every Python the README promises (3.10 to 3.13).

Resolves against real PyPI with uv for each version (no interpreter of that version needed), and installs
into a real venv of this machine's own Python the way `make venv` does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQS = ROOT / "requirements-dev.txt"
pytestmark = pytest.mark.network


def _uv(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")}
    return subprocess.run([sys.executable, "-m", "uv", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_dev_requirements_install_on(version, tmp_path):
    result = _uv("pip", "install", "--dry-run", "--require-hashes", "--no-deps", "-r", str(REQS),
                 "--python-version", version, "--python-platform", "x86_64-manylinux_2_28",
                 "--no-python-downloads", "--target", str(tmp_path / "t"))
    assert result.returncode == 0, result.stderr
    assert "check-jsonschema==" in result.stderr + result.stdout


def test_dev_requirements_are_the_compiled_input(tmp_path):
    """The .txt holds exactly what `uv pip compile --universal` makes of the .in: nothing missing, extra or outside
    what the .in allows.

    uv starts from the committed pins: a dependency's newer release on PyPI is not drift
    (the .txt moves when someone re-compiles it with --upgrade); a pin the .in no longer allows or needs is."""
    out = tmp_path / "requirements-dev.txt"
    out.write_text(REQS.read_text())
    result = _uv("pip", "compile", str(ROOT / "requirements-dev.in"), "--universal", "--python-version", "3.10",
                 "--no-python-downloads", "--generate-hashes", "--no-header", "--quiet", "-o", str(out))
    assert result.returncode == 0, result.stderr

    def pins(text: str) -> set[str]:
        return {line.split()[0] for line in text.splitlines() if "==" in line and not line.startswith((" ", "#"))}

    assert pins(REQS.read_text()) == pins(out.read_text())


def test_make_venv_installs_them_with_require_hashes(tmp_path):
    """The Makefile's own recipe (pip installs uv's hash-checked entry, uv the rest) on this machine's python3."""
    venv = tmp_path / "venv"
    result = subprocess.run(["make", "-C", str(ROOT), "--no-print-directory", "venv", f"VENV={venv}"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]

    def canonical(pin):  # PEP 503 names: ruamel.yaml and ruamel-yaml are one project
        name, version = pin.split("==")
        return re.sub(r"[-_.]+", "-", name).lower() + "==" + version

    pins = {canonical(line.split()[0]) for line in REQS.read_text().splitlines()
            if "==" in line and line[0] != " " and ";" not in line}  # those with markers may not apply here
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"],
                            capture_output=True, text=True, check=True).stdout
    assert pins <= {canonical(line.strip()) for line in listed.splitlines() if "==" in line}
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
