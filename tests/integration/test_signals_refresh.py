"""The committed PyPI signals data regenerates from real PyPI: a release deleted from a copy of the data is derived
again (its core metadata read from PyPI) and equals the committed row (docker-library's apply-templates + git diff).
"""

from __future__ import annotations

import copy

import pytest

from builder.derive import pypi_signals
from builder.model import signals

# Small packages with few files per release: peft (one wheel, one sdist), DeepSpeed (sdist only: PKG-INFO and
# egg-info/requires.txt), tokenizers (dozens of platform wheels: the tag list).
CASES = [("peft", "0.12.0"), ("deepspeed", "0.15.1"), ("tokenizers", "0.13.3")]


@pytest.mark.network
@pytest.mark.parametrize("name, version", CASES)
def test_a_deleted_release_is_derived_again_as_committed(name, version):
    committed = signals.load(name)
    assert version in committed["releases"], f"{name} {version} is not in the committed data"
    previous = copy.deepcopy(committed)
    del previous["releases"][version]
    doc, reused = pypi_signals.package(name, previous)
    assert doc["releases"][version] == committed["releases"][version]
    # Every other committed release is still published and kept its metadata (PyPI only adds releases).
    assert set(committed["releases"]) <= set(doc["releases"])
    assert reused > 0  # the other releases kept their committed metadata: only the deleted one was read
    assert {k: v for k, v in doc.items() if k != "releases"} == {k: v for k, v in committed.items() if k != "releases"}
