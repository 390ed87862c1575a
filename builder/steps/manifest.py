"""Content manifest of an image, read from `docker save` without running it.

The save is streamed: each layer tar is read once, every file hashed incrementally, then the layers are
applied in order (whiteouts `.wh.NAME` delete, `.wh..wh..opq` makes a directory opaque) to get the final
filesystem. The manifest lists every path there (type, mode, owner, size, sha256, link target), the
Python packages (`*.dist-info/METADATA` + `INSTALLER`, `*.egg-info/PKG-INFO`), the OS packages
(`/var/lib/dpkg/status`) and, separately, the layer digests.

`mtime` is recorded but is not content: `compare` and `repro` report it as its own class, because Docker
20.10's BuildKit cannot rewrite layer timestamps to SOURCE_DATE_EPOCH (docs/reproducibility.md).
"""

from __future__ import annotations

import email.parser
import gzip
import hashlib
import io
import json
import posixpath
import stat
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from builder import fsutil, log
from builder.boundary import engine, imagesave, tarstream
from builder.errors import UserError
from builder.model import paths, reference

FORMAT = 1
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


NAME = "manifest"
HELP = "content manifest of an image (files, Python and OS packages)"
NEEDS_MATRIX = False


@dataclass(frozen=True)
class Options:
    image: str
    output: str | None = None


def add_arguments(p) -> None:
    p.add_argument("image", metavar="IMAGE", help="image reference or ID (or a `docker save` tar file)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the JSON here (default: stdout)")


# --- reading one layer ---------------------------------------------------------------------------------


def _norm(name: str) -> str:
    name = posixpath.normpath("/" + name).lstrip("/")
    return name or "."


def _keep(path: str) -> bool:
    return path in _KEEP_PATHS or path.endswith(_KEEP_SUFFIXES)


def read_layer(stream) -> dict:
    """One layer tar, streamed: {"entries": {path: entry}, "whiteouts": [...], "opaque": [...], "bytes": n}."""
    entries: dict[str, dict] = {}
    whiteouts, opaque, total = [], [], 0
    buf = bytearray(CHUNK)
    for member, data in tarstream.members(stream):
        path = _norm(member.name)
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
            source = entries.get(_norm(member.linkname))
            if source is None or source["type"] != "file":
                entry["type"] = "hardlink"
                entry["target"] = _norm(member.linkname)
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


# --- applying layers -----------------------------------------------------------------------------------


def _drop_below(fs: dict, path: str, include_self: bool) -> None:
    prefix = "" if path == "." else path + "/"
    for key in [k for k in fs if (k.startswith(prefix) and k != path) or (include_self and k == path)]:
        del fs[key]


def apply_layers(layers: list[dict]) -> dict[str, dict]:
    """The final filesystem: each layer's whiteouts and opaque dirs hide what is below, then its entries land."""
    fs: dict[str, dict] = {}
    for layer in layers:
        for directory in layer["opaque"]:
            _drop_below(fs, directory, include_self=False)
        for path in layer["whiteouts"]:
            _drop_below(fs, path, include_self=True)
        for path, entry in layer["entries"].items():
            old = fs.get(path)
            if old is not None and old["type"] == "dir" and entry["type"] != "dir":
                _drop_below(fs, path, include_self=False)  # a directory replaced by a file loses its children
            fs[path] = entry
    fs.pop(".", None)
    return fs


# --- packages ------------------------------------------------------------------------------------------


def _headers(content: bytes) -> dict:
    head = content.split(b"\n\n", 1)[0].decode("utf-8", "replace")
    msg = email.parser.Parser().parsestr(head, headersonly=True)
    return {"name": msg.get("Name"), "version": msg.get("Version")}


def python_packages(fs: dict[str, dict]) -> list[dict]:
    out = []
    for path, entry in fs.items():
        if not (path.endswith((".dist-info/METADATA", ".egg-info/PKG-INFO")) and "content" in entry):
            continue
        meta = _headers(entry["content"])
        if not meta["name"]:
            continue
        installer = fs.get(posixpath.join(posixpath.dirname(path), "INSTALLER"), {}).get("content")
        out.append({"name": meta["name"], "version": meta["version"], "path": posixpath.dirname(path),
                    "installer": installer.decode("utf-8", "replace").strip() if installer else None})
    return sorted(out, key=lambda p: (p["name"].lower(), p["path"]))


def dpkg_packages(status: bytes | None) -> list[dict]:
    """Installed packages from /var/lib/dpkg/status (only `install ok installed` ones)."""
    out = []
    for paragraph in (status or b"").decode("utf-8", "replace").split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            out.append({"name": fields["Package"], "version": fields.get("Version"),
                        "architecture": fields.get("Architecture")})
    return sorted(out, key=lambda p: (p["name"], p["architecture"] or ""))


# --- docker save ---------------------------------------------------------------------------------------


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


MAX_BLOB = 16 << 20  # manifest.json and image configs are kilobytes; a bigger JSON member is not read
_BAD_ARCHIVE = (EOFError, tarfile.TarError, ValueError, zlib.error, gzip.BadGzipFile, UnicodeError, KeyError,
                IndexError, TypeError, RecursionError)


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
        if len(head) >= 262 and head[257:262] == b"ustar" or head[:2] == b"\x1f\x8b":
            raw = io.BufferedReader(_Peek(head, data), CHUNK)
            if head[:2] == b"\x1f\x8b":  # OCI layouts may keep layers compressed
                raw = io.BufferedReader(gzip.GzipFile(fileobj=raw), CHUNK)
            layers[member.name] = read_layer(raw)
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
    return {"config": config, "config_name": top["Config"], "order": top["Layers"], "layers": layers}


def build_manifest(saved: dict, image: str) -> dict:
    fs = apply_layers([saved["layers"][name] for name in saved["order"]])
    status = fs.get("var/lib/dpkg/status", {}).get("content")
    manifest = {
        "format": FORMAT,
        "image": image,
        "config_digest": "sha256:" + saved["config_name"].rsplit("/", 1)[-1].removesuffix(".json"),
        "layers": [{"diff_id": d} for d in saved["config"].get("rootfs", {}).get("diff_ids", [])],
        "python_packages": python_packages(fs),
        "os_packages": dpkg_packages(status),
        "files": {path: {k: v for k, v in entry.items() if k != "content"} for path, entry in sorted(fs.items())},
    }
    manifest["totals"] = {"files": sum(e["type"] == "file" for e in fs.values()), "paths": len(fs),
                          "bytes": sum(e.get("size", 0) for e in fs.values() if e["type"] == "file")}
    return manifest


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
    if isinstance(result, dict):
        result["image"] = image
        result["stats"] = {"seconds": round(time.monotonic() - started, 1), "cached": True}
        return result
    with imagesave.stream(ident, image) as saving:
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


def dumps(result: dict) -> str:
    """The deterministic JSON form: timing (`stats`) is left out, keys sorted."""
    return json.dumps({k: v for k, v in result.items() if k != "stats"}, indent=1, sort_keys=True) + "\n"


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
