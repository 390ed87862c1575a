"""The OCI archive a timestamp-rewriting build writes (buildkit.run): its attestations taken out before the load.

BuildKit puts its SLSA provenance into the image index, beside the image manifest, as an "attestation manifest".
Loaded so, the image would be that index, whose digest changes with every build (the provenance holds the build's
start and end times): the same inputs would no longer give the same image digest. So the index.json at the top of
the archive is rewritten, in place, to name the image manifest alone, and the provenance statements are handed
back to the caller (build keeps them; publish attaches them beside the digest, next to our own provenance).
"""

from __future__ import annotations

import copy
import io
import json
import os
import tarfile
from pathlib import Path

from builder.errors import StepFailed

INDEX = "index.json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ATTESTATION = "attestation-manifest"
IN_TOTO = "application/vnd.in-toto+json"
MAX_JSON = 16 << 20


def detach_attestations(archive: Path) -> list[dict]:
    """Rewrite `archive`'s index.json to name the image manifest only; return the in-toto statements of the
    attestation manifests it dropped (none: [] and the archive unchanged). A layout not as BuildKit writes it
    (several images, no image manifest) is a StepFailed: loading it would give an image we cannot vouch for."""
    with tarfile.open(archive, "r:") as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isreg()}
        if INDEX not in members:
            raise StepFailed(f"{archive}: the build wrote no {INDEX}", "see the build output above")

        def blob(digest: str) -> dict:
            member = members.get("blobs/" + digest.replace(":", "/", 1))
            if member is None or member.size > MAX_JSON:
                raise StepFailed(f"{archive}: blob {digest[:19]}… is missing or too large to be JSON")
            return json.loads(tar.extractfile(member).read())

        index_member = members[INDEX]
        top = json.loads(tar.extractfile(index_member).read())
        entries = top.get("manifests") or []
        if len(entries) != 1 or entries[0].get("mediaType") != OCI_INDEX:
            return []  # an image manifest at the top already: nothing attached
        inner = blob(entries[0]["digest"])
        kept = [m for m in inner.get("manifests") or []
                if (m.get("annotations") or {}).get("vnd.docker.reference.type") != ATTESTATION]
        dropped = [m for m in inner.get("manifests") or [] if m not in kept]
        if not dropped:
            return []
        if len(kept) != 1:
            raise StepFailed(f"{archive}: the image index names {len(kept)} images, not one",
                             "build one platform only")
        statements = []
        for manifest in dropped:
            for layer in blob(manifest["digest"]).get("layers") or []:
                if layer.get("mediaType") == IN_TOTO:
                    statements.append(blob(layer["digest"]))
        # The image manifest takes the index's place, with the annotations that name the image for `docker load`.
        image = {key: kept[0][key] for key in ("mediaType", "digest", "size")}
        image["annotations"] = entries[0].get("annotations") or {}
        new = json.dumps({**top, "manifests": [image]}, separators=(",", ":")).encode()
        _rewrite_in_place(archive, index_member, new)
    return statements


def _rewrite_in_place(archive: Path, member: tarfile.TarInfo, data: bytes) -> None:
    """Replace a member's content without copying the (gigabytes of) archive: its blocks are reused. JSON may end
    in spaces, so content up to the old size is padded to it; longer content that still fits the member's last
    512-byte block gets a new header (same position, new size and checksum)."""
    blocks = -(-member.size // tarfile.BLOCKSIZE)
    if len(data) <= member.size:
        header, data = None, data.ljust(member.size, b" ")
    elif -(-len(data) // tarfile.BLOCKSIZE) == blocks and member.offset_data - member.offset == tarfile.BLOCKSIZE:
        changed = copy.copy(member)
        changed.size = len(data)
        header = changed.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
        if len(header) != tarfile.BLOCKSIZE:
            raise StepFailed(f"{archive}: cannot rewrite {member.name} in place (its header would grow)")
    else:
        _rewrite_by_copy(archive, member.name, data)
        return
    with open(archive, "r+b") as fh:
        if header is not None:
            fh.seek(member.offset)
            fh.write(header)
        fh.seek(member.offset_data)
        fh.write(data.ljust(blocks * tarfile.BLOCKSIZE, b"\0") if header is not None else data)


def _rewrite_by_copy(archive: Path, name: str, data: bytes) -> None:
    """The rare case (the new content needs one more block): the archive copied with the member replaced, then
    renamed over the old one; a failure leaves the old one as it was."""
    partial = archive.with_name(archive.name + ".partial")
    try:
        with tarfile.open(archive, "r:") as old, tarfile.open(partial, "w:", format=tarfile.GNU_FORMAT) as new:
            for member in old:
                if member.name.removeprefix("./") == name:
                    replaced = copy.copy(member)
                    replaced.size = len(data)
                    new.addfile(replaced, io.BytesIO(data))
                else:
                    new.addfile(member, old.extractfile(member) if member.isreg() else None)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
