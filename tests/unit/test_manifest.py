"""Content manifests: layer application (whiteouts, opaque dirs, links), packages, determinism."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest
import zstandard

from builder.boundary import imagesave
from builder.model import manifest


def _tar(members: list[tuple[str, str, bytes | str | None]]) -> bytes:
    """A tar from (name, kind, data): kind file/dir/symlink/hardlink; data = content or link target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, data
                tar.addfile(info)
            else:
                body = data.encode() if isinstance(data, str) else data
                info.size, info.mode = len(body), 0o644
                tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def fake_save(layers: list[list], compress=lambda tar: tar) -> bytes:
    """A `docker save` archive with the given layers, bottom first; `compress` stores each layer as an OCI layout
    from the containerd image store does (gzip or zstd blobs; the diff_ids stay those of the plain tars)."""
    names = [f"l{i}/layer.tar" for i in range(len(layers))]
    tars = [_tar(layer) for layer in layers]
    config = {"rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(t).hexdigest() for t in tars]}}
    top = [{"Config": "abc123.json", "RepoTags": ["t:1"], "Layers": names}]
    members = [(n, "file", compress(t)) for n, t in zip(names, tars)]
    members += [("abc123.json", "file", json.dumps(config)), ("manifest.json", "file", json.dumps(top))]
    return _tar(members)


LOWER = [
    ("etc", "dir", None), ("etc/gone", "file", "bye"), ("etc/dir", "dir", None), ("etc/dir/a", "file", "a"),
    ("opq", "dir", None), ("opq/old", "file", "old"), ("opq/sub", "dir", None), ("opq/sub/x", "file", "x"),
    ("bin", "dir", None), ("bin/tool", "file", "#!/bin/sh\n"), ("bin/alias", "symlink", "tool"),
    ("bin/hard", "hardlink", "bin/tool"),
    ("venv/foo-1.0.dist-info", "dir", None),
    ("venv/foo-1.0.dist-info/METADATA", "file", "Metadata-Version: 2.1\nName: foo\nVersion: 1.0\n\nbody\n"),
    ("venv/foo-1.0.dist-info/INSTALLER", "file", "pip\n"),
    ("var/lib/dpkg/status", "file", "Package: bash\nStatus: install ok installed\nArchitecture: amd64\n"
                                    "Version: 5.2.15-2+b7\n\nPackage: old\nStatus: deinstall ok config-files\n"
                                    "Version: 1\n"),
]
UPPER = [
    ("etc/.wh.gone", "file", ""), ("etc/.wh.dir", "file", ""),
    ("opq", "dir", None), ("opq/.wh..wh..opq", "file", ""), ("opq/new", "file", "new"),
    ("etc/new", "file", "n"),
]


def test_layers_apply_with_whiteouts_and_opaque_dirs():
    m = manifest.build_manifest(imagesave.read_save(io.BytesIO(fake_save([LOWER, UPPER]))), "t:1")
    files = m["files"]
    assert "etc/gone" not in files and "etc/dir" not in files and "etc/dir/a" not in files
    assert "opq/old" not in files and "opq/sub/x" not in files and "opq/sub" not in files
    assert files["opq/new"]["sha256"] == "11507a0e2f5e69d5dfa40a62a1bd7b6ee57e6bcd85c67c9b8431b36fff21c437"
    assert not any(".wh." in p for p in files)
    assert files["bin/alias"] == {"type": "symlink", "target": "tool", "mode": "0644", "uid": 0, "gid": 0,
                                  "mtime": 1700000000}
    # A hard link is the same content under a second name.
    assert files["bin/hard"]["type"] == "file" and files["bin/hard"]["sha256"] == files["bin/tool"]["sha256"]
    assert m["python_packages"] == [{"name": "foo", "version": "1.0", "installer": "pip",
                                     "path": "venv/foo-1.0.dist-info"}]
    assert m["os_packages"] == [{"name": "bash", "version": "5.2.15-2+b7", "architecture": "amd64"}]
    assert [x["diff_id"] for x in m["layers"]] == ["sha256:" + hashlib.sha256(_tar(x)).hexdigest()
                                                   for x in (LOWER, UPPER)]
    assert m["config_digest"] == "sha256:abc123"


def test_a_file_replacing_a_directory_hides_its_children():
    upper = [("etc/dir", "file", "now a file")]
    files = manifest.build_manifest(imagesave.read_save(io.BytesIO(fake_save([LOWER, upper]))), "t")["files"]
    assert files["etc/dir"]["type"] == "file" and "etc/dir/a" not in files


def test_output_is_deterministic():
    archive = fake_save([LOWER, UPPER])
    one = manifest.dumps(manifest.build_manifest(imagesave.read_save(io.BytesIO(archive)), "t:1"))
    two = manifest.dumps(manifest.build_manifest(imagesave.read_save(io.BytesIO(archive)), "t:1"))
    assert one == two and json.loads(one)["files"]


def _zstd_frames(data: bytes) -> bytes:
    """zstd as BuildKit writes it can hold several frames: two here, to read across."""
    half = len(data) // 2
    return b"".join(zstandard.ZstdCompressor(level=3).compress(part) for part in (data[:half], data[half:]))


@pytest.mark.parametrize("compress", [gzip.compress, _zstd_frames], ids=["gzip", "zstd"])
def test_compressed_layers_give_the_manifest_of_the_plain_ones(compress):
    plain = manifest.build_manifest(imagesave.read_save(io.BytesIO(fake_save([LOWER, UPPER]))), "t:1")
    packed = fake_save([LOWER, UPPER], compress)
    assert packed != fake_save([LOWER, UPPER])
    assert manifest.build_manifest(imagesave.read_save(io.BytesIO(packed)), "t:1") == plain


def test_a_damaged_zstd_layer_is_a_user_error_not_a_traceback():
    from builder.errors import UserError

    def damaged(tar: bytes) -> bytes:
        blob = bytearray(zstandard.ZstdCompressor().compress(tar))
        blob[len(blob) // 2] ^= 0xFF
        return bytes(blob)

    with pytest.raises(UserError, match="not a valid `docker save` archive|hashes to"):
        imagesave.read_save(io.BytesIO(fake_save([LOWER], damaged)), "saved.tar")


def test_not_a_save_archive_is_a_user_error():
    from builder.errors import UserError

    with pytest.raises(UserError, match="manifest.json"):
        imagesave.read_save(io.BytesIO(_tar([("x", "file", "y")])))


# --- real images ---------------------------------------------------------------------------------------

DOCKERFILE = """\
FROM debian:bookworm-slim
RUN mkdir -p /data/keep /data/opq && echo a > /data/gone && echo b > /data/keep/x && echo c > /data/opq/old \\
    && ln -s keep/x /data/link && ln /data/keep/x /data/hard && chmod 0750 /data/keep && chown 12:34 /data/keep/x
RUN rm /data/gone && rm -rf /data/opq && mkdir /data/opq && echo new > /data/opq/new
"""


