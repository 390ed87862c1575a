"""The image's start-up hook for an arbitrary UID and an unwritable home (builder/data/train_image_env.py, run by a
.pth line at every Python start in the image). In-process here; in each CI image as UID 12345 on a read-only root:
tests/integration/test_arbitrary_uid.py."""

from __future__ import annotations

import importlib.util
import os
import pwd
from pathlib import Path

import pytest

from builder.steps import render

HOOK = Path(__file__).resolve().parents[2] / "builder" / "data" / "train_image_env.py"


@pytest.fixture
def hook():
    spec = importlib.util.spec_from_file_location("train_image_env_under_test", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs _settle() on this process's own environment: a no-op for root here
    return module


def _as(monkeypatch, tmp_path, uid: int, known: bool, home_writable: bool):
    monkeypatch.setattr(os, "getuid", lambda: uid)
    def getpwuid(u):
        if not known:
            raise KeyError(f"getpwuid(): uid not found: {u}")
        return ("u", "x", u)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(os, "access", lambda path, mode: home_writable)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))


def test_an_unknown_uid_with_an_unwritable_home_gets_a_name_and_caches_under_the_temp_dir(hook, monkeypatch, tmp_path):
    _as(monkeypatch, tmp_path, 12345, known=False, home_writable=False)
    env = {"HOME": "/", "PATH": "/usr/bin"}
    hook._settle(env)
    assert env["USER"] == env["LOGNAME"] == "uid12345"  # what getpass.getuser() returns instead of KeyError
    root = tmp_path / "home-12345"
    assert env["XDG_CACHE_HOME"] == str(root / ".cache") and env["XDG_CONFIG_HOME"] == str(root / ".config")
    assert env["TRITON_HOME"] == str(root) and root.is_dir() and oct(root.stat().st_mode & 0o777) == "0o700"


def test_what_the_user_set_wins_and_a_served_user_is_left_alone(hook, monkeypatch, tmp_path):
    _as(monkeypatch, tmp_path, 12345, known=False, home_writable=False)
    env = {"HOME": "/", "USER": "alice", "XDG_CACHE_HOME": "/data/cache"}
    hook._settle(env)
    assert env["USER"] == "alice" and "LOGNAME" not in env and env["XDG_CACHE_HOME"] == "/data/cache"
    _as(monkeypatch, tmp_path, 1000, known=True, home_writable=True)
    env = {"HOME": "/home/u"}
    hook._settle(env)
    assert env == {"HOME": "/home/u"}, "a user with a passwd entry and a writable home: nothing changes"


def test_every_rendered_tag_ships_the_hook_and_loads_it_at_start(hook):
    assert render._data(render.ANY_USER) == HOOK.read_text()
    for tag_dir in (Path(__file__).resolve().parents[2] / "dockerfiles").iterdir():
        dockerfile = (tag_dir / "Dockerfile").read_text()
        assert (tag_dir / render.ANY_USER).read_text() == HOOK.read_text(), tag_dir.name
        assert (tag_dir / render.ANY_USER_PTH).read_text() == "import train_image_env\n", tag_dir.name
        assert "/train_image_env.py" in dockerfile and "train-image-env.pth" in dockerfile, tag_dir.name
