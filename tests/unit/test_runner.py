"""One failure policy for every step: failures don't stop other tags, Ctrl-C stops everything cleanly,
the exit code is the most actionable failure kind, and one process works on a tag at a time."""

from __future__ import annotations

import pytest

from builder import runner
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.model import matrix
from builder.steps import Done


@pytest.fixture
def entries(project):
    return list(matrix.load(project / "matrix.yaml").entries)


def test_a_failed_tag_does_not_stop_the_others(entries, capsys):
    ran = []

    def step(entry):
        ran.append(entry.tag)
        if entry is entries[0]:
            raise StepFailed(f"{entry.tag}: broke")
        return Done("built", "fine")

    outcomes = runner.run("build", entries, step)
    assert ran == [e.tag for e in entries]
    assert [o.result for o in outcomes] == ["failed", "built"]
    assert runner.exit_code(outcomes) == 1
    err = capsys.readouterr().err
    assert "build: 1 of 2 ok" in err and "✕ failed" in err and "✓ built" in err


def test_ctrl_c_stops_at_once_and_says_what_did_not_run(entries):
    def step(entry):
        raise KeyboardInterrupt

    outcomes = runner.run("publish", entries, step)
    assert [o.result for o in outcomes] == ["interrupted", "not run"]
    assert runner.exit_code(outcomes) == 130


def test_sigterm_stops_like_ctrl_c_with_exit_143(entries, monkeypatch, capsys):
    """A cancelled CI job or a stopped pod (SIGTERM) takes the Ctrl-C path: nothing more runs, the summary says
    so, and `python -m builder` exits 143 (128 + SIGTERM), through the handler the CLI installs."""
    from builder import cli
    from builder.errors import Terminated

    def step(entry):
        cli._terminate(15, None)

    outcomes = runner.run("publish", entries, step)
    assert [o.result for o in outcomes] == ["terminated", "not run"]
    assert runner.exit_code(outcomes) == 143
    monkeypatch.setattr(cli, "_matrix", lambda args: (_ for _ in ()).throw(Terminated()))
    assert cli.main(["validate"]) == 143
    assert capsys.readouterr().err.strip().endswith("terminated")


@pytest.mark.parametrize("errors, code", [
    ([StepFailed("x")], 1),
    ([EnvironmentProblem("x"), StepFailed("y")], 3),
    ([StepFailed("x"), UserError("y")], 2),  # bad input first: nothing else can be fixed before it
])
def test_exit_code_is_the_most_actionable_failure(entries, errors, code):
    queue = list(errors)

    def step(entry):
        raise queue.pop(0)

    assert runner.exit_code(runner.run("smoke", entries[:len(errors)], step)) == code


