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
from builder.model import compat
from builder.model.matrix import Entry
from builder.steps import lock

DOCKER_HUB = "https://registry-1.docker.io/v2/"
Probe = Callable[[str], str | None]  # url -> None when something answered, else why not


@dataclass(frozen=True)
class Source:
    what: str   # e.g. "base image registry for nvidia/cuda:12.1.1-runtime-ubuntu22.04"
    url: str    # what is probed
    mirror: str  # the flag or setting that provides a mirror


def copied_files(dockerfile: Path) -> list[str]:
    """Files the Dockerfile COPYs from the build context's tag directory: every source of every COPY, except
    copies from another stage (`--from=`) and smoke/ (it comes from the repository root)."""
    found = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from=") for w in words):
            continue
        sources = [w for w in words[1:] if not w.startswith("--")][:-1]
        found += [src for src in sources if not src.startswith("smoke")]
    return found


def registry_url(ref: str) -> str:
    """The registry API endpoint an image reference pulls from (Docker Hub when the name has no host)."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return f"https://{first}/v2/"
    return DOCKER_HUB


def wheel_url(url: str, mirror: str | None) -> str:
    """The flash-attn wheel URL, or the same file name under a mirror directory."""
    return f"{mirror.rstrip('/')}/{url.rsplit('/', 1)[1]}" if mirror else url


def rewrite_flash_lock(text: str, mirror: str | None) -> str:
    """flash-attn.lock pointing at the mirror: same file name, same --hash, so pip still checks the bytes."""
    if not mirror:
        return text
    return re.sub(r"^(flash-attn @ )(\S+)", lambda m: m.group(1) + wheel_url(m.group(2), mirror), text, flags=re.M)


def sources(entry: Entry, out_dir: Path, *, base_image: str | None = None, index_url: str | None = None,
            apt_mirror: str | None = None, flash_attn_mirror: str | None = None) -> list[list[Source]]:
    """What the build fetches, each as alternatives (any one answering is enough)."""
    base = base_image or entry.base
    found = [[Source(f"base image registry for {base.split('@', 1)[0]}", registry_url(base),
                     "--base-image REF (a mirror of the same image) or --local-base with a local copy")]]
    index = index_url or os.environ.get("PIP_INDEX_URL") or entry.index_url
    found.append([Source("Python package index", index.rstrip("/") + "/",
                         "PIP_INDEX_URL=<mirror> in the environment (handed to BuildKit as a secret)")])
    archive = compat.apt_archive(entry)
    if archive is not None:
        live = apt_mirror or f"{archive['live']}/{archive['name']}/"
        options = [Source(f"apt archive ({archive['name']})", live, "--apt-mirror URL")]
        text = (out_dir / lock.APT_LOCK).read_text() if (out_dir / lock.APT_LOCK).exists() else ""
        snap = lock.SNAPSHOT_RE.search(text)
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


def preflight(entry: Entry, out_dir: Path, *, probe: Probe = web.probe, image_exists: Callable[[str], bool] =
              lambda ref: False, local_base: bool = False, base_image: str | None = None,
              index_url: str | None = None, apt_mirror: str | None = None,
              flash_attn_mirror: str | None = None) -> dict:
    """Raise StepFailed (exit 1, committed files), EnvironmentProblem (exit 3, an unreachable source, with
    the mirror flag) or UserError (exit 2, a declared exception the build cannot get past); else a report."""
    missing = [name for name in copied_files(out_dir / "Dockerfile") if not (out_dir / name).exists()]
    problems = [f"{entry.tag}: {out_dir / name} is missing (the Dockerfile copies it)" for name in missing]
    problems += lock.all_problems(entry, out_dir) if not missing else []
    if problems:
        raise StepFailed("\n".join(problems), "the committed files do not match matrix.yaml: a repository defect")
    checked, unreachable = [], []
    for options in sources(entry, out_dir, base_image=base_image, index_url=index_url, apt_mirror=apt_mirror,
                           flash_attn_mirror=flash_attn_mirror):
        if options[0].what.startswith("base image") and (image_exists(base_image or entry.base) or (
                local_base and image_exists(entry.base_name))):
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
    if lock.FLASH_LOCK in entry.lock_exceptions and entry.pins.get("flash-attn"):
        raise UserError(f"{entry.tag}: the flash-attn wheel has no sourced sha256 "
                        f"({entry.lock_exceptions[lock.FLASH_LOCK]}), so the build cannot verify it",
                        "GitHub answers here: `python -m builder lock TAG` hashes the wheel into flash-attn.lock; "
                        "add a second agreeing source to builder/data/flash-attn-wheels.yaml to drop the exception")
    return {"tag": entry.tag, "checked": checked}
