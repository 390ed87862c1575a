"""apt's own resolution, run in the base image itself, so the versions pinned are the base archive's."""

from __future__ import annotations

from builder.boundary import engine
from builder.errors import UserError

_NO_CLEAN = "rm -f /etc/apt/apt.conf.d/docker-clean; "
# Adds components (e.g. "contrib non-free") to the base's own sources, one-line and deb822 formats alike.
_COMPONENTS = ("sed -i -E 's/^(Components: .*main)$/\\1 {c}/; s/^(deb .* main)$/\\1 {c}/' "
               "$(find /etc/apt/ -name '*.list' -o -name '*.sources') && ")


def simulate_install(tag: str, base_ref: str, packages: list[str], components: str | None = None) -> str:
    """The output of `apt-get install --simulate PACKAGES` in `base_ref` (its `Inst` lines name every version).

    `components` come from compat.yaml (validated data), the package names from the lock recipe: nothing
    from the command line reaches this shell line."""
    script = _NO_CLEAN + (_COMPONENTS.format(c=components) if components else "") + (
        "apt-get update -qq >/dev/null && apt-get install -s --no-install-recommends " + " ".join(packages))
    code, output = engine.run_container(base_ref, ["sh", "-c", script], timeout=300, network="host")
    if code != 0:
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        raise UserError(f"{tag}: apt could not resolve {' '.join(packages)} in {base_ref}: {last}")
    return output
