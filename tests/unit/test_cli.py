"""The CLI surface: list, matrix JSON, selection by tag and glob, errors without tracebacks."""

from __future__ import annotations

import importlib
import json

import pytest

from builder.steps import VERBS
from tests.conftest import run_cli


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




def test_help_lists_the_verbs(capsys):
    """In-process; `python -m builder --help` as a real process: tests/integration/test_real_processes.py."""
    with pytest.raises(SystemExit) as done:
        run_cli("--help")
    assert done.value.code == 0
    out = capsys.readouterr().out
    for verb in ("validate", "list", "matrix", "resolve", "lock", "render", "build", "smoke"):
        assert verb in out


def test_broken_matrix_is_exit_2_in_one_line(project, capsys):
    (project / "matrix.yaml").write_text("entries: [1\n")
    assert run_cli("validate") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: matrix.yaml:") and "Traceback" not in err


def test_tags_and_all_together_is_a_user_error(project, capsys):
    assert run_cli("list", "cu121-torch2.3", "--all") == 2
    assert "give tags or --all, not both" in capsys.readouterr().err


def test_a_step_on_images_asks_which_one(project, capsys):
    """Building every entry by accident costs hours: a per-tag step wants tags or --all."""
    assert run_cli("build") == 2
    err = capsys.readouterr().err
    assert "which image?" in err and "hint: e.g. " in err


def test_changed_against_an_unreadable_registry_plans_the_rebuild(project, capsys, monkeypatch):
    """A registry that does not answer: unknown counts as changed, so the entry stays in the CI matrix."""
    from builder.boundary import registry
    from builder.errors import EnvironmentProblem

    def unreachable(repo, tag):
        raise EnvironmentProblem("connection refused")

    monkeypatch.setattr(registry, "config_labels", unreachable)
    assert run_cli("matrix", "cu121-torch2.3", "--changed-against", "127.0.0.1:1") == 0
    out, err = capsys.readouterr()
    assert [r["tag"] for r in json.loads(out)["include"]] == ["cu121-torch2.3"]
    assert "cannot read 127.0.0.1:1/train:cu121-torch2.3" in err and "planned for a rebuild" in err


# --- options declared once (builder/flags.py): the field and its flag -------------------------------------


def parsed(*argv):
    from builder import cli

    args = cli.build_parser().parse_args(argv)
    module = importlib.import_module(f"builder.steps.{next(v.module for v in VERBS if v.name == args.verb)}")
    return cli.options_from(args, module.Options)


def test_no_flags_give_the_options_defaults():
    """What a user gets without a flag is what the code's own Options() default says (one default, not two)."""
    from builder.steps import catalog, smoke, verify

    assert parsed("catalog") == catalog.Options()
    assert parsed("smoke", "t") == smoke.Options()
    assert parsed("verify", "r/x@sha256:" + "0" * 64) == verify.Options(image="r/x@sha256:" + "0" * 64)


def test_flags_reach_their_fields_and_nested_inputs():
    options = parsed("build", "t", "--no-cache", "--apt-mirror", "http://m/debian", "--local-base")
    assert options.no_cache and not options.force
    assert options.inputs.apt_mirror == "http://m/debian" and options.inputs.local_base
    assert parsed("smoke", "t", "--timeout", "7").timeout == 7  # type= conversion kept


def test_environment_defaults_are_read_when_the_parser_is_built(monkeypatch):
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GPU_RUNNERS", "true")
    options = parsed("plan")
    assert options.event == "pull_request" and options.gpu_runners
    assert not parsed("plan", "--no-gpu-runners").gpu_runners  # the negation stores into the same field
    monkeypatch.delenv("GITHUB_EVENT_NAME")
    monkeypatch.delenv("GPU_RUNNERS")
    assert parsed("plan").event == "push" and not parsed("plan").gpu_runners


def test_an_environment_default_outside_the_choices_is_refused(monkeypatch, capsys):
    """A workflow triggered by an event plan does not know (pull_request_target runs a fork's code with the
    base repository's secrets) is not planned as a push."""
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request_target")
    with pytest.raises(SystemExit) as done:
        parsed("plan")
    err = capsys.readouterr().err
    assert done.value.code == 2 and "argument --event: 'pull_request_target'" in err and "is not one of" in err
    assert parsed("plan", "--event", "pull_request").event == "pull_request"  # an explicit flag still decides


@pytest.mark.parametrize("argv, says", [
    (("smoke", "t", "--cpu", "--gpus", "all"), "not allowed with argument --cpu"),  # one group excludes
    # The password is read from stdin only; `--password` is no abbreviation of --password-stdin, and the value
    # a user typed after it is not echoed into the log.
    (("publish", "t", "--registry", "r", "--password", "S3cret-pw"), "unrecognized arguments: --password (values"),
    (("login", "--username", "u", "--password-stdin", "--password=S3cret-pw"), "unrecognized arguments: --password"),
])
def test_what_no_flag_allows_is_refused(capsys, argv, says):
    with pytest.raises(SystemExit) as done:
        parsed(*argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and says in err and "S3cret" not in err
