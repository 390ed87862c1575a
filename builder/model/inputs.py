"""What a build is made from besides the committed files: one frozen object, built once from the command line.

build, repro and lock all take the same `Inputs` whole (cibuildwheel hands its frozen BuildOptions down the
same way), so a flag added here reaches every one of them: repro rebuilds exactly what build built, with the
same mirrors. Values are checked here, at the edge, before any of them reaches a Dockerfile, a shell expression
or a docker option.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from builder.errors import UserError
from builder.flags import arg, switch
from builder.model import reference

# Sensitive settings and the BuildKit secret id each travels under; never a build arg (visible in history).
SECRET_ENV = (("PIP_INDEX_URL", "pip_index_url"), ("PIP_EXTRA_INDEX_URL", "pip_extra_index_url"))
# An http(s) URL of plain characters: it ends up in a RUN step's apt sources and in pip's requirement lines.
_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%+-]*)*/?")


@dataclass(frozen=True)
class Inputs:
    """Everything besides dockerfiles/<tag>/, locks/<tag>/ and smoke/ that decides what a build fetches."""

    local_base: bool = switch("--local-base", help="prefer a local image named like the base (name:tag, no digest) "
                                                   "when one exists; the substitution is recorded in labels and the "
                                                   "report")
    base_image: str | None = arg("--base-image", default=None, metavar="REF",
                                 help="use this base reference instead (a mirror)")
    apt_mirror: str | None = arg("--apt-mirror", default=None, metavar="URL",
                                 help="apt mirror, e.g. http://mirror.local/debian")
    flash_attn_mirror: str | None = arg(
        "--flash-attn-mirror", default=None, metavar="URL",
        help="a directory serving the flash-attn wheel files (their sha256 from the lock is still checked)")
    ca_bundle: str | None = arg("--ca-bundle", default=None, metavar="PATH",
                                help="extra CA bundle for pip inside the build (default: $PIP_CERT or $SSL_CERT_FILE)")
    # Filled in by `resolved` from the environment: the secrets BuildKit gets (never part of the input hash).
    secrets: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def resolved(self, environ: Mapping[str, str] = os.environ) -> Inputs:
        """These inputs checked, with the CA bundle and the index secrets taken from the environment."""
        check(self)
        bundle = self.ca_bundle or environ.get("PIP_CERT") or environ.get("SSL_CERT_FILE")
        if bundle and not Path(bundle).is_file():
            raise UserError(f"CA bundle {bundle} does not exist", "pass --ca-bundle PATH or unset PIP_CERT")
        secrets = {secret_id: environ[name] for name, secret_id in SECRET_ENV if environ.get(name)}
        return replace(self, ca_bundle=bundle or None, secrets=secrets)

    @property
    def secret_values(self) -> list[str]:
        """What must never be shown: the index URLs carry tokens."""
        return list(self.secrets.values())


def check(inputs: Inputs) -> None:
    """A one-line error for every value that is not what its flag takes (exit 2)."""
    for flag, value in (("--apt-mirror", inputs.apt_mirror), ("--flash-attn-mirror", inputs.flash_attn_mirror)):
        if value is not None and not _URL.fullmatch(value):
            raise UserError(f"{flag} {value!r} is not a plain http(s) URL",
                            "give e.g. http://mirror.local/debian (letters, digits and . _ ~ % + - / only)")
    why = None if inputs.base_image is None else reference.problem(inputs.base_image)
    if why:
        raise UserError(f"--base-image {inputs.base_image[:80]!r} is not an image reference ({why})",
                        "e.g. mirror.local/nvidia/cuda:12.4.1-runtime-ubuntu22.04 or NAME@sha256:DIGEST")


