"""An image's content read from `docker save` without running it (the `manifest` verb, repro, diff).

The save is streamed: each layer tar is read once, every file hashed incrementally and the layer as a whole
checked against its diff_id in the image config, then builder/model/manifest.py applies the layers and builds
the manifest. A local image's manifest is cached by image ID
(an ID is content) in build/manifests/.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import posixpath
import stat
import tarfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import zstandard

from builder import fsutil, log
from builder.boundary import buildkit, engine, process, tarstream
from builder.errors import EnvironmentProblem, UserError
from builder.model import manifest as manifest_model
from builder.model import paths, reference
from builder.model.manifest import build_manifest

CHUNK = 1 << 20
BLOCK = 512
CACHE_DIR = paths.MANIFEST_CACHE
# Small files whose content the manifest reads (besides hashing): package metadata.
_KEEP_SUFFIXES = (".dist-info/METADATA", ".dist-info/INSTALLER", ".egg-info/PKG-INFO")
_KEEP_PATHS = ("var/lib/dpkg/status",)
_TYPES = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink",
          tarfile.LNKTYPE: "file", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo",
          tarfile.CONTTYPE: "file"}
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


# --- reading one layer ---------------------------------------------------------------------------------


def _norm(name: str) -> str:
    name = posixpath.normpath("/" + name).lstrip("/")
    return name or "."


def _inside(name: str, what: str = "member") -> str:
    """`name` as a path in the image's root; a `..` that climbs out of it is refused, as Docker refuses to apply
    such a layer (an absolute name is under the root, as Docker applies it)."""
    if posixpath.normpath(name.lstrip("/") or ".").split("/")[0] == "..":
        raise UserError(f"a layer {what} leaves the image's root: {name[:120]!r}",
                        "this archive was crafted or damaged; Docker would refuse to load it")
    return _norm(name)


def _keep(path: str) -> bool:
    return path in _KEEP_PATHS or path.endswith(_KEEP_SUFFIXES)


def read_layer(stream) -> dict:
    """One layer tar, streamed: {"entries": {path: entry}, "whiteouts": [...], "opaque": [...], "bytes": n}."""
    entries: dict[str, dict] = {}
    whiteouts, opaque, total = [], [], 0
    buf = bytearray(CHUNK)
    for member, data in tarstream.members(stream):
        path = _inside(member.name)
        base = posixpath.basename(path)
        if base == OPAQUE:
            opaque.append(posixpath.dirname(path) or ".")
            continue
        if base.startswith(WHITEOUT):
            whiteouts.append(posixpath.join(posixpath.dirname(path), base[len(WHITEOUT):]))
            continue
        entry = {"type": _TYPES.get(member.type, "other"), "mode": f"{member.mode & 0o7777:04o}",
                 "uid": member.uid, "gid": member.gid, "mtime": int(member.mtime)}
        if member.issym():
            entry["target"] = member.linkname
        elif member.islnk():
            # A hard link's bytes are its target's; which name tar stores first is arbitrary, so the
            # manifest shows both names as plain files with the same content.
            target = _inside(member.linkname, "hard link's target")
            source = entries.get(target)
            if source is None or source["type"] != "file":
                entry["type"] = "hardlink"
                entry["target"] = target
            else:
                entry.update({k: source[k] for k in ("size", "sha256")})
                if "content" in source:
                    entry["content"] = source["content"]
        elif entry["type"] == "file":
            entry["size"] = member.size
            entry["sha256"], content = _hash(data, buf, _keep(path))
            total += member.size
            if content is not None:
                entry["content"] = content
        entries[path] = entry
    return {"entries": entries, "whiteouts": whiteouts, "opaque": opaque, "bytes": total}


def _hash(data, buf: bytearray, keep: bool) -> tuple[str, bytes | None]:
    """sha256 of a member, read in place into `buf`; the bytes themselves only when asked (metadata)."""
    digest = hashlib.sha256()
    kept = bytearray() if keep else None
    view = memoryview(buf)
    while n := data.readinto(view):
        digest.update(view[:n])
        if kept is not None:
            kept += view[:n]
    return digest.hexdigest(), (bytes(kept) if kept is not None else None)


# --- docker save ---------------------------------------------------------------------------------------


class _Hashing(io.RawIOBase):
    """A layer's bytes as read, hashed on the way: its digest is checked against the image config's diff_id."""

    def __init__(self, raw):
        self.raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self.raw.readinto(buf)
        self.digest.update(memoryview(buf)[:n])
        return n

    def drained(self) -> str:
        """The sha256 of every byte, after reading what the tar reader left (the end-of-archive padding)."""
        scratch = bytearray(CHUNK)
        while self.readinto(scratch):
            pass
        return "sha256:" + self.digest.hexdigest()


class _Peek(io.RawIOBase):
    """A member whose first bytes were already read (to tell a layer tar from a JSON blob)."""

    def __init__(self, head: bytes, rest):
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        if self.head:
            n = min(len(buf), len(self.head))
            buf[:n], self.head = self.head[:n], self.head[n:]
            return n
        return self.rest.readinto(buf)


GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_BLOB = 16 << 20  # manifest.json and image configs are kilobytes; a bigger JSON member is not read
_BAD_ARCHIVE = (EOFError, tarfile.TarError, ValueError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError,
                UnicodeError, KeyError, IndexError, TypeError, RecursionError)


def read_save(stream, source: str = "the archive") -> dict:
    """Parse a `docker save` tar stream into config + layers; a malformed one is a UserError naming `source`."""
    try:
        return _read_save(stream)
    except UserError as exc:
        raise UserError(f"{source}: {exc.message}", exc.hint or "pass the output of `docker save IMAGE`") from None
    except _BAD_ARCHIVE as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise UserError(f"{source}: not a valid `docker save` archive ({reason})",
                        "pass the complete output of `docker save IMAGE`") from None


def _json_blob(blobs: dict, name: str, what: str):
    if name not in blobs:
        raise UserError(f"the archive lacks its {what} ({name[:120]!r})")
    try:
        return json.loads(blobs[name])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{name[:120]} is not valid JSON ({getattr(exc, 'msg', exc)})") from None


def _read_save(stream) -> dict:
    blobs: dict[str, bytes] = {}
    layers: dict[str, dict] = {}
    for member, data in tarstream.members(stream):
        if not member.isreg():
            continue
        head = data.read(BLOCK)
        compressed = head[:2] == GZIP_MAGIC or head[:4] == ZSTD_MAGIC
        if len(head) >= 262 and head[257:262] == b"ustar" or compressed:
            raw = io.BufferedReader(_Peek(head, data), CHUNK)
            # OCI layouts (the containerd image store's `docker save`) keep layers as they are stored: gzip, or
            # zstd where the build chose it (buildkit.COMPRESSION)
            if head[:2] == GZIP_MAGIC:
                raw = io.BufferedReader(gzip.GzipFile(fileobj=raw), CHUNK)
            elif head[:4] == ZSTD_MAGIC:
                raw = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True),
                                        CHUNK)
            hashing = _Hashing(raw)
            layers[member.name] = read_layer(io.BufferedReader(hashing, CHUNK))
            layers[member.name]["diff_id"] = hashing.drained()
        elif member.size <= MAX_BLOB:
            blobs[member.name] = head + data.read()
    if "manifest.json" not in blobs:
        raise UserError("not a `docker save` archive: no manifest.json in it")
    listing = _json_blob(blobs, "manifest.json", "manifest.json")
    if not isinstance(listing, list) or not listing or not isinstance(listing[0], dict):
        raise UserError("manifest.json is not a non-empty list of image descriptions")
    top = listing[0]
    if not isinstance(top.get("Config"), str) or not isinstance(top.get("Layers"), list) \
            or not all(isinstance(name, str) for name in top["Layers"]):
        raise UserError("manifest.json lacks `Config` (text) or `Layers` (a list of names)")
    config = _json_blob(blobs, top["Config"], "image config")
    if not isinstance(config, dict) or not isinstance(config.get("rootfs", {}), dict) \
            or not isinstance(config.get("rootfs", {}).get("diff_ids", []), list):
        raise UserError(f"{top['Config'][:120]} is not an image config (no rootfs.diff_ids list)")
    missing = [name for name in top["Layers"] if name not in layers]
    if missing:
        raise UserError(f"the archive lacks layers {[m[:80] for m in missing[:3]]}")
    _check_diff_ids(top["Layers"], layers, config["rootfs"]["diff_ids"] if "rootfs" in config else [])
    return {"config": config, "config_name": top["Config"], "order": top["Layers"], "layers": layers}


def _check_diff_ids(order: list[str], layers: dict, diff_ids: list) -> None:
    """Each layer's bytes hash to the diff_id the image config names for it (the image ID covers the config,
    the config the layers): a layer swapped or altered inside the archive is refused, not listed."""
    if len(diff_ids) != len(order):
        raise UserError(f"the image config names {len(diff_ids)} layers, manifest.json {len(order)}")
    for name, want in zip(order, diff_ids):
        if layers[name]["diff_id"] != want:
            raise UserError(f"layer {name[:80]} hashes to {layers[name]['diff_id'][:19]}…, its image config says "
                            f"{str(want)[:19]}…", "this archive was altered or damaged; save the image again")


@contextmanager
def stream(image: str, name: str | None = None) -> Iterator[BinaryIO]:
    """The tar stream of `docker save image`. A save that failed (a full disk, the engine gone) is exit 3 in the
    engine's own words, and wins over whatever the caller made of the cut-off stream: an empty or truncated
    archive is what a failed save looks like, never "not a docker save archive". `name`: the image as the user
    called it, for messages."""
    c = engine.client()
    pipe = process.pipe([c.binary, "save", image], env=c.env(), bufsize=CHUNK)
    try:
        yield pipe.stdout
    except Exception:
        while pipe.stdout.read(CHUNK):  # to its end, so a save that did not fail is not killed by a closed pipe
            pass
        pipe.stdout.close()
        _check(pipe, name or image)
        raise
    except BaseException:  # Ctrl-C: no export outlives the builder
        pipe.stop()
        raise
    else:
        # Read to the end before closing: a tar reader stops at the first of the two zero blocks Docker ends the
        # archive with, and Go writes the second one separately. Closed before that write, `docker save` dies of
        # SIGPIPE, exit 141 with no output: a failed save (seen once in a clean .ci/run, 2026-12-06).
        while pipe.stdout.read(CHUNK):
            pass
    finally:
        pipe.stdout.close()
    _check(pipe, name or image)


def _check(pipe: process.Pipe, name: str) -> None:
    """Raise EnvironmentProblem (exit 3) when `docker save` exited non-zero, naming why in one line."""
    code, err = pipe.finish()
    if code == 0:
        return
    message, hint, environmental = buildkit.explain_failure(err)
    if environmental:
        raise EnvironmentProblem(f"`docker save {name}` failed: {message}", hint)
    last = ([line.strip() for line in err.splitlines() if line.strip()] or ["no output"])[-1]
    raise EnvironmentProblem(f"`docker save {name}` failed: {last[-300:]}",
                             "check the engine (`docker info`) and that the image is still there, then re-run")


def is_archive(image: str) -> bool:
    """A `docker save` file (or a pipe carrying one); a directory or device is refused, not read."""
    try:
        mode = Path(image).stat().st_mode
    except OSError:  # missing, or not even a valid path (too long, a loop): an image name is meant
        return False
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return True
    if "/" in image or not reference.parse(image):
        raise UserError(f"{image}: is {'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}, "
                        "not a `docker save` archive", "pass a tar file written by `docker save IMAGE -o FILE`")
    return False  # a directory that happens to be named like an image in cwd: the image is meant


def image_id(image: str) -> str | None:
    found = engine.image_or_none(image)
    return found.id if found is not None else None


def cache_path(ident: str) -> Path:
    return CACHE_DIR / (ident.replace(":", "-") + ".json")


def manifest(image: str, cache: bool = True) -> dict:
    """The manifest of a local image (or a `docker save` tar file). Cached by image ID: an ID is content."""
    started = time.monotonic()
    if is_archive(image):
        try:
            with open(image, "rb") as fh:
                result = build_manifest(read_save(fh, image), image)
        except OSError as exc:
            raise UserError(f"{image}: cannot read ({exc.strerror or exc})", "pass a `docker save` tar file") from None
        result["stats"] = {"seconds": round(time.monotonic() - started, 1), "cached": False}
        return result
    reference.check_image_name(image)
    ident = image_id(image)
    if ident is None:
        raise UserError(f"image {image} is not here", "build it, or `docker pull` it first")
    cached = cache_path(ident)
    try:
        result = json.loads(cached.read_text()) if cache and cached.exists() else None
    except (OSError, ValueError):
        result = None  # a damaged cache entry is rebuilt, not trusted
    if result is not None and not manifest_model.well_formed(result):
        log.info(f"warning: the manifest cache {cached} is not a whole manifest of this image: rebuilt")
        result = None
    if result is not None:
        result["image"] = image
        result["stats"] = {"seconds": round(time.monotonic() - started, 1), "cached": True}
        return result
    with stream(ident, image) as saving:
        saved = read_save(saving, f"`docker save {image}`")
    result = build_manifest(saved, image)
    if cache:
        try:
            fsutil.write_atomic(cached, json.dumps(result, sort_keys=True, separators=(",", ":")))
        except OSError as exc:  # the cache only saves time: a full disk here costs the next run a save
            log.info(f"warning: the manifest cache {cached} was not written ({exc.strerror or exc})")
    seconds = round(time.monotonic() - started, 1)
    result["stats"] = {"seconds": seconds, "cached": False,
                       "mb_per_s": round(result["totals"]["bytes"] / 1e6 / max(seconds, 0.1), 1)}
    return result
