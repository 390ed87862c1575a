"""Size budgets: the matrix field (sizes with units, a one-line error with its YAML line), the budget derived
from the last release (1.2 ×), and the failure message naming what grew. The build that fails on it, for real:
tests/integration/test_size_budget.py."""

from __future__ import annotations

import pytest

from builder.model import budget, matrix
from builder.steps import diff
from tests.conftest import VALID_MATRIX, run_cli

ENTRY = "  - tag: cu130-torch2.13-bookworm\n"


def with_budget(project, value: str):
    assert ENTRY in VALID_MATRIX
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace(ENTRY, f"{ENTRY}    size_budget: {value}\n"))
    return project / "matrix.yaml"


@pytest.mark.parametrize("value,size", [("6500000000", 6_500_000_000), ("6.5 GB", 6_500_000_000),
                                        ("6000 MiB", 6000 * 2**20), ("6GiB", 6 * 2**30)])
def test_size_budget_in_the_matrix(project, value, size):
    assert matrix.load(with_budget(project, value)).by_tag()["cu130-torch2.13-bookworm"].size_budget == size


@pytest.mark.parametrize("value,needle", [("6.5 TB", "'6.5 TB' is not a size"), ("0", "is not a positive size"),
                                          ("[1]", "expected a size, got list"), ("true", "got bool")])
def test_a_bad_size_budget_is_one_line_naming_field_and_line(project, capsys, value, needle):
    with_budget(project, value)
    assert run_cli("validate") == 2
    err = capsys.readouterr().err
    line = VALID_MATRIX.splitlines().index(ENTRY.rstrip("\n")) + 2
    assert err.startswith(f"error: matrix.yaml:{line}: entry 'cu130-torch2.13-bookworm', field 'size_budget': ")
    assert needle in err and "Traceback" not in err


def test_the_budget_comes_from_the_matrix_else_the_last_release():
    release = {"size_bytes": 5_000_000_000, "full_tag": "cu130-torch2.13-bookworm-…-20261202-abc1234"}
    assert budget.limit(6_000_000_000, "matrix.yaml:12 size_budget", release) == (6_000_000_000,
                                                                                  "matrix.yaml:12 size_budget")
    assert budget.limit(None, "", release) == (6_000_000_000, f"1.2 × the last release {release['full_tag']}")
    assert budget.limit(None, "", None) is None


def test_the_failure_names_the_packages_and_directories_that_grew():
    result = {"packages": [
        {"kind": "python", "name": "torch", "where": "/x", "a": "2.12.0", "b": "2.13.0", "change": "upgraded"},
        {"kind": "python", "name": "extra", "where": "/x", "a": None, "b": "1.0", "change": "added"},
        {"kind": "os", "name": "gcc", "where": "dpkg", "a": "12", "b": None, "change": "removed"}],
        "sizes": [{"dir": "/usr", "a": 10, "b": 2_000_010, "delta": 2_000_000},
                  {"dir": "/opt", "a": 5, "b": 1, "delta": -4}]}
    grew = diff.grown(result)
    assert grew == ["python torch 2.12.0 → 2.13.0 (upgraded)", "python extra 1.0 (added)", "/usr +2.0 MB"]
    text = budget.message(7_000_000_000, (6_000_000_000, "matrix.yaml:12 size_budget"), grew, "sha256:" + "a" * 64)
    assert text == ("the image is 7.00 GB, above its size budget of 6.00 GB (matrix.yaml:12 size_budget); since "
                    "sha256:aaaaaaaaaaaa: python torch 2.12.0 → 2.13.0 (upgraded); python extra 1.0 (added); "
                    "/usr +2.0 MB")
    assert "no earlier image of this tag is here" in budget.message(7, (6, "x"), None, None)
