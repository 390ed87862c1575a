"""Which base image reference a build or lock uses: the pinned digest, or a local copy of the same name.

A machine that cannot reach a registry (an air-gapped host, our CI) can provide the base as a local
image named like the entry's base without its digest; `--local-base` prefers such a copy when it exists
and otherwise uses the pinned digest. A substitution is recorded in the build report and labels.
"""

from __future__ import annotations

from builder.boundary import engine
from builder.model.matrix import Entry


def reference(entry: Entry, local: bool) -> str:
    if local and engine.image_or_none(entry.base_name) is not None:
        return entry.base_name
    return entry.base


def describe(entry: Entry, ref: str) -> dict:
    """What was used: the ref, its image ID, and whether it is the pinned digest."""
    image = engine.image_or_none(ref)
    digests = image.attrs.get("RepoDigests", []) if image else []
    pinned = ref == entry.base or any(d.endswith("@" + (entry.base_digest or "-")) for d in digests)
    return {"ref": ref, "substituted": not pinned, "image_id": image.id if image else None}
