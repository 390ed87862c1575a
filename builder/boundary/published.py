"""What a registry already holds for an entry: is its published alias an image of exactly these inputs?"""

from __future__ import annotations

from builder import log
from builder.boundary import buildkit, registry
from builder.errors import BuilderError
from builder.model.matrix import Entry


def is_current(entry: Entry, where: str) -> bool:
    """The alias's input-hash label against the inputs a CI build would have now; unreadable counts as no."""
    repo = registry.repository(where, entry.image)
    try:
        labels = registry.config_labels(repo, entry.tag) or {}
    except BuilderError as exc:
        log.info(f"{entry.tag}: cannot read {repo.ref}:{entry.tag} ({exc.message}): planned for a rebuild")
        return False
    same = labels.get(f"{buildkit.LABEL_PREFIX}.input-hash") == buildkit.planned_input_hash(entry)
    log.info(f"{entry.tag}: {'published image is current: skipped' if same else 'inputs changed: planned'}")
    return same
