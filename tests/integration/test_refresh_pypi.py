"""refresh-compat against the real PyPI: what compat.yaml says about torch agrees with the published files."""

from __future__ import annotations

from importlib import resources

import pytest

from builder.model import compat
from builder.steps import refresh


@pytest.mark.network
def test_torch_facts_from_pypi_agree_with_compat_yaml():
    fetched = refresh.torch_from_pypi("2.0")
    known = compat.rules()["torch"]
    assert {"2.3", "2.6", "2.7", "2.13"} <= set(fetched)
    for minor, facts in fetched.items():
        if minor not in known:
            continue  # newer than the data: refresh-compat lists it as an addition
        assert facts["python"] == known[minor]["python"], minor
        assert facts["cxx11abi"] == known[minor]["cxx11abi"], minor
        if "pypi_cuda" in facts:  # only files uploaded with PEP 658 metadata tell the CUDA build
            assert facts["pypi_cuda"] == known[minor]["pypi_cuda"], minor
            assert facts["cudnn"] == known[minor]["cudnn"], minor
    # torch 2.6.0 on PyPI is the cu124 build with the old ABI (the flash-attn ABI rule depends on it).
    assert fetched["2.6"].get("pypi_cuda", "12.4") == "12.4" and fetched["2.6"]["cxx11abi"] is False


@pytest.mark.network
def test_refresh_lists_flash_attn_releases_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "compat.yaml"
    original = (resources.files("builder") / "data/compat.yaml").read_text()
    path.write_text(original)
    code = refresh.main(refresh.Options(compat_file=str(path)))
    out = capsys.readouterr().out
    # PyPI moves on (new torch minors, new flash-attn posts): then it lists each difference and exits 1, so a
    # scheduled job notices; when the data agrees it exits 0. Either way it writes nothing without --write.
    assert (code, bool(out.strip())) in ((0, False), (refresh.DIFFERENCES_EXIT, True)), out[-2000:]
    versions = refresh._flash_versions()
    assert "2.8.3" in versions and "2.7.4.post1" in versions
    assert path.read_text() == original
