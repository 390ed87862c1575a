"""One inputs object for build, repro and lock: the same flags make the same build, and bad values stop at the edge."""

from __future__ import annotations

import shutil

import pytest

from builder import cli
from builder.boundary import baseimage, buildkit
from builder.errors import UserError
from builder.model import context, lockfile, matrix, paths
from builder.model.inputs import Inputs
from builder.steps import build, lock, repro
from tests.conftest import ROOT

FA_TAG = "cu128-torch2.8"  # an entry with flash-attn: the mirror rewrites its lock in the context
MIRRORS = ["--flash-attn-mirror", "http://wheels.local/fa", "--apt-mirror", "http://apt.local/debian",
           "--base-image", "mirror.local:5000/nvidia/cuda:12.8.1-runtime-ubuntu24.04", "--local-base"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for name in ("dockerfiles", "locks", "smoke"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    monkeypatch.chdir(tmp_path)
    # The base is described by the engine (its local image ID); here a fixed one stands in.
    monkeypatch.setattr(buildkit, "source_date_epoch", lambda entry: buildkit.ZIP_EPOCH)  # git: labels only
    monkeypatch.setattr(baseimage, "describe",
                        lambda entry, ref: {"ref": ref, "substituted": True, "image_id": "sha256:" + "1" * 64})
    monkeypatch.setattr(buildkit.engine, "rewrites_timestamps", lambda: False)  # what the engine can: not inputs
    return tmp_path


def options(verb: str, argv: list[str]):
    args = cli.build_parser().parse_args([verb, FA_TAG, *argv])
    module = {"build": build, "repro": repro, "lock": lock}[verb]
    return cli.options_from(args, module.Options)


def planned(verb: str, argv: list[str]) -> str:
    """The input hash the verb's build would have, from its own options."""
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[FA_TAG]
    inputs = options(verb, argv).inputs.resolved(environ={})
    staged = context.stage(entry, inputs, root=paths.CONTEXT_ROOT / verb)
    return buildkit.input_hash(buildkit.spec(entry, inputs, context=staged, ref="x:t", no_cache=verb == "repro"))


def test_build_repro_and_lock_take_the_same_inputs_from_the_same_flags():
    assert options("build", MIRRORS).inputs == options("repro", MIRRORS).inputs == options("lock", MIRRORS).inputs
    assert options("build", MIRRORS).inputs == Inputs(local_base=True, base_image=MIRRORS[5], apt_mirror=MIRRORS[3],
                                                      flash_attn_mirror=MIRRORS[1])


def test_repro_rebuilds_what_a_build_with_mirrors_built(repo):
    """The flash-attn mirror, the apt mirror and the base mirror reach repro's build exactly as build's:
    the same context, the same input hash (repro refuses an image whose input hash differs)."""
    assert planned("repro", MIRRORS) == planned("build", MIRRORS)
    assert planned("build", MIRRORS) != planned("build", MIRRORS[2:])  # the flash-attn mirror is an input
    staged = (paths.CONTEXT_ROOT / "repro" / FA_TAG / lockfile.FLASH_LOCK).read_text()
    assert "flash-attn @ http://wheels.local/fa/flash_attn-2.8.3+cu12torch2.8" in staged
    assert "--hash=sha256:" in staged  # same bytes checked
    assert (repo / "locks" / FA_TAG / lockfile.FLASH_LOCK).read_text() != staged  # the committed lock untouched


@pytest.mark.parametrize("flag,value", [
    ("--apt-mirror", "http://x/debian#;rm -rf /;#"),
    ("--apt-mirror", "http://x/debian&"),
    ("--apt-mirror", "ftp://x/debian"),
    ("--apt-mirror", "http://x/debian\nRUN id"),
    ("--flash-attn-mirror", "http://x/fa $(id)"),
    ("--base-image", "Debian:Bookworm"),
    ("--base-image", "debian:bookworm\nRUN id"),
])
def test_a_bad_flag_value_is_refused_before_anything_runs(repo, capsys, flag, value):
    assert cli.main(["build", FA_TAG, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} ") and "Traceback" not in err
    assert not (repo / "build").exists(), "nothing was staged or written"


def test_secrets_come_from_the_environment_and_never_enter_the_hash(repo):
    plain = Inputs().resolved(environ={})
    secret = Inputs().resolved(environ={"PIP_INDEX_URL": "https://u:tok@idx.local/simple"})
    assert secret.secret_values == ["https://u:tok@idx.local/simple"] and plain == secret
    assert "tok" not in repr(secret)


@pytest.mark.parametrize("where", ["smoke/evil.txt", "locks/cu128-torch2.8/requirements.lock",
                                   "dockerfiles/cu128-torch2.8/image.json"])
def test_a_symlink_never_brings_a_host_file_into_the_context(repo, tmp_path_factory, where, capsys):
    """A link in smoke/, locks/ or dockerfiles/ pointing outside the repository is refused in one line (exit 2),
    and nothing of its target is staged."""
    outside = tmp_path_factory.mktemp("outside") / "secret"
    outside.write_text("host secret\n")
    link = repo / where
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[FA_TAG]
    with pytest.raises(UserError) as caught:
        context.stage(entry, Inputs(), root=paths.CONTEXT_ROOT / "links")
    assert caught.value.exit_code == 2 and "is a symbolic link" in caught.value.message
    staged = repo / paths.CONTEXT_ROOT / "links"
    assert not any("host secret" in p.read_text() for p in staged.rglob("*") if p.is_file())
