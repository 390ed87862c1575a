"""The image's environment is the user's: no ENV changes what a user's program does for the gate's sake;
the gate (smoke/) sets what it needs in its own processes."""

import os
import re

import pytest

from builder.model import matrix
from smoke import launch
from tests.conftest import ROOT

OFFLINE = re.compile(r"^(HF_|TRANSFORMERS_)\w*OFFLINE")


def image_env(dockerfile: str) -> dict[str, str]:
    """Every NAME=value an ENV instruction of the final stage sets (continuation lines joined)."""
    text = dockerfile.replace("\\\n", " ")
    final = text[text.rindex("\nFROM "):]
    found = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            found.update(re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", line[4:]))
    return found


@pytest.mark.parametrize("tag", [e.tag for e in matrix.load(ROOT / "matrix.yaml").entries])
def test_image_config_sets_no_offline_variable(tag):
    text = (ROOT / "dockerfiles" / tag / "Dockerfile").read_text()
    env = image_env(text)
    assert "TRAIN_IMAGE_FACTS" in env  # the parser reads the runtime stage's ENV
    assert not [k for k in env if OFFLINE.match(k)], f"{tag}: the image forces hub offline mode on every user"


def test_gate_children_run_offline_without_the_image_saying_so(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for mode in ("cpu", "gpu"):
        env = launch.base_env(mode)
        assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in os.environ  # the gate's setting stays in its children's env

