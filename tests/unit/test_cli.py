"""The CLI surface: list, matrix JSON, selection by tag and glob, errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT, run_cli


def test_help_lists_the_verbs():
    out = subprocess.run([sys.executable, "-m", "builder", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    for verb in ("validate", "list", "matrix", "resolve", "lock", "render", "build", "smoke"):
        assert verb in out.stdout


def test_list_table(project, capsys):
    assert run_cli("list") == 0
    out = capsys.readouterr().out
    assert "| tag " in out and "| cu121-torch2.3 " in out and "2.6.3" in out


def test_glob_selection(project, capsys):
    assert run_cli("list", "cu12*-torch2.*") == 0
    out = capsys.readouterr().out
    assert "cu121-torch2.3" in out and "bookworm" not in out


def test_unknown_selection_is_a_user_error(project, capsys):
    assert run_cli("list", "cu999-torch9") == 2
    err = capsys.readouterr().err
    assert "no matrix entry matches 'cu999-torch9'" in err and "Traceback" not in err


def test_github_matrix(project, capsys):
    assert run_cli("matrix", "--format", "github") == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["tag"]: r for r in data["include"]}
    assert rows["cu121-torch2.3"]["gpu"] is True  # runner [self-hosted, linux, x64, gpu]
    assert rows["cu130-torch2.13-bookworm"]["gpu"] is False  # runner [ubuntu-latest]
    # The plan never hands runner labels to the workflow: it picks machines from its own allowlist.
    assert all("runner" not in r for r in rows.values())


def test_missing_matrix_file(project, capsys):
    assert run_cli("--matrix", "nope.yaml", "validate") == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err


def test_subprocess_exit_code_and_no_traceback(project):
    (project / "matrix.yaml").write_text("entries: [1\n")
    proc = subprocess.run([sys.executable, "-m", "builder", "validate"], capture_output=True, text=True, cwd=project,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: matrix.yaml:") and "Traceback" not in proc.stderr


def test_tags_and_all_together_is_a_user_error(project, capsys):
    assert run_cli("list", "cu121-torch2.3", "--all") == 2
    assert "give tags or --all, not both" in capsys.readouterr().err


def test_a_step_on_images_asks_which_one(project, capsys):
    """Building every entry by accident costs hours: a per-tag step wants tags or --all."""
    assert run_cli("build") == 2
    err = capsys.readouterr().err
    assert "which image?" in err and "hint: e.g. " in err


def test_changed_against_an_unreadable_registry_plans_the_rebuild(project, capsys):
    """Nothing answers on port 1: unknown counts as changed, so the entry stays in the CI matrix."""
    assert run_cli("matrix", "cu121-torch2.3", "--changed-against", "127.0.0.1:1") == 0
    out, err = capsys.readouterr()
    assert [r["tag"] for r in json.loads(out)["include"]] == ["cu121-torch2.3"]
    assert "cannot read 127.0.0.1:1/train:cu121-torch2.3" in err and "planned for a rebuild" in err
