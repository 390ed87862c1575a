"""Where every artifact of the pipeline lives, and the names an entry's images carry.

One place, so the steps agree without importing each other. Each generated directory has one writer:
render writes `dockerfiles/<tag>/`, lock writes `locks/<tag>/`; build stages both into `build/context/<tag>/`,
and every step reports to `build/reports/<tag>.<step>.json` (BUILDER_REPORTS overrides the directory).
"""

from __future__ import annotations

import os
from pathlib import Path

from builder.model.matrix import Entry

DOCKERFILES = Path("dockerfiles")
LOCKS = Path("locks")
SMOKE_DIR = Path("smoke")
CONTEXT_ROOT = Path("build/context")
MANIFEST_CACHE = Path("build/manifests")
ATTEST_DIR = Path("build/attest")  # SBOM and provenance of each published tag, for signing in CI
BUILDKIT_PROVENANCE_DIR = Path("build/provenance")  # BuildKit's provenance of each built image (build writes it)
REPRO_SUFFIX = "-repro"
PREVIOUS_SUFFIX = "-previous"  # the image a build replaces, named while the build runs (engine.holding)


def tag_dir(entry: Entry) -> Path:
    return DOCKERFILES / entry.tag


def lock_dir(entry: Entry) -> Path:
    return LOCKS / entry.tag


def reports_dir() -> Path:
    return Path(os.environ.get("BUILDER_REPORTS", "build/reports"))


def report(tag: str, step: str) -> Path:
    return reports_dir() / f"{tag}.{step}.json"


def buildkit_provenance(tag: str) -> Path:
    return BUILDKIT_PROVENANCE_DIR / f"{tag}.buildkit.intoto.json"


def image_ref(entry: Entry) -> str:
    """The local name of the entry's image: <matrix image>:<tag>."""
    return f"{entry.image}:{entry.tag}"


def previous_ref(entry: Entry) -> str:
    return image_ref(entry) + PREVIOUS_SUFFIX


def repro_ref(entry: Entry) -> str:
    """Where repro puts its from-scratch rebuild, beside (never over) the image."""
    return image_ref(entry) + REPRO_SUFFIX
