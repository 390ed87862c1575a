"""Compatibility rules reject broken combinations with the rule, the reason and its source."""

from __future__ import annotations

import pytest

from builder.model import compat, matrix
from tests.conftest import VALID_MATRIX


def entry_with(project, old: str, new: str, tag: str = "cu121-torch2.3") -> matrix.Entry:
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace(old, new, 1))
    return matrix.load(project / "matrix.yaml").by_tag()[tag]


def rules_of(entry) -> dict[str, compat.Violation]:
    return {v.rule: v for v in compat.check(entry)}


def test_valid_entries_break_no_rule(project):
    for e in matrix.load(project / "matrix.yaml").entries:
        assert compat.check(e) == []


def test_every_rule_names_a_source():
    data = compat.rules()
    for section in ("torch", "cuda"):
        for key, facts in data[section].items():
            assert facts.get("source"), f"{section}.{key} has no source"
    for release, facts in data["flash_attn"]["releases"].items():
        assert facts.get("source"), release
        assert all(x.get("source") for x in facts.get("extra", [])), release
    assert all(r.get("source") for r in data["packages"] + data["base_os"] + data["rules"])


def test_compat_data_is_complete_and_well_formed():
    from packaging.specifiers import SpecifierSet

    data = compat.rules()
    for minor, facts in data["torch"].items():
        assert {"cuda_builds", "pypi_cuda", "python", "cxx11abi", "cudnn"} <= set(facts), minor
        assert facts["pypi_cuda"] in facts["cuda_builds"], minor
        assert set(facts.get("cxx11abi_builds", {})) <= set(facts["cuda_builds"]), minor
        assert all(b in data["cuda"] for b in facts["cuda_builds"]), f"torch {minor}: a build without driver data"
    for version, release in data["flash_attn"]["releases"].items():
        assert {"python", "cuda_tag", "torch"} <= set(release), version
        for minor, builds in release["torch"].items():
            if minor in data["torch"]:
                assert set(builds) <= set(data["torch"][minor]["cuda_builds"]), (version, minor)
    facts = {"python", "cuda", *matrix.PACKAGES}
    ids = [r["id"] for r in data["rules"]]
    assert len(ids) == len(set(ids))
    for rule in compat.constraint_rules():
        assert rule["kind"] in ("requires", "forbids"), rule["id"]
        for key, spec in {**rule["when"], **rule.get("then", {})}.items():
            assert key in facts, (rule["id"], key)
            assert spec == "*" or SpecifierSet(spec), (rule["id"], spec)
        assert rule["field"] in facts and rule["reason"] and rule["source"], rule["id"]


@pytest.mark.parametrize("old, new, rule, words", [
    ('cuda: "12.1"', 'cuda: "12.4"', "torch-cuda", "has no CUDA 12.4 build"),
    ('python: "3.10"', 'python: "3.12"', "base-python", "Ubuntu 22.04 ships Python 3.10"),
    ("12.1.1-runtime-ubuntu22.04", "11.8.0-devel-ubuntu22.04", "base-cuda-compiler", "mismatches the version"),
    ("flash-attn: 2.6.3", "flash-attn: 2.8.3", "flash-attn-torch", "no prebuilt wheel for torch 2.3"),
    ("flash-attn: 2.6.3", "flash-attn: 2.4.2", "flash-attn-known", "not in the compatibility data"),
    ("transformers: 4.44.2", "transformers: 5.24.0", "transformers-torch", "needs torch >=2.4"),
])
def test_rule_violations(project, old, new, rule, words):
    found = rules_of(entry_with(project, old, new))
    assert rule in found, found
    assert words in found[rule].reason
    assert found[rule].source


@pytest.mark.parametrize("base", [
    "12.4.1-runtime-ubuntu22.04",  # newer CUDA runtime in the base than torch's cu121 wheels
    "12.1.1-cudnn9-runtime-ubuntu22.04",  # cuDNN 9 in the base, torch 2.3 loads its own cuDNN 8
    "12.4.1-cudnn-devel-ubuntu22.04",  # nvcc 12.4 with torch cu121: same major, cpp_extension only warns
])
def test_base_cuda_libraries_do_not_conflict_with_torch_wheels(project, base):
    # torch's pip wheels load their own nvidia-* libraries; transformers' CI and axolotl ship such bases.
    found = rules_of(entry_with(project, "12.1.1-runtime-ubuntu22.04", base))
    assert found == {}, found


def test_python_outside_torch_range(project):
    e = entry_with(project, 'python: "3.11"', 'python: "3.9"', tag="cu130-torch2.13-bookworm")
    found = rules_of(e)
    assert "torch-python" in found and "3.9" in found["torch-python"].reason


def test_pypi_serves_one_cuda_build(project):
    # torch 2.4 has a CUDA 12.4 build, but PyPI serves only cu121: the entry must name PyTorch's index.
    text = VALID_MATRIX.replace("torch: 2.3.1", "torch: 2.4.1").replace('cuda: "12.1"', 'cuda: "12.4"', 1)
    text = text.replace("12.1.1-runtime", "12.4.1-runtime").replace("flash-attn: 2.6.3", "flash-attn: 2.6.3")
    (project / "matrix.yaml").write_text(text)
    found = rules_of(matrix.load(project / "matrix.yaml").by_tag()["cu121-torch2.3"])
    assert "torch-index" in found
    assert "https://download.pytorch.org/whl/cu124" in found["torch-index"].reason


def test_derived_facts(project):
    m = matrix.load(project / "matrix.yaml").by_tag()
    old = compat.derive(m["cu121-torch2.3"])
    assert old["min_driver"] == "525.60.13" and old["cxx11abi"] is False
    assert old["flash_attn_wheel"].endswith(
        "v2.6.3/flash_attn-2.6.3+cu123torch2.3cxx11abiFALSE-cp310-cp310-linux_x86_64.whl")
    new = compat.derive(m["cu130-torch2.13-bookworm"])
    assert new["min_driver"] == "580.65.06" and new["cxx11abi"] is True and new["flash_attn_wheel"] is None


def test_violation_message_has_file_line_rule_and_source(project):
    e = entry_with(project, 'cuda: "12.1"', 'cuda: "12.4"')
    text = compat.check(e)[0].render(e)
    assert text.startswith(f"{project / 'matrix.yaml'}:9: entry 'cu121-torch2.3', field 'cuda': [torch-cuda]")
    assert "(source: https://" in text
