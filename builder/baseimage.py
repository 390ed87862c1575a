"""Which base image reference a build or lock uses: the pinned digest, or a local copy of the same name.

A machine that cannot reach a registry (an air-gapped host, our CI) can provide the base as a local
image named like the entry's base without its digest (`--local-base`). The substitution is recorded
in the build report and labels, never silent.
"""

from __future__ import annotations

from builder import engine
from builder.errors import EnvironmentProblem
from builder.matrix import Entry


def reference(entry: Entry, local: bool) -> str:
    if not local:
        return entry.base
    ref = entry.base_name
    if engine.image_or_none(ref) is None:
        raise EnvironmentProblem(
            f"{entry.tag}: --local-base needs a local image named {ref}, and there is none",
            f"`docker pull {entry.base}` and tag it, or make one (ci/make-base-image.sh)",
        )
    return ref
