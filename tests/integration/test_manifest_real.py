"""Real-engine / real-index half of tests/unit/test_manifest.py (kept apart so the unit suite needs neither)."""

from __future__ import annotations

import json

import pytest

from builder.boundary import imagesave
from builder.model import manifest
from tests.conftest import ROOT
from tests.integration.images import build_small
from tests.unit.test_manifest import DOCKERFILE


@pytest.mark.docker
def test_real_image_manifest(require_docker, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the manifest cache (build/manifests) lands here, not in the checkout
    ref = build_small(tmp_path, "manifest-small", DOCKERFILE)
    m = imagesave.manifest(ref, cache=False)
    files = m["files"]
    assert "data/gone" not in files and "data/opq/old" not in files
    assert files["data/opq/new"]["size"] == 4
    assert files["data/link"]["type"] == "symlink" and files["data/link"]["target"] == "keep/x"
    assert files["data/hard"]["sha256"] == files["data/keep/x"]["sha256"]
    assert files["data/keep"]["mode"] == "0750"
    assert (files["data/keep/x"]["uid"], files["data/keep/x"]["gid"]) == (12, 34)
    names = {p["name"] for p in m["os_packages"]}
    assert {"bash", "dpkg", "libc6"} <= names
    assert len(m["layers"]) >= 3 and all(x["diff_id"].startswith("sha256:") for x in m["layers"])
    assert m["totals"]["files"] > 1000
    # Deterministic: a second, uncached run writes the very same bytes; the cached one agrees.
    assert manifest.dumps(imagesave.manifest(ref, cache=False)) == manifest.dumps(m)
    imagesave.manifest(ref)
    assert manifest.dumps(imagesave.manifest(ref)) == manifest.dumps(m)


@pytest.mark.docker
def test_manifest_cli_writes_json(require_docker, tmp_path, monkeypatch):
    from tests.conftest import run_cli

    ref = build_small(tmp_path, "manifest-small", DOCKERFILE)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "m.json"
    assert run_cli("--matrix", str(ROOT / "matrix.yaml"), "manifest", ref, "-o", str(out)) == 0
    data = json.loads(out.read_text())
    assert "stats" not in data and data["files"]["data/opq/new"]["type"] == "file"

