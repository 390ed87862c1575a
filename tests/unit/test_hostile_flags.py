"""Hostile flags, image names and `docker save` archives: refused before any Docker or registry I/O
(exit 2, not 3), without a traceback and without echoing a credential."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time

import pytest

from builder.boundary import engine, registry
from builder.errors import UserError
from builder.steps import publish
from tests.conftest import run_cli
from tests.unit.hostile import SECRET, assert_refused

TAG = "cu121-torch2.3"


class EngineTouched(AssertionError):
    pass


@pytest.fixture
def no_engine(monkeypatch):
    """Any Docker or registry access fails the test loudly (it is not a BuilderError, so it shows)."""
    def touched(*args, **kwargs):
        raise EngineTouched("Docker/registry I/O before the flags were checked")

    for name in ("sdk", "client", "image_or_none", "run_cli", "run_container"):
        if hasattr(engine, name):
            monkeypatch.setattr(engine, name, touched)
    monkeypatch.setattr(registry, "manifest_digest", touched)


PUBLISH_CASES = [
    (["--registry", f"bob:{SECRET}@ghcr.io/acme"], ["--registry", "credentials"]),
    (["--registry", f"https://bob:{SECRET}@ghcr.io/acme"], ["--registry", "credentials"]),
    (["--registry", f"{SECRET}@ghcr.io"], ["--registry", "credentials"]),
    (["--registry", "https://ghcr.io/acme"], ["--registry", "is a URL"]),
    (["--registry", "ghcr.io/Acme"], ["--registry", "HOST[:PORT][/NAMESPACE]"]),
    (["--registry", "ghcr.io/../x"], ["--registry", "HOST[:PORT][/NAMESPACE]"]),
    (["--registry", "ghcr.io//x"], ["--registry", "HOST[:PORT][/NAMESPACE]"]),
    (["--registry", "ghcr.io/acme\n"], ["--registry", "control characters"]),
    (["--registry", ""], ["--registry is empty"]),
    (["--registry", "ghcr.io:99999"], ["port 99999"]),
    (["--registry=-ghcr.io"], ["--registry", "HOST[:PORT][/NAMESPACE]"]),
    (["--registry", "ghcr.io/acme?x=1"], ["--registry", "HOST[:PORT][/NAMESPACE]"]),
    (["--registry", "ghcr.io", "--date", "2026-12-02"], ["--date", "YYYYMMDD"]),
    (["--registry", "ghcr.io", "--date", "20261340"], ["--date", "YYYYMMDD"]),
    (["--registry", "ghcr.io", "--date", "19991231"], ["--date"]),
    (["--registry", "ghcr.io", "--date", "20261202\n"], ["--date"]),
    (["--registry", "ghcr.io", "--retries", "0"], ["--retries 0", "1 to 10"]),
    (["--registry", "ghcr.io", "--retries", "-1"], ["--retries -1"]),
    (["--registry", "ghcr.io", "--retries", "1000000"], ["--retries 1000000"]),
    (["--registry", "ghcr.io", "--username", "bob"], ["--username needs --password-stdin"]),
    (["--registry", "ghcr.io", "--password-stdin"], ["--password-stdin needs --username"]),
    (["--registry", "ghcr.io", "--username", "bob smith", "--password-stdin"], ["--username is not a user name"]),
    (["--registry", "ghcr.io", "--username", "bob\nx", "--password-stdin"], ["--username"]),
    (["--registry", "ghcr.io", "--revision", "$(id)"], ["--revision"]),
]


@pytest.mark.parametrize("flags, needles", PUBLISH_CASES, ids=[f"publish-{i}" for i in range(len(PUBLISH_CASES))])
def test_publish_flags_refused_before_docker(project, capsys, no_engine, flags, needles):
    assert_refused(project, capsys, ["publish", TAG, *flags], 2, *needles)


def test_validate_options_is_pure_and_accepts_good_flags():
    publish.validate_options("127.0.0.1:5000", "20261202", 3, "bob", True, "a94488e")
    publish.validate_options("ghcr.io/acme/team", None, 10)
    publish.validate_options("[::1]:5000/ns", "20240229", 1)
    with pytest.raises(UserError) as info:
        publish.validate_options(f"user:{SECRET}@ghcr.io")
    assert SECRET not in str(info.value)


BAD_NAMES = ["upper/CASE", "a b", "x:tag:tag", "_rf", "image\n", "a" * 300, "@sha256:" + "a" * 64,
             "debian@sha256:xyz", "ghcr.io/acme/" + "../etc"]


@pytest.mark.parametrize("verb", ["manifest", "verify", "diff"])
@pytest.mark.parametrize("name", BAD_NAMES, ids=[f"name{i}" for i in range(len(BAD_NAMES))])
def test_invalid_image_names_refused_before_docker(project, capsys, no_engine, verb, name):
    argv = [verb, name] + (["debian:bookworm-slim"] if verb == "diff" else [])
    assert_refused(project, capsys, argv, 2, "is not an image reference")


# --- docker save archives -----------------------------------------------------------------------------


def _tar(members: dict[str, bytes], fmt=tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _save(layer_members=None, manifest=None, config=None, extra=None, layer=None) -> bytes:
    layer = layer or _tar(layer_members or {"etc/hostname": b"box\n"})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()  # the layer's own digest, as Docker writes it
    config = config if config is not None else json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    manifest = manifest if manifest is not None else json.dumps(
        [{"Config": "cfg.json", "RepoTags": ["x:1"], "Layers": ["l1/layer.tar"]}]).encode()
    return _tar({"cfg.json": config, "l1/layer.tar": layer, "manifest.json": manifest, **(extra or {})})


def _huge_size_header() -> bytes:
    data = bytearray(_save())
    info = tarfile.TarInfo("cfg.json")
    info.size = 8 << 30  # claims 8 GB, the file ends long before
    return bytes(info.tobuf(tarfile.GNU_FORMAT)) + bytes(data[512:2048])


def _pax_zero_length() -> bytes:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    body = b"0 \n" + b"\0" * 509
    header.size = 3
    return header.tobuf(tarfile.USTAR_FORMAT) + body + _save()


ARCHIVES = {
    "empty": (b"", "no manifest.json"),
    "random-bytes": (bytes(range(256)) * 8, "not a valid `docker save` archive"),
    "truncated": (_save()[:1500], "not a valid `docker save` archive"),
    "no-manifest": (_tar({"cfg.json": b"{}"}), "no manifest.json"),
    "manifest-not-json": (_save(manifest=b"{nope"), "manifest.json is not valid JSON"),
    "manifest-object": (_save(manifest=b"{}"), "not a non-empty list"),
    "manifest-empty-list": (_save(manifest=b"[]"), "not a non-empty list"),
    "manifest-config-int": (_save(manifest=b'[{"Config": 1, "Layers": []}]'), "lacks `Config`"),
    "config-traversal": (_save(manifest=b'[{"Config": "../../etc/passwd", "Layers": []}]'), "lacks its image config"),
    "layer-traversal": (_save(manifest=b'[{"Config": "cfg.json", "Layers": ["../../../etc/shadow"]}]'),
                        "lacks layers"),
    "config-not-json": (_save(config=b"\xff\xfe"), "cfg.json is not valid JSON"),
    "config-rootfs-list": (_save(config=b'{"rootfs": []}'), "not an image config"),
    "huge-member": (_huge_size_header(), "not a valid `docker save` archive"),
    "pax-zero-length": (_pax_zero_length(), "not a valid `docker save` archive"),
    "gzip-garbage-layer": (_save(extra={"l2/layer.tar": b"\x1f\x8b" + b"\0" * 100}), "not a valid"),
    "deep-json": (_save(manifest=b"[" * 100_000 + b"]" * 100_000), "not a valid"),
}


@pytest.mark.parametrize("data, needle", list(ARCHIVES.values()), ids=list(ARCHIVES))
def test_malformed_archives_are_clear_errors_without_an_engine(project, capsys, no_engine, data, needle):
    (project / "image.tar").write_bytes(data)
    started = time.monotonic()
    assert_refused(project, capsys, ["manifest", "image.tar"], 2, "image.tar", needle)
    assert time.monotonic() - started < 10, "a hostile archive must not hang the reader"


def test_archive_path_that_is_a_directory(project, capsys, no_engine):
    (project / "saved").mkdir()
    assert_refused(project, capsys, ["manifest", "./saved"], 2, "saved", "is a directory")


def test_device_is_not_read_as_an_archive(project, capsys, no_engine):
    assert_refused(project, capsys, ["manifest", "/dev/zero"], 2, "/dev/zero", "not a regular file")


def test_tar_file_needs_no_engine_and_absolute_names_stay_inside(project, capsys, no_engine):
    data = _save(layer_members={"/etc/passwd": b"root:x:0:0\n", "usr/bin/tool": b"#!/bin/sh\n"})
    (project / "image.tar").write_bytes(data)
    assert run_cli("manifest", "image.tar", "-o", "m.json") == 0, capsys.readouterr().err
    files = json.loads((project / "m.json").read_text())["files"]
    assert set(files) == {"etc/passwd", "usr/bin/tool"}  # under the image's root, as Docker applies it; nothing extracted
    assert not (project.parent.parent / "etc").exists()


@pytest.mark.parametrize("members", [{"../../etc/passwd": b"root:x:0:0\n"}, {"usr/../../../x": b"x"}],
                         ids=["dot-dot", "dot-dot-inside"])
def test_layer_names_climbing_out_of_the_root_are_refused(project, capsys, no_engine, members):
    """Docker refuses to apply such a layer (a breakout); the manifest does not list it as if it were inside."""
    (project / "image.tar").write_bytes(_save(layer_members=members))
    assert_refused(project, capsys, ["manifest", "image.tar"], 2, "image.tar", "leaves the image's root")


def _links(kind: bytes, target: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("etc/link")
        info.type, info.linkname = kind, target
        tar.addfile(info)
    return buf.getvalue()


def test_hard_link_out_of_the_root_is_refused_and_a_symlink_is_only_listed(project, capsys, no_engine):
    """A hard link's target is a path in the image (Docker refuses one that climbs out); a symlink's target is
    text the manifest records, never followed: nothing on this machine is read or written through either."""
    (project / "image.tar").write_bytes(_save(layer=_links(tarfile.LNKTYPE, "../../../etc/shadow")))
    assert_refused(project, capsys, ["manifest", "image.tar"], 2, "image.tar", "hard link's target leaves")
    (project / "image.tar").write_bytes(_save(layer=_links(tarfile.SYMTYPE, "../../../../etc/shadow")))
    assert run_cli("manifest", "image.tar", "-o", "m.json") == 0, capsys.readouterr().err
    link = json.loads((project / "m.json").read_text())["files"]["etc/link"]
    assert link == {**link, "type": "symlink", "target": "../../../../etc/shadow"} and "sha256" not in link


def test_layer_whose_bytes_are_not_its_diff_id_is_refused(project, capsys, no_engine):
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64]}}).encode()
    (project / "image.tar").write_bytes(_save(config=config))
    assert_refused(project, capsys, ["manifest", "image.tar"], 2, "image.tar", "l1/layer.tar hashes to sha256:")
