"""`resolve --import-check` for real: a venv from uv's cache with the entry's packages (torch's CUDA wheels and the
nvidia-* libraries, ~4.7 GB, downloaded once), the training surface imported in it on the CPU.

Measured 2026-12-07 on the 2-core machine: the CI entry from its committed locks 33 s with uv's cache warm (install
4 s hardlinked, imports ~25 s), 104 s from a cold cache (the 4.8 GB download 42 s, DeepSpeed's wheel 15 s); the bad
pair 61 s with torch 2.3.1 cached (resolution, DeepSpeed 0.15.1's wheel built again, imports), 103 s the first time.
With the machine busy (load ~15) the imports alone took 85 s."""

from __future__ import annotations

import shutil
import time

import pytest

from builder.errors import CompatError
from builder.model import matrix
from builder.steps import resolve
from tests.conftest import ROOT, VALID_MATRIX, run_cli

CI_TAG = "cu130-torch2.13-bookworm"
BAD_TAG = "cu121-torch2.3"
# transformers 4.44.2's trainer.py imports is_mlu_available from accelerate.utils whenever accelerate >= 0.21 (its
# declared minimum, so the rules let 0.28.0 pass); accelerate added it in 0.29.0. With 0.28.0 the pins resolve and
# validate, and `from transformers import Trainer` fails (seen running this check, 2026-12-07): ImportError: cannot
# import name 'is_mlu_available' from 'accelerate.utils'. The fixture's cu121-torch2.3 entry (transformers 4.44.2,
# accelerate 0.34.2) with only accelerate changed; on torch >= 2.6 the rules already refuse transformers < 4.47.
BAD_PAIR = {"accelerate: 0.34.2": "accelerate: 0.28.0"}


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory):
    """uv's cache for these tests only, removed after them: torch's CUDA wheels of two builds are ~8 GB that the rest
    of CI's run (one disk, the image builds) does not need. Within the module the second install is warm."""
    folder = tmp_path_factory.mktemp("uv-cache")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def private_uv_cache(uv_cache, monkeypatch):
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))


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
def test_a_pair_that_resolves_but_does_not_import_stops_naming_both_and_the_names_index_agrees(project, capsys):
    text = VALID_MATRIX
    for old, new in BAD_PAIR.items():
        text = text.replace(old, new)
    (project / "matrix.yaml").write_text(text)
    # Two mechanisms, one verdict: validate reads the committed names index offline (transformers 4.44.2's
    # trainer.py imports is_mlu_available at import time; accelerate 0.28.0 lacks it)…
    assert run_cli("validate") == 2
    err = capsys.readouterr().err
    assert "[names-transformers-accelerate]" in err and "is_mlu_available" in err
    # …and the import check, run on the installed packages (the step itself, as `make build` calls it, stops at
    # validate's verdict first; here the check runs alone to show it finds the same pair by importing).
    entry = matrix.load(project / "matrix.yaml").by_tag()[BAD_TAG]
    started = time.monotonic()
    with pytest.raises(CompatError) as failed:
        resolve.import_check(entry)
    assert (f"{BAD_TAG}: transformers 4.44.2 cannot import is_mlu_available from accelerate 0.28.0 "
            "(accelerate.utils): ImportError: cannot import name 'is_mlu_available' from 'accelerate.utils'") in \
        failed.value.message
    assert failed.value.exit_code == 2 and "change one of the two pins" in failed.value.hint
    assert "installing the resolution, without hashes" in capsys.readouterr().err  # the tmp project has no locks
    print(f"import check of the bad pair: {time.monotonic() - started:.0f} s")
