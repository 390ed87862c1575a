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



def test_gate_caches_go_to_the_temp_dir_only_when_home_is_not_writable(monkeypatch, tmp_path):
    for name in ("XDG_CACHE_HOME", "TRITON_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(launch.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR afresh
    monkeypatch.setenv("HOME", str(tmp_path / "no-such-home"))  # HOME=/ of an arbitrary UID: not writable
    env = launch.base_env("cpu")
    root = str(tmp_path / f"smoke-home-{os.getuid()}")
    assert (env["XDG_CACHE_HOME"], env["TRITON_HOME"]) == (root + "/.cache", root)
    assert "XDG_CACHE_HOME" not in os.environ  # the gate's choice, in its children only
    monkeypatch.setenv("XDG_CACHE_HOME", "/data/cache")
    assert launch.base_env("cpu")["XDG_CACHE_HOME"] == "/data/cache", "a user's own setting wins"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))  # a writable HOME: every cache keeps its usual place
    env = launch.base_env("gpu")
    assert "XDG_CACHE_HOME" not in env and "TRITON_HOME" not in env
