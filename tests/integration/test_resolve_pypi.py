"""Real-engine / real-index half of tests/unit/test_resolve_lock.py (kept apart so the unit suite needs neither)."""

from __future__ import annotations

import pytest

from builder.errors import CompatError
from builder.model import matrix
from builder.steps import lock, resolve
from tests.conftest import VALID_MATRIX
from tests.unit.test_resolve_lock import real_entry


@pytest.mark.network
@pytest.mark.parametrize("tag", ["cu130-torch2.13-bookworm", "cu121-torch2.3"])
def test_real_pypi_resolution(tag):
    e = real_entry(tag)
    pins = resolve.resolve(e)
    for name, version in e.pins.items():
        if version and name != "flash-attn":
            assert pins[name] == version
    nccl = "nvidia-nccl-cu13" if e.cuda.startswith("13") else "nvidia-nccl-cu12"
    assert nccl in pins, "torch from PyPI must bring its CUDA runtime (nvidia-* wheels)"


@pytest.mark.network
def test_conflict_is_reported_in_plain_words(project):
    # transformers 4.52.4 declares torch<2.7 in its `torch` extra: the resolver must say so.
    text = VALID_MATRIX.replace("transformers: 5.24.0", "transformers: 4.52.4")
    (project / "matrix.yaml").write_text(text)
    e = matrix.load(project / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    with pytest.raises(CompatError) as info:
        resolve.resolve(e)
    assert "do not install together" in info.value.message
    assert "transformers" in info.value.message and "torch" in info.value.message


@pytest.mark.network
def test_torch_layer_survives_a_change_of_another_pin(project):
    """torch.lock decides the multi-GB torch layer: changing peft must leave it byte-identical."""
    entry = matrix.load(project / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    lock.lock(entry, project / "a")
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace("peft: 0.21.2", "peft: 0.21.1"))
    changed = matrix.load(project / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    lock.lock(changed, project / "b")
    assert (project / "a" / lock.TORCH_LOCK).read_bytes() == (project / "b" / lock.TORCH_LOCK).read_bytes()
    assert (project / "a" / lock.LOCK).read_bytes() != (project / "b" / lock.LOCK).read_bytes()
    assert "peft==0.21.1" in (project / "b" / lock.LOCK).read_text()

