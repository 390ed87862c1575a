"""Real-engine / real-index half of tests/unit/test_repro.py (kept apart so the unit suite needs neither)."""

from __future__ import annotations

import json

import pytest

from builder import reports
from builder.boundary import engine
from builder.steps import repro
from tests.conftest import ROOT, run_cli
from tests.integration.images import CI_TAG, MIRROR_FLAGS, build_small, prune_build_cache, remove_images
from tests.unit.test_repro import PLANTED


@pytest.mark.docker
def test_planted_nondeterminism_is_caught_with_the_file_named(require_docker, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one = build_small(tmp_path, "planted-a", PLANTED, no_cache=True)
    two = build_small(tmp_path, "planted-b", PLANTED, no_cache=True)
    r = repro.compare_images(one, two)
    assert not r["ok"]
    assert [(d["path"], d["change"], d["class"]) for d in r["unexplained"]] == [("built-at", "changed", "content")]
    assert r["unexplained"][0]["fields"] == ["sha256"]
    assert r["files_compared"] > 1000 and r["packages"] == {"python_packages": [], "os_packages": []}
    # The base layer is shared; the RUN layer is not.
    assert r["layers"]["same_count"] == len(r["layers"]["a"]) - 1 and not r["layers"]["identical"]


@pytest.mark.docker
def test_real_repro_of_the_ci_entry(ci_build, monkeypatch):
    """Two from-scratch builds of the CI entry (ci_build is one, built through a base mirror, an apt mirror
    and a flash-attn mirror; repro makes the other from the same flags) agree in content."""
    monkeypatch.chdir(ROOT)
    if not ci_build["fast"]:
        # The rebuild uses no cache, and no later test builds the CI entry again: the cache goes first, so the
        # suite's disk peak (two CI images beside each other, here) does not also hold it (~10 GB).
        prune_build_cache()
    try:
        assert run_cli("--matrix", str(ROOT / "matrix.yaml"), "repro", CI_TAG, *MIRROR_FLAGS) == 0
    finally:
        remove_images(f"ghcr.io/train-images/train:{CI_TAG}-repro")
    report = json.loads((ROOT / "build/reports" / f"{CI_TAG}.repro.json").read_text())
    assert reports.problems("repro", report) == []
    assert report["result"] == "reproducible", json.dumps(report["unexplained"][:20], indent=1)
    assert report["unexplained_count"] == 0 and report["packages"] == {"python_packages": [], "os_packages": []}
    assert report["files_compared"] > 30000 and report["bytes_compared"] > 5e9
    # Where the engine rewrites file times (Docker >= 26 + buildx), the rebuild is the same image to the digest:
    # no file differs, not even in mtime, and nothing is allowlisted (the allowlist is empty); elsewhere layers
    # carry the build's times, and the same ID would mean BuildKit merged the two builds.
    rebuilt = report["rebuild"]
    assert rebuilt["timestamps_rewritten"] is engine.rewrites_timestamps()
    assert (rebuilt["id"] == rebuilt["original_id"]) is rebuilt["same_digest"]
    if rebuilt["timestamps_rewritten"]:
        assert report["differences"] == 0 and report["mtime_only"] == 0, json.dumps(report["allowlisted"][:5])
        assert rebuilt["same_digest"] and report["layers"]["identical"]
    else:
        assert not rebuilt["same_digest"]
    assert not report["layers"]["identical"] or report["mtime_only"] == 0  # mtimes are all that may differ

