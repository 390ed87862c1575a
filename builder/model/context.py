"""The build context of an entry: exactly the files its image is made of, staged once and hashed.

dockerfiles/<tag>/ (render's), locks/<tag>/ (lock's) and smoke/ are copied side by side into
build/context/<tag>/, with the inputs applied (a flash-attn mirror rewrites the wheel's URL, never its hash), and
torch-cuda.lock derived from torch.lock (its CUDA libraries, for a layer of their own) and requirements.lock's two
parts (requirements-deps.lock, requirements-pins.lock: the pins install last, so a change of one reinstalls only them).
Build and repro stage through here, so the context BuildKit sees and the one hashed are the same files.
Only regular files inside the repository enter: a symbolic link is refused, wherever it points.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from builder.errors import UserError
from builder.model import lockfile, paths
from builder.model.inputs import Inputs
from builder.model.matrix import Entry


def _files(folder: Path) -> list[Path]:
    """The regular files under `folder` (recursively, sorted); a link or a device is a one-line error."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in [*dirs, *names]:
            path = Path(root) / name
            if path.is_symlink():
                raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}); nothing outside the repository "
                                "may enter a build", f"replace {path} with the real file")
        for name in sorted(names):
            path = Path(root) / name
            if not name.endswith(".pyc"):
                if not path.is_file():
                    raise UserError(f"{path} is not a regular file", "remove it")
                found.append(path)
    return found


def stage(entry: Entry, inputs: Inputs, root: Path = paths.CONTEXT_ROOT) -> Path:
    """root/<tag>/: the rendered files and the locks at the top (the Dockerfile COPYs them by name), smoke/ below."""
    rendered, locks = paths.tag_dir(entry), paths.lock_dir(entry)
    if not (rendered / "Dockerfile").is_file():
        raise UserError(f"{rendered}/Dockerfile does not exist", f"run `python -m builder render {entry.tag}`")
    for folder in (paths.DOCKERFILES, rendered, paths.LOCKS, locks, paths.SMOKE_DIR):
        if folder.is_symlink():
            raise UserError(f"{folder} is a symbolic link; nothing outside the repository may enter a build",
                            f"replace {folder} with a real directory")
    target = root / entry.tag
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in _files(rendered) + (_files(locks) if locks.is_dir() else []):
        if path.parent in (rendered, locks):
            shutil.copy2(path, target / path.name)
    for path in _files(paths.SMOKE_DIR):
        copy = target / "smoke" / path.relative_to(paths.SMOKE_DIR)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
    torch_lock = target / lockfile.TORCH_LOCK
    if torch_lock.is_file():
        (target / lockfile.TORCH_CUDA_LOCK).write_text(lockfile.cuda_libraries(torch_lock.read_text(encoding="utf-8")))
    requirements = target / lockfile.LOCK
    if requirements.is_file():
        deps, pinned = lockfile.split_pinned(requirements.read_text(encoding="utf-8"),
                                              [n for n, v in entry.pins.items() if v])
        (target / lockfile.REQUIREMENTS_DEPS_LOCK).write_text(deps)
        (target / lockfile.REQUIREMENTS_PINS_LOCK).write_text(pinned)
    flash = target / lockfile.FLASH_LOCK
    if inputs.flash_attn_mirror and flash.is_file():
        flash.write_text(lockfile.rewrite_flash_lock(flash.read_text(encoding="utf-8"), inputs.flash_attn_mirror))
    return target


def digest(context: Path) -> str:
    """sha256 over every file in the context: path, executable bit and content."""
    out = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        out.update(f"{rel}\0{os.access(path, os.X_OK)}\0".encode())
        out.update(hashlib.sha256(path.read_bytes()).digest())
    return out.hexdigest()
