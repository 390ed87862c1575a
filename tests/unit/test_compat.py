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
    assert all(r.get("source") for r in data["packages"] + data["base_os"])


@pytest.mark.parametrize("old, new, rule, words", [
    ('cuda: "12.1"', 'cuda: "12.4"', "torch-cuda", "has no CUDA 12.4 build"),
    ('python: "3.10"', 'python: "3.12"', "base-python", "Ubuntu 22.04 ships Python 3.10"),
    ("12.1.1-runtime-ubuntu22.04", "12.4.1-runtime-ubuntu22.04", "base-cuda", "libcudnn.so.8"),
    ("12.1.1-runtime-ubuntu22.04", "12.1.1-cudnn9-runtime-ubuntu22.04", "base-cudnn", "cuDNN 9"),
    ("flash-attn: 2.6.3", "flash-attn: 2.8.3", "flash-attn-torch", "no prebuilt wheel for torch 2.3"),
    ("flash-attn: 2.6.3", "flash-attn: 2.5.8", "flash-attn-known", "not in the compatibility data"),
    ("transformers: 4.44.2", "transformers: 5.24.0", "transformers-torch", "needs torch >=2.4"),
])
def test_rule_violations(project, old, new, rule, words):
    found = rules_of(entry_with(project, old, new))
    assert rule in found, found
    assert words in found[rule].reason
    assert found[rule].source


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
