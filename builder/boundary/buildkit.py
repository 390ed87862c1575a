"""BuildKit builds through the docker CLI: the build context, the input hash, labels, secrets, the argv.

Build and repro both describe a build as a `BuildSpec` and hand it to `run`; neither knows how the command
line is assembled. The Docker SDK cannot do BuildKit builds (no secrets, no cache mounts), so the CLI
chosen by `engine.client()` runs them (https://github.com/docker/docker-py/issues/2230).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import builder
from builder import fsutil, log
from builder.boundary import baseimage, engine, git, process
from builder.errors import BuilderError
from builder.model import attestations, context, paths
from builder.model.inputs import Inputs
from builder.model.matrix import Entry

LABEL_PREFIX = "io.train-images"
SOURCE_URL = os.environ.get("BUILDER_SOURCE_URL", "https://github.com/train-images/train-images")
ZIP_EPOCH = 315532800  # 1980-01-01: the fixed time when there is no git history


@dataclass(frozen=True)
class BuildSpec:
    """Everything that decides an image's bytes, plus where the result goes."""

    entry: Entry
    context: Path
    ref: str  # the name the built image gets
    base_ref: str
    base_substituted: bool
    base_id: str | None = None  # the local image ID behind base_ref, when the engine has it
    build_args: Mapping[str, str] = field(default_factory=dict)  # besides BASE_IMAGE
    epoch: int = ZIP_EPOCH
    no_cache: bool = False
    cache_ref: str | None = None  # a registry build cache (buildx only); it changes speed, never the bytes
    rewrite_timestamps: bool = False  # the engine dates the image with ZIP_EPOCH (engine.rewrites_timestamps)
    compression: str = "zstd"  # of the layers, where the build writes them compressed (see `layer_compression`)
    image_store: str = "classic"  # the engine's (engine.image_store): only the containerd store keeps layers as built


COMPRESSIONS = ("zstd", "gzip")


def spec(entry: Entry, inputs: Inputs, *, context: Path, ref: str, no_cache: bool,
         cache_ref: str | None = None, compression: str = "zstd") -> BuildSpec:
    """The build the inputs describe: which base (pinned, a mirror, or a local copy), which apt mirror."""
    ref_used = inputs.base_image or baseimage.reference(entry, local=inputs.local_base)
    base = baseimage.describe(entry, ref_used)
    extra = {"APT_MIRROR": inputs.apt_mirror} if inputs.apt_mirror else {}
    rewrite = engine.rewrites_timestamps()
    return BuildSpec(entry=entry, context=context, ref=ref, base_ref=base["ref"], base_id=base["image_id"],
                     base_substituted=base["substituted"], build_args=extra, epoch=source_date_epoch(entry),
                     no_cache=no_cache, cache_ref=cache_ref, rewrite_timestamps=rewrite, compression=compression,
                     image_store=engine.image_store() if rewrite else "classic")  # only a rewriting build asks


def layer_compression(spec: BuildSpec) -> str:
    """How the built image's layers are compressed when pushed. Where the build writes the image itself (buildx
    against an engine >= 26, see `argv`) into the containerd image store, which keeps blobs as they came, it is
    the spec's choice: zstd unpacks several times faster than gzip (docs/benchmarks.md) and needs Docker >= 23 or
    containerd >= 1.5 to pull. Elsewhere gzip: a classic store (Docker 20.10, and newer engines without the
    containerd store) keeps layers uncompressed and compresses them with gzip when it pushes."""
    return spec.compression if spec.rewrite_timestamps and spec.image_store == "containerd" else "gzip"


def _compression_options(compression: str) -> str:
    # zstd: force-compression recompresses the base image's layers (gzip as pulled) too, so that the whole image has
    # one compression and one client floor. gzip: what is gzip already stays as it is.
    if compression == "zstd":
        return "compression=zstd,compression-level=3,force-compression=true,oci-mediatypes=true"
    return "compression=gzip,oci-mediatypes=true"


def input_hash(spec: BuildSpec) -> str:
    """Everything that changes the image's bytes: the staged context, every build argument, the base
    reference (and its local image ID when it has no digest) and the builder's version. Two builds with the
    same hash are interchangeable."""
    digest = hashlib.sha256()
    digest.update(f"builder {builder.__version__}\0context {context.digest(spec.context)}\0".encode())
    for key, value in sorted(build_args(spec).items()):
        digest.update(f"arg {key}={value}\0".encode())
    # A base reference without a digest (`--local-base`, a mirror tag) can name other bytes tomorrow: its
    # local image ID stands in for the digest. A pinned reference is its own proof.
    if "@sha256:" not in spec.base_ref:
        digest.update(f"base-id {spec.base_id or ''}\0".encode())
    return digest.hexdigest()


def build_args(spec: BuildSpec) -> dict[str, str]:
    # No SOURCE_DATE_EPOCH: the Dockerfile fixes it for every step (ZIP_EPOCH), so that a commit does not invalidate
    # the install layers; spec.epoch (the inputs' last commit) dates the image in its labels only.
    return {"BASE_IMAGE": spec.base_ref, **spec.build_args}


def source_date_epoch(entry: Entry) -> int:
    """The inputs' last commit time (dockerfiles/<tag>/, locks/<tag>/ and smoke/): it dates the image in its
    labels. The timestamps the build writes come from the SOURCE_DATE_EPOCH the Dockerfile fixes, not from this."""
    return git.last_commit_time([paths.tag_dir(entry), paths.lock_dir(entry), paths.SMOKE_DIR]) or ZIP_EPOCH


def git_revision() -> str:
    return git.revision([paths.DOCKERFILES, paths.LOCKS, paths.SMOKE_DIR])


def labels(spec: BuildSpec, facts: dict, digest: str) -> dict[str, str]:
    """OCI annotations plus our own: every pin, the input hash, the minimum driver, the base used."""
    entry = spec.entry
    created = datetime.fromtimestamp(spec.epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = {
        "org.opencontainers.image.title": paths.image_ref(entry),
        "org.opencontainers.image.version": entry.tag,
        "org.opencontainers.image.source": SOURCE_URL,
        "org.opencontainers.image.revision": git_revision(),
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.base.name": entry.base_name,
        "org.opencontainers.image.base.digest": entry.base_digest or "",
        f"{LABEL_PREFIX}.tag": entry.tag,
        f"{LABEL_PREFIX}.input-hash": digest,
        f"{LABEL_PREFIX}.builder-version": builder.__version__,
        f"{LABEL_PREFIX}.python": facts["python"],
        f"{LABEL_PREFIX}.cuda": facts["cuda"],
        f"{LABEL_PREFIX}.min-driver": facts["min_driver"],
        f"{LABEL_PREFIX}.base.used": spec.base_ref,
        f"{LABEL_PREFIX}.base.substituted": "true" if spec.base_substituted else "false",
    }
    for name, version in facts["pins"].items():
        out[f"{LABEL_PREFIX}.pin.{name}"] = version or "none"
    return out


# --- secrets ---------------------------------------------------------------------------------------------


@contextmanager
def secret_files(inputs: Inputs) -> Iterator[dict[str, str]]:
    """The index URLs (they carry tokens) as files in a private temp dir, handed to BuildKit as secrets, then
    deleted; the CA bundle is handed as the file it is. Yields {secret id: file path}."""
    tmp = Path(tempfile.mkdtemp(prefix="builder-secrets-"))
    os.chmod(tmp, 0o700)
    secrets: dict[str, str] = {"pip_cert": inputs.ca_bundle} if inputs.ca_bundle else {}
    try:
        for secret_id, value in inputs.secrets.items():
            path = tmp / secret_id
            path.write_text(value)
            os.chmod(path, 0o600)
            secrets[secret_id] = str(path)
        yield secrets
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- the command -----------------------------------------------------------------------------------------


def argv(spec: BuildSpec, secrets: Mapping[str, str], image_labels: Mapping[str, str],
         metadata: Path | None = None) -> list[str]:
    # Every step of the image gives what it wrote SOURCE_DATE_EPOCH as its time (the Dockerfile's layer_end), so a
    # layer is the same bytes in every build. Where BuildKit also dates the image config from the build argument
    # SOURCE_DATE_EPOCH (buildx against an engine >= 26: spec.rewrite_timestamps), the same inputs give the same
    # image digest, and the engine's own exporter writes it: nothing is rewritten, archived or loaded, and a layer
    # taken from the cache keeps its blob. The argument's value is the Dockerfile's own, so no step changes, nor
    # does the input hash. No attestation goes into the image (BuildKit's provenance holds build times, which would
    # make each image differ); buildx >= 0.14 writes BuildKit's provenance of this build into `metadata` instead.
    dated = spec.rewrite_timestamps
    stored = dated and spec.image_store == "containerd"  # a store that keeps the layers as the build wrote them
    out = engine.client().build_argv(f"type=image,name={spec.ref},{_compression_options(spec.compression)}"
                                     if stored else None)
    out += ["--progress=plain", "--network=host", "-t", spec.ref]
    if dated:
        out += ["--provenance=false", "--build-arg", f"SOURCE_DATE_EPOCH={ZIP_EPOCH}"]
    if metadata is not None and engine.client().mode == "buildx":
        out += ["--metadata-file", str(metadata)]
    for key, value in sorted(build_args(spec).items()):
        out += ["--build-arg", f"{key}={value}"]
    if spec.no_cache:
        out.append("--no-cache")
    if spec.cache_ref:
        out += cache_flags(spec.cache_ref, cache_support().mode, layer_compression(spec))
    for secret_id, path in sorted(secrets.items()):
        out += ["--secret", f"id={secret_id},src={path}"]
    for key, value in sorted(image_labels.items()):
        out += ["--label", f"{key}={value}"]
    return out + ["-f", str(spec.context / "Dockerfile"), str(spec.context)]


# --- the registry build cache: what this builder can do with it -----------------------------------------------


@dataclass(frozen=True)
class CacheSupport:
    mode: str  # "registry": read and write; "read": import only; "none": no registry cache at all
    why: str  # said once by build when the cache is not fully used; "" for "registry"


def _probe(argv: list[str]) -> str:
    """A capability probe's output; one that fails or hangs answers "" (the capability is not there)."""
    try:
        result = process.run(argv, timeout=30, echo=False, env=engine.client().env())
    except BuilderError:  # not there, or hangs: "not supported", never a crash
        return ""
    return result.stdout if result.returncode == 0 else ""


@functools.lru_cache(maxsize=1)
def cache_support() -> CacheSupport:
    """Which registry cache this docker can use. Exporting one (`--cache-to type=registry`) needs buildx with a
    driver that exports: docker-container, kubernetes or remote, or the default `docker` driver on an engine using
    the containerd image store; the `docker` driver on the classic store refuses the build outright ("Cache export
    is not supported for the docker driver"), but it can still import a cache. Without buildx there is none."""
    client = engine.client()
    if client.mode != "buildx":
        return CacheSupport("none", f"{client.binary} has no buildx (a legacy BuildKit build reads no registry cache)")
    found = re.search(r"^Driver:\s*(\S+)", _probe([client.binary, "buildx", "inspect"]), re.M)
    driver = found.group(1) if found else "unknown"
    if driver in ("docker-container", "kubernetes", "remote"):
        return CacheSupport("registry", "")
    if driver == "docker" and engine.image_store() == "containerd":
        return CacheSupport("registry", "")
    return CacheSupport("read", f"buildx's `{driver}` driver cannot export a registry cache (it can read one); "
                                "`docker buildx create --use --driver docker-container`, or the containerd image "
                                "store, makes it write the cache too")


def cache_flags(ref: str, mode: str, compression: str = "gzip") -> list[str]:
    """The cache's blobs are compressed as the image's are: a builder that takes a layer from the cache then
    writes it into its image as it came."""
    read = ["--cache-from", f"type=registry,ref={ref}"]
    write = ["--cache-to", f"type=registry,ref={ref},mode=max,{_compression_options(compression)}"]
    return {"registry": read + write, "read": read}.get(mode, [])


# BuildKit sometimes loses the client's session (the secrets and the context live there) on a loaded machine:
# a transient of BuildKit itself (https://github.com/moby/buildkit/issues/6422), not of the inputs.
SESSION_LOST = re.compile(r"no active session for \S+: context deadline exceeded")


def run(spec: BuildSpec, image_labels: Mapping[str, str], inputs: Inputs,
        provenance: Path | None = None) -> tuple[int, str, str]:
    """Run the build; returns (exit code, combined output, the command as shown), secrets masked in all three.
    A build that failed only because BuildKit lost its session is run once more, and says so. `provenance`: where
    BuildKit's provenance statement of the built image goes, replacing the last one only when this build succeeded
    and buildx reported one (a failed or interrupted build leaves the image before it, and its statement, as they
    were); its subject says which image it is for, and only that image's is ever used (build, publish)."""
    paths.CONTEXT_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=paths.CONTEXT_ROOT) as scratch:
        metadata = Path(scratch) / "metadata.json"

        def attempt():
            with secret_files(inputs) as secrets:
                return engine.run_cli(argv(spec, secrets, image_labels, metadata), mask=tuple(inputs.secret_values))

        proc = attempt()
        if proc.returncode != 0 and SESSION_LOST.search(proc.stdout):
            log.info("warning: BuildKit lost this build's client session (a known transient under load, "
                     "moby/buildkit#6422): building once more")
            proc = attempt()
        if proc.returncode == 0 and provenance is not None:
            statement = provenance_statement(metadata, spec.ref)
            if statement is not None:
                fsutil.write_atomic(provenance, json.dumps(statement, indent=1, sort_keys=True) + "\n")
        return proc.returncode, proc.stdout, proc.shown


def provenance_statement(metadata: Path, ref: str) -> dict | None:
    """BuildKit's provenance of the build, from buildx's metadata file (`buildx.build.provenance`, written by buildx
    >= 0.14 under BUILDX_METADATA_PROVENANCE=max from the engine's record of this build), as the in-toto statement
    BuildKit would attach: its subject the image manifest this build wrote (`containerimage.digest`, the same
    file). buildx gives SLSA v0.2 there (it converts v1). None where the file holds no provenance (buildx 0.13,
    legacy builds) or no image digest."""
    try:
        found = json.loads(metadata.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    predicate, digest = found.get("buildx.build.provenance"), str(found.get("containerimage.digest") or "")
    if not isinstance(predicate, dict) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return None
    return {"_type": "https://in-toto.io/Statement/v0.1", "predicateType": attestations.BUILDKIT_PROVENANCE,
            "subject": [{"name": f"pkg:docker/{ref}", "digest": {"sha256": digest.split(":", 1)[1]}}],
            "predicate": predicate}


DISK_FULL_HINT = ("free space where the Docker engine keeps its data (`docker info -f '{{.DockerRootDir}}'`): "
                  "`docker builder prune` / `docker image prune`, then re-run the same command")
FAILURE_PATTERNS = (
    # A RUN step prints "No space left on device" (strerror), the engine "no space left on device": both.
    (r"(?im)^(?:#\d+ (?:\d+\.\d+ )?)?(?:ERROR: )?(.*(?:no space left on device|disk quota exceeded).*)$",
     "the disk is full ({0})", DISK_FULL_HINT),
    (r"THESE PACKAGES DO NOT MATCH THE HASHES[\s\S]*?\n\s+(\S+)",
     "a downloaded package does not match its lock hash: {0}",
     "the index served other bytes: check the index/mirror, or re-lock if the pin moved"),
    (r"ResolutionImpossible|conflicting dependencies|(\S+ [^\n]* has requirement [^\n]*)", "pip found a conflict {0}",
     "re-run `python -m builder lock TAG` and `python -m builder resolve TAG`"),
    (r"Version '([^']+)' for '([^']+)' was not found", "apt: version {0} of {1} is no longer in the archive",
     "re-run `python -m builder lock TAG` (apt pins) and commit apt.lock"),
    (r"(?:failed to resolve source metadata for|pull access denied for|failed to do request[^\n]*)\s*(\S+)",
     "the base image cannot be pulled: {0}",
     "pull it through a mirror (--base-image REF) or provide a local copy (--local-base)"),
    (r"CERTIFICATE_VERIFY_FAILED", "TLS verification failed inside the build (an intercepting proxy?)",
     "pass the proxy's CA bundle: --ca-bundle PATH (handed in as a BuildKit secret)"),
)
# The docker client's own words when the engine it talks to goes away (stopped, restarted, crashed) or was
# never there. Matched only on the client's lines, never on a RUN step's output (`#5 1.23 …`): a pip
# download that ends early prints "EOF" too, and that is not the engine's fault.
ENGINE_GONE = re.compile(
    r"^(?:ERROR: )?(?:failed to build: )?(?:failed to solve: )?(?:rpc error: code = Unavailable desc = |Unavailable: )?"
    r"(?:error reading from server: )?"
    r"(?:unexpected )?EOF$"
    r"|Cannot connect to the Docker daemon at \S+"
    r"|error during connect: "
    r"|rpc error: code = Unavailable desc = (?:transport is closing|connection error|error reading from server)"
    r"|transport is closing$"
    r"|unix \S*: (?:read|write|connect): (?:connection reset by peer|connection refused|broken pipe"
    r"|no such file or directory)",
    re.MULTILINE)
_STEP_OUTPUT = re.compile(r"^#\d+ \d+\.\d+ .*$\n?", re.MULTILINE)
ENVIRONMENT_FAILURES = ("the disk is full", "the base image cannot be pulled")


def explain_failure(output: str) -> tuple[str, str, bool]:
    """(message, hint, is the machine's fault rather than the inputs') for a failed build's output."""
    disk = re.search(FAILURE_PATTERNS[0][0], output)
    if not disk:  # a full disk can also take the engine down: the disk is the cause to report
        gone = ENGINE_GONE.search(_STEP_OUTPUT.sub("", output))
        if gone:
            return (f"the Docker engine at {engine.address()} stopped answering during the build "
                    f"({gone.group(0).strip()[:120]})", engine.GONE_HINT, True)
    for pattern, message, hint in FAILURE_PATTERNS:
        m = re.search(pattern, output)
        if m:
            groups = [g.strip()[:200] for g in m.groups() if g] if m.groups() else []
            text = message.format(*(groups + ["", ""])).strip()
            return text, hint, any(text.startswith(e) for e in ENVIRONMENT_FAILURES)
    tail = [line.strip() for line in output.splitlines() if line.strip()][-3:]
    return "docker build failed: " + " | ".join(tail)[-400:], "see the build log above", False


def planned_input_hash(entry: Entry) -> str:
    """The input hash a CI build of the entry will have (pinned base, no mirror), computed without an engine:
    the plan compares it with the published image's label to rebuild only what changed. Staged in a private
    temporary directory (the hash reads the files, not where they lie): planning only reads the checkout, works
    in a read-only one, and any number of plans at once share nothing."""
    with tempfile.TemporaryDirectory(prefix="builder-plan-") as scratch:
        staged = context.stage(entry, Inputs(), root=Path(scratch))
        return input_hash(BuildSpec(entry=entry, context=staged, ref=paths.image_ref(entry), base_ref=entry.base,
                                    base_substituted=False, epoch=source_date_epoch(entry)))
