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



@pytest.mark.network
def test_a_relock_keeps_the_committed_versions_and_moves_only_the_changed_pin(project, tmp_path):
    """Re-locking after one pin changed must not take newer releases of anything else (PyPI moves every day):
    torch.lock, ops.lock, deepspeed.lock and nvcc.lock stay byte-identical to the committed ones, so the torch
    layer and the ops stage are reused."""
    from tests.conftest import ROOT

    tag = "cu130-torch2.13-bookworm"
    committed = ROOT / "locks" / tag
    out = tmp_path / tag
    out.mkdir()
    for name in (lock.TORCH_LOCK, lock.LOCK, lock.OPS_LOCK, lock.DEEPSPEED_LOCK, lock.NVCC_LOCK):
        (out / name).write_bytes((committed / name).read_bytes())
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace("peft: 0.21.2", "peft: 0.21.1"))
    lock.lock(matrix.load(project / "matrix.yaml").by_tag()[tag], out)
    for name in (lock.TORCH_LOCK, lock.OPS_LOCK, lock.DEEPSPEED_LOCK, lock.NVCC_LOCK):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{name} moved"
    before = lock.parse_blocks((committed / lock.LOCK).read_text())
    after = lock.parse_blocks((out / lock.LOCK).read_text())
    moved = {n for n in before.keys() | after.keys()
             if (before.get(n) and before[n].version) != (after.get(n) and after[n].version)}
    assert moved == {"peft"}, f"a peft change moved {sorted(moved)}"
