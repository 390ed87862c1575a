"""BuildKit's provenance taken out of the OCI archive before `docker load`: the image keeps its digest.

The archives here are laid out as BuildKit 0.13 writes one with `--provenance=mode=max` (index.json → an image
index → the image manifest and an attestation manifest whose layer is the in-toto statement).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from builder.boundary import ociarchive
from builder.errors import StepFailed

IMAGE = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}'


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _archive(path, name: str = "docker.io/library/train:t", attest: bool = True, images: int = 1,
             extra_annotations: dict | None = None) -> dict:
    statement = json.dumps({"predicateType": "https://slsa.dev/provenance/v0.2",
                            "subject": [{"digest": {"sha256": _digest(IMAGE)[7:]}}]}).encode()
    attestation = json.dumps({"schemaVersion": 2, "layers": [{"mediaType": "application/vnd.in-toto+json",
                                                               "digest": _digest(statement),
                                                               "size": len(statement)}]}).encode()
    manifests = [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(IMAGE),
                  "size": len(IMAGE), "platform": {"architecture": "amd64", "os": "linux"}}] * images
    if attest:
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(attestation),
                          "size": len(attestation), "annotations": {
                              "vnd.docker.reference.digest": _digest(IMAGE),
                              "vnd.docker.reference.type": "attestation-manifest"}})
    inner = json.dumps({"schemaVersion": 2, "mediaType": ociarchive.OCI_INDEX, "manifests": manifests}).encode()
    annotations = {"io.containerd.image.name": name, "org.opencontainers.image.created": "1980-01-01T00:00:00Z",
                   "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1], **(extra_annotations or {})}
    top = json.dumps({"schemaVersion": 2, "mediaType": ociarchive.OCI_INDEX, "manifests": [
        {"mediaType": ociarchive.OCI_INDEX, "digest": _digest(inner), "size": len(inner),
         "annotations": annotations}]}, separators=(",", ":")).encode()
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for member, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", top),
                             *[(f"blobs/sha256/{_digest(d)[7:]}", d) for d in (IMAGE, inner, attestation, statement)],
                             ("blobs/sha256/" + "0" * 64, b"\0" * 5000)]:  # a layer after the index, untouched
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return json.loads(statement)


def _read(path) -> dict:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}


@pytest.mark.parametrize("name", ["docker.io/library/train:t", "ghcr.io/train-images/train:cu130-torch2.13-bookworm"])
def test_the_provenance_leaves_and_the_index_names_the_image_manifest_in_place(tmp_path, name):
    archive = tmp_path / "image.tar"
    statement = _archive(archive, name)
    before = _read(archive)
    size = archive.stat().st_size
    assert ociarchive.detach_attestations(archive) == [statement]
    after = _read(archive)
    assert archive.stat().st_size == size  # rewritten in place, not copied
    index = json.loads(after["index.json"])
    assert index["manifests"] == [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                   "digest": _digest(IMAGE), "size": len(IMAGE),
                                   "annotations": json.loads(before["index.json"])["manifests"][0]["annotations"]}]
    assert {k: v for k, v in after.items() if k != "index.json"} == \
           {k: v for k, v in before.items() if k != "index.json"}  # every blob as it was
    assert ociarchive.detach_attestations(archive) == []  # nothing attached any more: unchanged
    assert _read(archive) == after


def test_every_size_of_index_json_is_rewritten_in_place_or_by_a_copy(tmp_path, monkeypatch):
    """Across a 512-byte block boundary: the rewritten index.json (a few bytes longer) fits its blocks (in place,
    the archive's size unchanged), or, where it would need one more block, the archive is copied with it
    replaced. Either way every other member is byte for byte what it was."""
    archive = tmp_path / "image.tar"
    copies = []
    copy = ociarchive._rewrite_by_copy
    monkeypatch.setattr(ociarchive, "_rewrite_by_copy", lambda *a: copies.append(a) or copy(*a))
    for pad in range(0, 520):
        _archive(archive, extra_annotations={"x": "y" * pad})
        before = _read(archive)
        ociarchive.detach_attestations(archive)
        after = _read(archive)
        assert json.loads(after["index.json"])["manifests"][0]["digest"] == _digest(IMAGE)
        assert {k: v for k, v in after.items() if k != "index.json"} == \
               {k: v for k, v in before.items() if k != "index.json"}
    assert 0 < len(copies) < 5 and not list(tmp_path.glob("*.partial"))


def test_no_attestation_no_change_and_several_images_are_refused(tmp_path):
    plain = tmp_path / "plain.tar"
    _archive(plain, attest=False)
    before = plain.read_bytes()
    assert ociarchive.detach_attestations(plain) == [] and plain.read_bytes() == before
    several = tmp_path / "several.tar"
    _archive(several, images=2)
    with pytest.raises(StepFailed, match="names 2 images, not one"):
        ociarchive.detach_attestations(several)
