"""The names index grows from the published files alone: a release taken out of a copy of the committed index is
read again from PyPI by `refresh-compat --api --release`, and the index comes back byte for byte; the judgment on a
stack with that release is the committed one again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builder.derive import api_index
from builder.model import names
from tests.conftest import ROOT

pytestmark = pytest.mark.network

# A release the committed index holds, as consumer (it imports torch, transformers, deepspeed…) and as provider
# (transformers and peft import from it); its wheel is 0.3 MB.
VICTIM = ("accelerate", "1.0.0")


def drop(index: api_index.Index, name: str, version: str) -> None:
    del index.releases[name][version]
    index.uses[name].pop(version, None)
    for per_release in index.status[name].values():
        per_release.pop(version, None)


def test_refresh_compat_reads_a_release_absent_from_the_index_back_from_its_published_file(tmp_path):
    committed = api_index.Index.load()
    if VICTIM[1] not in committed.releases.get(VICTIM[0], {}):
        pytest.fail(f"{VICTIM} is not in the committed index: choose another release for this test")
    reduced = api_index.Index.load()
    drop(reduced, *VICTIM)
    reduced.write(tmp_path / "api")
    assert VICTIM[1] not in json.loads((tmp_path / "api" / f"{VICTIM[0]}.json").read_text())["releases"]

    proc = subprocess.run([sys.executable, "-m", "builder", "refresh-compat", "--api", "--release",
                           f"{VICTIM[0]}=={VICTIM[1]}", "--knowledge-dir", str(tmp_path), "--write"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{VICTIM[0]}-{VICTIM[1]}" in proc.stderr  # the file it read, named with its hash
    for name, text in committed.texts().items():
        assert (tmp_path / "api" / name).read_text() == text, f"{name} differs after re-reading {VICTIM}"


def test_the_same_refresh_without_write_reports_the_difference_and_writes_nothing(tmp_path):
    reduced = api_index.Index.load()
    drop(reduced, *VICTIM)
    reduced.write(tmp_path / "api")
    before = (tmp_path / "api" / f"{VICTIM[0]}.json").read_text()
    proc = subprocess.run([sys.executable, "-m", "builder", "refresh-compat", "--api", "--release",
                           f"{VICTIM[0]}=={VICTIM[1]}", "--knowledge-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and f"api/{VICTIM[0]}.json" in proc.stdout + proc.stderr
    assert (tmp_path / "api" / f"{VICTIM[0]}.json").read_text() == before
    assert names.index()  # the package's own index was not touched
