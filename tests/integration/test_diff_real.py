"""Real-engine / real-index half of tests/unit/test_diff.py (kept apart so the unit suite needs neither)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, run_cli
from tests.integration.images import build_small
from tests.unit.test_diff import _dockerfile


@pytest.mark.docker
def test_diff_cli_on_real_images(require_docker, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    old = build_small(tmp_path, "diff-old", _dockerfile({"alpha": "1.0", "beta": "2.0"}))
    new = build_small(tmp_path, "diff-new", _dockerfile({"alpha": "1.1", "gamma": "0.1"}))
    matrix = ["--matrix", str(ROOT / "matrix.yaml")]
    assert run_cli(*matrix, "diff", old, new) == 0
    out = capsys.readouterr().out
    assert "| upgraded " in out and "| alpha " in out and "| 1.0 " in out and "| 1.1 " in out
    assert "| removed " in out and "| beta " in out and "| added " in out and "| gamma " in out
    assert "| /opt " in out
    assert run_cli(*matrix, "diff", old, new, "--fail-on", "downgrade") == 0
    assert run_cli(*matrix, "diff", old, new, "--fail-on", "downgrade,removed") == 1
    assert run_cli(*matrix, "diff", new, old, "--fail-on", "downgrade") == 1  # the other way round

