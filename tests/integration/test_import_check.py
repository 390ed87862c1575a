"""`resolve --import-check` for real: a venv from uv's cache with the entry's packages (torch's CUDA wheels and the
nvidia-* libraries, ~4.7 GB, downloaded once), the training surface imported in it on the CPU.

Measured 2026-12-07 on the 2-core machine: the CI entry from its committed locks 33 s with uv's cache warm (install
4 s hardlinked, imports ~25 s), 104 s from a cold cache (the 4.8 GB download 42 s, DeepSpeed's wheel 15 s); the bad
pair 61 s with torch 2.3.1 cached (resolution, DeepSpeed 0.15.1's wheel built again, imports), 103 s the first time.
With the machine busy (load ~15) the imports alone took 85 s."""

from __future__ import annotations

import time

import pytest

from tests.conftest import ROOT, VALID_MATRIX, run_cli

CI_TAG = "cu130-torch2.13-bookworm"
BAD_TAG = "cu121-torch2.3"
# transformers 4.44.2's trainer.py imports is_mlu_available from accelerate.utils whenever accelerate >= 0.21 (its
# declared minimum, so the rules let 0.28.0 pass); accelerate added it in 0.29.0. With 0.28.0 the pins resolve and
# validate, and `from transformers import Trainer` fails (seen running this check, 2026-12-07): ImportError: cannot
# import name 'is_mlu_available' from 'accelerate.utils'. The fixture's cu121-torch2.3 entry (transformers 4.44.2,
# accelerate 0.34.2) with only accelerate changed; on torch >= 2.6 the rules already refuse transformers < 4.47.
BAD_PAIR = {"accelerate: 0.34.2": "accelerate: 0.28.0"}


@pytest.mark.network
def test_the_ci_entry_imports_from_its_committed_locks(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    started = time.monotonic()
    assert run_cli("resolve", "--import-check", CI_TAG) == 0
    err = capsys.readouterr().err
    assert "is current (made from these inputs): installing it, hash-checked" in err
    for step in ("✓ import torch", "✓ import deepspeed", "✓ from transformers import Trainer, TrainingArguments",
                 "✓ TrainingArguments(deepspeed=<ZeRO-3 dict>)", "✓ from accelerate import Accelerator",
                 "✓ get_peft_model(tiny Llama, LoraConfig)"):
        assert step in err
    print(f"import check of {CI_TAG}: {time.monotonic() - started:.0f} s")


@pytest.mark.network
def test_a_pair_that_resolves_but_does_not_import_stops_with_exit_2_naming_both(project, capsys):
    text = VALID_MATRIX
    for old, new in BAD_PAIR.items():
        text = text.replace(old, new)
    (project / "matrix.yaml").write_text(text)
    assert run_cli("validate") == 0, "the rules must not catch it: the import check is what does"
    capsys.readouterr()
    started = time.monotonic()
    assert run_cli("resolve", "--import-check", BAD_TAG) == 2
    err = capsys.readouterr().err
    assert (f"error: {BAD_TAG}: transformers 4.44.2 cannot import is_mlu_available from accelerate 0.28.0 "
            "(accelerate.utils): ImportError: cannot import name 'is_mlu_available' from 'accelerate.utils'") in err
    assert "hint: change one of the two pins" in err
    assert "installing the resolution, without hashes" in err  # the tmp project has no locks
    print(f"import check of the bad pair: {time.monotonic() - started:.0f} s")
