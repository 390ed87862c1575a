"""archs.yaml regenerated in part from real PyPI: one flash-attn sdist (8 MB) read again gives the committed row."""

from __future__ import annotations

import pytest

from builder.boundary import pypi
from builder.derive import archs as derive
from builder.model import archs


@pytest.mark.network
@pytest.mark.parametrize("version", ["2.8.3", "2.5.8"])
def test_a_flash_attn_row_derived_again_from_its_sdist(version):
    committed = archs.data()["flash_attn"][version]
    sdist = next(f for f in pypi.project("flash-attn")["releases"][version] if f["packagetype"] == "sdist")
    assert (sdist["filename"], sdist["digests"]["sha256"]) == (committed["sdist"], committed["sha256"])
    setup_py, flash_api = derive.sdist_sources(pypi.fetch_file("flash-attn", sdist))
    # wheel_nvcc comes from the release's publish.yml on GitHub, not from the sdist: the committed one is reused.
    row = derive.flash_attn_archs(setup_py, flash_api, committed.get("wheel_nvcc"))
    assert {k: v for k, v in committed.items() if k in row} == row
