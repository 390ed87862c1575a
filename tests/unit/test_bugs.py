"""Known release bugs (builder/data/knowledge/bugs.yaml, judged by builder/model/bugs.py): the data's schema, and
properties over every row: a stack inside the affected range is judged by the row's effect and scope, the same
stack at fixed_in is not, an acceptance turns a silent rejection into a warning, an unpinned `when` key means
the bug cannot apply."""

from __future__ import annotations

import copy

import pytest
from packaging.specifiers import SpecifierSet

from builder.model import bugs
from builder.model.matrix import PACKAGES, Entry
from tests.unit.test_compat_corpus import complete

ROWS = bugs.rows()
IDS = [row["id"] for row in ROWS]
# The compat.yaml rules that were release bugs; compat corpus cases name these ids.
CARRIED = ("transformers-torch-load-cve", "deepspeed-torch26-weights-only", "transformers-4.51.0-zero3",
           "deepspeed-cuda13-cxx20")


def entry(pins: dict, python: str = "3.11", cuda: str = "12.4") -> Entry:
    """An Entry pinning only `pins` (everything else uninstalled), like test_compat_corpus.complete(): no other
    row can fire on a made-up version."""
    unknown = set(pins) - set(PACKAGES)
    assert not unknown, unknown
    return Entry(tag="bugs-case", image="corpus/train", base="debian:bookworm-slim", python=python, cuda=cuda,
                 pins={p: pins.get(p) for p in PACKAGES}, index_url="https://pypi.org/simple", runner=("corpus",))


def inside(row: dict) -> Entry:
    """A stack inside the row's range: its package at a version in `affected`, every `when` key inside too."""
    pins = {row["package"]: bugs.example_version(row["affected"])}
    env = {"python": "3.11", "cuda": "12.4"}
    for key, spec in (row.get("when") or {}).items():
        (env if key in env else pins)[key] = bugs.example_version(spec)
    return entry(pins, **env)


def moved(stack: Entry, key: str, value: str | None) -> Entry:
    if key in ("python", "cuda"):
        return entry({k: v for k, v in stack.pins.items() if v}, **{"python": stack.python, "cuda": stack.cuda,
                                                                   key: value})
    return entry({**{k: v for k, v in stack.pins.items() if v}, key: value}, python=stack.python, cuda=stack.cuda)


def outcome(stack: Entry, row_id: str, **kwargs):
    return next((o for o in bugs.evaluate(stack, **kwargs) if o.rule == row_id), None)


# --- the data -----------------------------------------------------------------------------------------


def test_every_row_follows_the_schema():
    assert bugs.problems(ROWS) == []
    assert len(ROWS) >= 20
    assert len(IDS) == len(set(IDS))


def test_the_compat_rules_that_were_release_bugs_keep_their_ids():
    assert set(CARRIED) <= set(IDS)


def test_each_family_is_covered():
    packages = {row["package"] for row in ROWS}
    assert {"transformers", "deepspeed", "peft", "torch", "flash-attn", "tokenizers"} <= packages
    assert {row["effect"] for row in ROWS} == {"silent", "crash"}


def test_rows_are_copies():
    rows = bugs.rows()
    rows[0]["affected"] = ">=0"
    assert bugs.rows()[0]["affected"] == ROWS[0]["affected"]


@pytest.mark.parametrize(("change", "expected"), [
    ({"fixed_in": "4.45.0"}, "inside affected"),
    ({"fixed_in": "v4.46.0"}, "canonical"),
    ({"affected": "<=4.46.0"}, "inside affected"),
    ({"affected": ">=5.0"}, "above fixed_in"),
    ({"affected": "~~4"}, "PEP 440"),
    ({"affected": ">4.46,<4.40"}, "contains no version"),
    ({"issue": "https://example.com/issue/1"}, "GitHub"),
    ({"fix": None}, "GitHub"),
    ({"effect": "wrong"}, "effect"),
    ({"scope": "rare"}, "scope"),
    ({"package": "numpy"}, "package"),
    ({"id": "Not Kebab"}, "kebab"),
    ({"symptom": "two\nlines"}, "one non-empty line"),
    ({"when": {"transformers": ">=4"}}, "when key"),
    ({"when": {"numpy": ">=1"}}, "when key"),
    ({"when": {"torch": "nonsense"}}, "satisfiable"),
    ({"needs": "nvcc"}, "needs"),
    ({"fixed_in": None, "fix": None}, "upper bound"),
    ({"surprise": 1}, "unknown keys"),
])
def test_the_schema_check_names_each_broken_field(change, expected):
    row = {**copy.deepcopy(ROWS[0]), **change}
    assert ROWS[0]["package"] == "transformers" and ROWS[0]["affected"] == "<4.46.0"
    found = bugs.problems([row])
    assert any(expected in p for p in found), found


def test_an_unfixed_bug_must_say_which_pins_trigger_it():
    row = {**copy.deepcopy(ROWS[0]), "affected": ">=4.52", "fixed_in": None, "fix": None}
    assert any("without `when`" in p for p in bugs.problems([row]))
    assert bugs.problems([{**row, "when": {"torch": "<2.6"}}]) == []


def test_duplicate_ids_and_missing_keys_are_refused():
    assert any("duplicate id" in p for p in bugs.problems([ROWS[0], ROWS[0]]))
    assert any("missing keys" in p for p in bugs.problems([{"id": "x"}]))
    assert bugs.problems(["not a row"]) == ["row 1: not a mapping"]


def test_example_version_lies_inside_the_range():
    assert bugs.example_version("<4.46.0") == "4.45.99"
    assert bugs.example_version(">=0.17.2,<0.17.5") == "0.17.4"
    assert bugs.example_version("==2.5.0") == "2.5.0"
    assert bugs.example_version(">2,<1") is None


# --- properties over every row ------------------------------------------------------------------------


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_a_stack_inside_the_range_is_judged_by_effect_and_scope(row):
    found = outcome(inside(row), row["id"])
    assert found is not None, f"{row['id']} did not fire inside {row['affected']}"
    rejects = row["scope"] == "common"  # what a typical fine-tune hits rejects; a narrow configuration warns
    assert (found.ok, found.warn) == ((False, False) if rejects else (None, True))
    assert (found.kind, found.field) == ("bug", row["package"])
    assert row["issue"] in found.source and (row["fix"] is None or row["fix"] in found.source)
    assert "\n" not in found.reason and row["affected"] in found.reason
    assert (f"use >= {row['fixed_in']}" if row["fixed_in"] else "not fixed upstream") in found.reason


@pytest.mark.parametrize("row", [r for r in ROWS if r["fixed_in"]], ids=[r["id"] for r in ROWS if r["fixed_in"]])
def test_the_same_stack_at_fixed_in_is_not_judged(row):
    fixed = moved(inside(row), row["package"], row["fixed_in"])
    assert outcome(fixed, row["id"]) is None


@pytest.mark.parametrize("row", [r for r in ROWS if not r["fixed_in"]], ids=[r["id"] for r in ROWS if not r["fixed_in"]])
def test_an_unfixed_bug_stops_applying_outside_its_when(row):
    # fixed_in null: the way out is the other pin; a stack that moves it past the `when` range is not judged.
    for key, spec in row["when"].items():
        outside = [s.version for s in SpecifierSet(spec) if not SpecifierSet(spec).contains(s.version)]
        assert outside, f"{row['id']}: when {key} {spec} names no version outside it"
        assert outcome(moved(inside(row), key, outside[0]), row["id"]) is None


SILENT_COMMON = [r for r in ROWS if r["effect"] == "silent" and r["scope"] == "common"]


@pytest.mark.parametrize("row", SILENT_COMMON, ids=[r["id"] for r in SILENT_COMMON])
def test_accepting_a_silent_bug_turns_the_rejection_into_a_warning(row):
    stack = inside(row)
    for name in (row["id"], row["issue"]):
        found = outcome(stack, row["id"], accepted=(name,))
        assert (found.ok, found.warn) == (None, True)
        assert "accepted by the entry" in found.reason
    assert outcome(stack, row["id"], accepted=("some-other-bug",)).ok is False


@pytest.mark.parametrize("row", [r for r in ROWS if r["effect"] == "crash"],
                         ids=[r["id"] for r in ROWS if r["effect"] == "crash"])
def test_a_crash_cannot_be_accepted_away(row):
    plain = outcome(inside(row), row["id"])
    assert outcome(inside(row), row["id"], accepted=(row["id"], row["issue"])) == plain


WHEN_PINS = [(r, k) for r in ROWS for k in (r.get("when") or {}) if k in PACKAGES]


@pytest.mark.parametrize(("row", "key"), WHEN_PINS, ids=[f"{r['id']}-{k}" for r, k in WHEN_PINS])
def test_a_when_key_the_entry_does_not_pin_means_no_outcome(row, key):
    assert outcome(moved(inside(row), key, None), row["id"]) is None


def test_an_unpinned_package_has_no_bugs():
    row = next(r for r in ROWS if r["package"] == "flash-attn")
    assert outcome(moved(inside(row), "flash-attn", None), row["id"]) is None


def test_a_stack_that_never_compiles_the_ops_skips_ops_bugs():
    row = next(r for r in ROWS if r.get("needs") == "ops")
    assert outcome(inside(row), row["id"]) is not None
    assert outcome(inside(row), row["id"], ops=False) is None


def test_a_release_candidate_inside_the_range_carries_the_bug():
    assert outcome(entry({"transformers": "4.45.0rc1"}), "transformers-grad-accum-loss") is not None
    # PEP 440: `<4.46.0` excludes 4.46.0's own pre-releases, which already carry the fix.
    assert outcome(entry({"transformers": "4.46.0rc1"}), "transformers-grad-accum-loss") is None


def test_a_current_stack_is_clean():
    stack = entry({"torch": "2.13.0", "transformers": "5.24.0", "deepspeed": "0.19.8", "peft": "0.21.2",
                   "accelerate": "1.16.0", "nvidia-ml-py": "13.580.82"}, python="3.12", cuda="13.0")
    assert bugs.evaluate(stack) == []


def test_reason_names_the_pins_and_the_way_out():
    stack = entry({"deepspeed": "0.15.4", "torch": "2.6.0"})
    found = outcome(stack, "deepspeed-torch26-weights-only")
    assert found.reason.startswith("deepspeed 0.15.4 with torch 2.6.0: ")
    assert found.reason.endswith("affected: deepspeed <0.16.0, torch >=2.6; fixed in 0.16.0: use >= 0.16.0")
    cve = outcome(entry({"transformers": "4.52.3", "torch": "2.5.1"}), "transformers-torch-load-cve")
    assert cve.reason.endswith("not fixed upstream: move off torch <2.6") and cve.ok is False


def test_a_malformed_data_file_stops_the_judge(monkeypatch):
    from builder.errors import CompatError

    monkeypatch.setattr(bugs, "_loaded", lambda: ({**ROWS[0], "fixed_in": "4.45.0"},))
    bugs._checked.cache_clear()
    try:
        with pytest.raises(CompatError, match="inside affected"):
            bugs.evaluate(entry({"transformers": "4.44.2"}))
    finally:
        monkeypatch.undo()
        bugs._checked.cache_clear()


def test_an_acceptance_that_names_no_known_bug_rejects_naming_the_field():
    base = {"id": "t", "source": "https://github.com/x/y", "python": "3.11", "cuda": "12.4", "deepspeed": "0.18.0"}
    row = next(r for r in bugs.rows() if r["id"] == "deepspeed-zero12-ga-grads-dropped")
    for known in (row["id"], row["issue"]):
        found = bugs.evaluate(complete({**base, "accept_bugs": [known]}), (known,))
        assert [o.ok for o in found if o.rule == row["id"]] == [None] and not [o for o in found if o.ok is False]
    (typo,) = [o for o in bugs.evaluate(complete(base), ("deepspeed-zero12-ga-grads-droped",)) if o.ok is False
               and o.rule == "accept-bugs-known"]
    assert typo.field == "accept_bugs" and "deepspeed-zero12-ga-grads-droped" in typo.reason
