"""Before a build: can this machine build the tag from a clean clone? (called by `build`, before BuildKit).

A build needs the committed files its Dockerfile copies (checked offline: a failure here is a repository
defect, exit 1) and four sources over the network: the base image's registry, the Python index, the apt
archive and, for flash-attn entries, the wheel on GitHub. Each unreachable source is named with the flag
that points the build at a mirror (exit 3), so a user never gets "run lock first". The reachability probe is
a parameter, so tests run without network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from builder.boundary import web
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.model import compat, lockfile, paths
from builder.model.inputs import Inputs
from builder.model.lockfile import FLASH_LOCK, wheel_url
from builder.model.matrix import Entry

DOCKER_HUB = "https://registry-1.docker.io/v2/"
Probe = Callable[[str], str | None]  # url -> None when something answered, else why not


@dataclass(frozen=True)
class Source:
    what: str   # e.g. "base image registry for nvidia/cuda:12.1.1-runtime-ubuntu22.04"
    url: str    # what is probed
    mirror: str  # the flag or setting that provides a mirror


_CONTEXT_MOUNT = re.compile(r"^--mount=type=bind,source=([^,]+),")  # a bind mount with from= is another stage's


def copied_files(dockerfile: Path) -> list[str]:
    """Files the Dockerfile takes from the build context's tag directory: every source of every COPY and of every
    bind mount, except those from another stage (`from=`) and smoke/ (it comes from the repository root)."""
    found = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        found += [m.group(1) for m in map(_CONTEXT_MOUNT.search, words) if m]
        if not words or words[0] != "COPY" or any(w.startswith("--from=") for w in words):
            continue
        sources = [w for w in words[1:] if not w.startswith("--")][:-1]
        found += [src for src in sources if not src.startswith("smoke")]
    return list(dict.fromkeys(found))


def registry_url(ref: str) -> str:
    """The registry API endpoint an image reference pulls from (Docker Hub when the name has no host)."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return f"https://{first}/v2/"
    return DOCKER_HUB


def sources(entry: Entry, inputs: Inputs, index_url: str | None = None) -> list[list[Source]]:
    """What the build fetches, each as alternatives (any one answering is enough)."""
    base, apt_mirror, flash_attn_mirror = inputs.base_image or entry.base, inputs.apt_mirror, inputs.flash_attn_mirror
    found = [[Source(f"base image registry for {base.split('@', 1)[0]}", registry_url(base),
                     "--base-image REF (a mirror of the same image) or --local-base with a local copy")]]
    index = index_url or os.environ.get("PIP_INDEX_URL") or entry.index_url
    found.append([Source("Python package index", index.rstrip("/") + "/",
                         "PIP_INDEX_URL=<mirror> in the environment (handed to BuildKit as a secret)")])
    archive = compat.apt_archive(entry)
    if archive is not None:
        live = apt_mirror or f"{archive['live']}/{archive['name']}/"
        options = [Source(f"apt archive ({archive['name']})", live, "--apt-mirror URL")]
        apt_lock = paths.lock_dir(entry) / lockfile.APT_LOCK
        snap = lockfile.snapshot(apt_lock.read_text(encoding="utf-8")) if apt_lock.is_file() else None
        if snap and not apt_mirror:
            options.append(Source("apt snapshot", f"{snap['url']}/{archive['name']}/{snap['ts']}/", "--apt-mirror URL"))
        found.append(options)
    url = compat.derive(entry)["flash_attn_wheel"] if entry.pins.get("flash-attn") else None
    if url:
        found.append([Source("flash-attn wheel on GitHub" if not flash_attn_mirror else "flash-attn wheel mirror",
                             wheel_url(url, flash_attn_mirror),
                             "--flash-attn-mirror URL (a directory serving the same wheel file; its sha256 is "
                             "still checked)")])
    return found


def preflight(entry: Entry, inputs: Inputs, staged: Path, *, probe: Probe = web.probe,
              image_exists: Callable[[str], bool] = lambda ref: False, index_url: str | None = None) -> dict:
    """Raise StepFailed (exit 1, committed files), EnvironmentProblem (exit 3, an unreachable source, with
    the mirror flag) or UserError (exit 2, a declared exception the build cannot get past); else a report.
    `staged` is the build context (model/context.py): the Dockerfile's COPY sources must all be in it."""
    missing = [name for name in copied_files(staged / "Dockerfile") if not (staged / name).exists()]
    problems = [f"{entry.tag}: {name} is missing from {paths.tag_dir(entry)}/ and {paths.lock_dir(entry)}/ "
                "(the Dockerfile copies it)" for name in missing]
    problems += lockfile.problems(entry, paths.lock_dir(entry)) if not missing else []
    if problems:
        raise StepFailed("\n".join(problems), "the committed files do not match matrix.yaml: a repository defect")
    checked, unreachable = [], []
    for options in sources(entry, inputs, index_url=index_url):
        if options[0].what.startswith("base image") and (image_exists(inputs.base_image or entry.base) or (
                inputs.local_base and image_exists(entry.base_name))):
            checked.append({"source": options[0].what, "url": "local image", "ok": True})
            continue
        errors = []
        for source in options:
            error = probe(source.url)
            checked.append({"source": source.what, "url": source.url, "ok": error is None})
            if error is None:
                break
            errors.append(f"{source.url} ({error})")
        else:
            unreachable.append(f"{entry.tag}: cannot reach the {options[0].what}: {', '.join(errors)} — "
                               f"provide a mirror with {options[0].mirror}")
    if unreachable:
        raise EnvironmentProblem("\n".join(unreachable))
    if FLASH_LOCK in entry.lock_exceptions and entry.pins.get("flash-attn"):
        raise UserError(f"{entry.tag}: the flash-attn wheel has no sourced sha256 "
                        f"({entry.lock_exceptions[FLASH_LOCK]}), so the build cannot verify it",
                        "GitHub answers here: `python -m builder lock TAG` hashes the wheel into flash-attn.lock; "
                        "add a second agreeing source to builder/data/flash-attn-wheels.yaml to drop the exception")
    return {"tag": entry.tag, "checked": checked}
