"""`manifest IMAGE`: the content manifest of an image (builder/model/manifest.py), read from `docker save`
without running it (builder/boundary/imagesave.py), as deterministic JSON."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder import fsutil, log
from builder.boundary import engine
from builder.boundary.imagesave import is_archive, manifest
from builder.flags import arg
from builder.model import reference
from builder.model.manifest import dumps


@dataclass(frozen=True)
class Options:
    image: str = arg(metavar="IMAGE", help="image reference or ID (or a `docker save` tar file)")
    output: str | None = arg("-o", "--output", default=None, metavar="FILE",
                             help="write the JSON here (default: stdout)")


def main(options: Options, m=None) -> int:
    if not is_archive(options.image):
        reference.check_image_name(options.image)
        engine.sdk()  # only an image name needs the engine; a tar file is read here
    with log.step(f"manifest {options.image}") as note:
        result = manifest(options.image)
        t, s = result["totals"], result["stats"]
        note["result"] = (f"{t['files']} files, {t['bytes'] / 1e9:.2f} GB, {len(result['python_packages'])} Python "
                          f"and {len(result['os_packages'])} OS packages, {len(result['layers'])} layers "
                          f"in {s['seconds']}s{' (cached)' if s['cached'] else ''}")
    if options.output:
        try:
            fsutil.write_atomic(Path(options.output), dumps(result))
        except OSError as exc:  # nothing half-written is left: a temp file beside it, renamed only when whole
            raise fsutil.write_failed(options.output, exc) from None
    else:
        print(dumps(result), end="")
    return 0
