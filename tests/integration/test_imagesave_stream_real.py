"""`docker save` is read as a stream; what the reader leaves unread must not kill it (imagesave.stream). A real
process stands in for docker: a script that writes an archive the way Docker ends it."""

import io
import stat
import tarfile

from builder.boundary import engine, imagesave, tarstream


def test_a_save_whose_last_zero_block_comes_late_still_succeeds(monkeypatch, tmp_path):
    """Docker ends the archive with two zero blocks, written one at a time; our tar reader stops at the first. A
    stream closed before the second is written kills `docker save` with SIGPIPE (no output): read to the end."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"[]"))
    body = buf.getvalue().rstrip(b"\0")
    body += bytes(-len(body) % 512) + bytes(512)  # the member, then the first zero block only
    (tmp_path / "head.tar").write_bytes(body)
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path}/head.tar\nsleep 1\nhead -c 512 /dev/zero\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(engine, "client", lambda: engine.Client(str(fake), "buildx"))
    with imagesave.stream("example/train:t") as stream:
        names = [info.name for info, _ in tarstream.members(stream)]
    assert names == ["manifest.json"]  # and no EnvironmentProblem: the save exited 0
