"""The rules against real combinations: shipped ones are accepted, reported-broken ones are rejected
by the rule that names their failure. Cases and their sources: tests/unit/data/compat_corpus.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.model import compat
from builder.model.matrix import PACKAGES, Entry

CORPUS = yaml.safe_load((Path(__file__).parent / "data" / "compat_corpus.yaml").read_text())
CASE_KEYS = {"id", "source", "note", "assumed", "rule", "ops", "python", "cuda", "base", "index_url", "gpus",
             "accept_bugs", "class", "failure", *PACKAGES}
# The newest patch of each torch minor, for reports that do not name torch (only `complete` uses it).
TORCH_RELEASES = ("2.13.0", "2.12.0", "2.11.0", "2.10.0", "2.9.1", "2.8.0", "2.7.1", "2.6.0", "2.5.1", "2.4.1",
                  "2.3.1", "2.2.2", "2.1.2", "2.0.1")
# A base with no CUDA libraries and no compiler: the base rules have nothing to say about it.
NEUTRAL_BASE = "debian:bookworm-slim"


def default_torch(python: str, cuda: str) -> str:
    """Newest torch with a `cuda` build that supports `python`: a table lookup, blind to every other rule."""
    for release in TORCH_RELEASES:
        facts = compat.rules()["torch"][compat.minor(release)]
        if cuda in facts["cuda_builds"] and Version(python) in SpecifierSet(facts["python"]):
            return release
    raise AssertionError(f"no torch release with CUDA {cuda} and Python {python}")


def index_for(torch: str, cuda: str) -> str:
    """The index that serves this build, as the source projects install it (PyPI or PyTorch's per-CUDA index)."""
    facts = compat.rules()["torch"][compat.minor(torch)]
    if facts["pypi_cuda"] == cuda:
        return "https://pypi.org/simple"
    return "https://download.pytorch.org/whl/cu" + cuda.replace(".", "")


def complete(case: dict) -> Entry:
    """A full Entry from a partial case. Packages the case does not pin stay uninstalled (None), so no
    rule can fire or be silenced by a made-up version; torch defaults by table lookup; the base is a
    plain OS image; the index is the one that serves the torch build."""
    unknown = set(case) - CASE_KEYS
    assert not unknown, f"{case['id']}: unknown keys {unknown}"
    pins = {p: case.get(p) for p in PACKAGES}
    pins["torch"] = pins["torch"] or default_torch(case["python"], case["cuda"])
    return Entry(
        tag=f"corpus-{case['id']}"[:120].lower(), image="corpus/train", base=case.get("base", NEUTRAL_BASE),
        python=case["python"], cuda=case["cuda"], pins=pins,
        index_url=case.get("index_url") or index_for(pins["torch"], case["cuda"]),
        runner=("corpus",), source=case["source"], gpus=tuple(case["gpus"]) if case.get("gpus") else None,
        accept_bugs=tuple(case.get("accept_bugs", ())),
    )


def violated(entry: Entry, ops: bool = True) -> dict[str, compat.Violation]:
    # recipe=False: base-os/base-python describe this project's Dockerfile (the base's own python3);
    # the corpus projects bring their own Python (conda, NGC), which is not a compatibility failure.
    # ops=False for a case whose stack never compiles DeepSpeed's CUDA ops (its `ops: false` says why).
    return {v.rule: v for v in compat.check(entry, recipe=False, ops=ops)}


def test_corpus_size_and_sources():
    # 69 cases before issue 22, 62 added from sources not used before (lock files of h2o-llmstudio, open-instruct,
    # OpenRLHF and SimPO; failure reports): the corpus only grows.
    assert len(CORPUS["good"]) >= 78 and len(CORPUS["bad"]) >= 53
    ids = [c["id"] for c in CORPUS["good"] + CORPUS["bad"]]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for case in CORPUS["good"] + CORPUS["bad"]:
        assert case["source"].startswith("https://github.com/"), case["id"]
        assert isinstance(case["python"], str) and isinstance(case["cuda"], str), case["id"]


@pytest.mark.parametrize("case", CORPUS["good"], ids=[c["id"] for c in CORPUS["good"]])
def test_shipped_combination_is_accepted(case):
    found = violated(complete(case), ops=case.get("ops", True))
    assert found == {}, f"{case['id']} ({case['source']}) wrongly rejected: " + "; ".join(
        f"[{r}] {v.reason}" for r, v in found.items())


@pytest.mark.parametrize("case", CORPUS["bad"], ids=[c["id"] for c in CORPUS["bad"]])
def test_reported_failure_is_rejected_by_its_rule(case):
    found = violated(complete(case))
    assert case["rule"] in found, f"{case['id']} ({case['source']}) not rejected by [{case['rule']}]; got {found}"
    assert found[case["rule"]].source, "every rejection names its evidence"


@pytest.mark.parametrize("case", CORPUS["good"] + CORPUS["bad"], ids=[c["id"] for c in CORPUS["good"] + CORPUS["bad"]])
def test_defaults_alone_break_nothing(case):
    # The completed entry without the case's own package pins (torch kept where the case names it):
    # whatever a bad case is rejected for must come from what its source states, not from a default.
    bare = {k: case[k] for k in ("id", "source", "python", "cuda", "torch") if k in case}
    if case.get("rule") in ("torch-cuda", "torch-python"):
        bare.pop("torch")  # the torch pin itself is the failure; let the table pick one that exists
    assert violated(complete(bare)) == {}, case["id"]


@pytest.mark.parametrize("case", [c for c in CORPUS["bad"] if c["rule"] not in ("torch-cuda", "torch-python")],
                         ids=[c["id"] for c in CORPUS["bad"] if c["rule"] not in ("torch-cuda", "torch-python")])
def test_the_named_rule_needs_the_reported_pins(case):
    # Remove the pin (or base) the rule is about: the same rule must no longer fire, so it is the
    # reported versions that trigger it.
    field = next(v.field for v in compat.check(complete(case), recipe=False) if v.rule == case["rule"])
    reduced = {k: v for k, v in case.items() if k != field}
    assert case["rule"] not in violated(complete(reduced)), case["id"]


def test_flash_attn_wheel_follows_the_torch_build():
    # The same torch 2.6.0 with PyPI's cu124 build and PyTorch's cu126 build gets wheels of opposite ABI.
    cu124 = complete({"id": "a", "source": "s", "python": "3.11", "cuda": "12.4", "torch": "2.6.0",
                      "flash-attn": "2.7.4.post1"})
    cu126 = complete({"id": "b", "source": "s", "python": "3.11", "cuda": "12.6", "torch": "2.6.0",
                      "flash-attn": "2.8.3"})
    assert compat.derive(cu124)["flash_attn_wheel"].endswith("+cu12torch2.6cxx11abiFALSE-cp311-cp311-linux_x86_64.whl")
    assert compat.derive(cu126)["flash_attn_wheel"].endswith("+cu12torch2.6cxx11abiTRUE-cp311-cp311-linux_x86_64.whl")
    assert violated(cu124) == {} and violated(cu126) == {}
