"""BuildKit builds through the docker CLI: the build context, the input hash, labels, secrets, the argv.

Build and repro both describe a build as a `BuildSpec` and hand it to `run`; neither knows how the command
line is assembled. The Docker SDK cannot do BuildKit builds (no secrets, no cache mounts), so the CLI
chosen by `engine.client()` runs them (https://github.com/docker/docker-py/issues/2230).
"""

from __future__ import annotations

import hashlib
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
from builder.boundary import baseimage, engine, git
from builder.errors import UserError
from builder.model import paths
from builder.model.matrix import Entry

LABEL_PREFIX = "io.train-images"
SOURCE_URL = os.environ.get("BUILDER_SOURCE_URL", "https://github.com/train-images/train-images")
ZIP_EPOCH = 315532800  # 1980-01-01: the fixed time when there is no git history
# Sensitive settings and the BuildKit secret id each travels under; never a build arg (visible in history).
SECRET_ENV = (("PIP_INDEX_URL", "pip_index_url"), ("PIP_EXTRA_INDEX_URL", "pip_extra_index_url"))


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


def spec(entry: Entry, *, context: Path, ref: str, base_image: str | None, local_base: bool, apt_mirror: str | None,
         no_cache: bool, cache_ref: str | None = None) -> BuildSpec:
    """The build the flags describe: which base (pinned, a mirror, or a local copy), which apt mirror."""
    ref_used = base_image or baseimage.reference(entry, local=local_base)
    base = baseimage.describe(entry, ref_used)
    extra = {"APT_MIRROR": apt_mirror} if apt_mirror else {}
    return BuildSpec(entry=entry, context=context, ref=ref, base_ref=base["ref"], base_id=base["image_id"],
                     base_substituted=base["substituted"], build_args=extra, epoch=source_date_epoch(entry),
                     no_cache=no_cache, cache_ref=cache_ref)


# --- the context -----------------------------------------------------------------------------------------


def stage_context(entry: Entry, root: Path = paths.CONTEXT_ROOT) -> Path:
    """Copy exactly the files the image is made of (dockerfiles/<tag>/ and smoke/) into root/<tag>/."""
    source = paths.tag_dir(entry)
    if not (source / "Dockerfile").exists():
        raise UserError(f"{source}/Dockerfile does not exist", f"run `python -m builder render {entry.tag}`")
    target = root / entry.tag
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and not path.is_symlink():
            shutil.copy2(path, target / path.name)
    shutil.copytree(paths.SMOKE_DIR, target / "smoke", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def context_hash(context: Path) -> str:
    """sha256 over every file in the context: path, executable bit and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        digest.update(f"{rel}\0{os.access(path, os.X_OK)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def input_hash(spec: BuildSpec) -> str:
    """Everything that changes the image's bytes: the staged context, every build argument, the base
    reference and the builder's version. Two builds with the same hash are interchangeable."""
    digest = hashlib.sha256()
    digest.update(f"builder {builder.__version__}\0context {context_hash(spec.context)}\0".encode())
    for key, value in sorted(build_args(spec).items()):
        digest.update(f"arg {key}={value}\0".encode())
    # A base reference without a digest (`--local-base`, a mirror tag) can name other bytes tomorrow: its
    # local image ID stands in for the digest. A pinned reference is its own proof.
    if "@sha256:" not in spec.base_ref:
        digest.update(f"base-id {spec.base_id or ''}\0".encode())
    return digest.hexdigest()


def build_args(spec: BuildSpec) -> dict[str, str]:
    # No SOURCE_DATE_EPOCH: the Dockerfile fixes it for every step, so that a commit does not invalidate the
    # install layers; spec.epoch (the inputs' last commit) dates the image in its labels only.
    return {"BASE_IMAGE": spec.base_ref, **spec.build_args}


def source_date_epoch(entry: Entry) -> int:
    """Timestamps the build writes come from the inputs' last commit, not the clock."""
    return git.last_commit_time([paths.tag_dir(entry), paths.SMOKE_DIR]) or ZIP_EPOCH


def git_revision() -> str:
    return git.revision([paths.DOCKERFILES, paths.SMOKE_DIR])


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
def secret_files(ca_bundle: str | None, environ: Mapping[str, str] = os.environ) -> Iterator[tuple[dict, list]]:
    """Sensitive settings as files in a private temp dir, handed to BuildKit as secrets, then deleted.

    Yields ({secret id: file path}, [secret values to mask in anything printed])."""
    tmp = Path(tempfile.mkdtemp(prefix="builder-secrets-"))
    os.chmod(tmp, 0o700)
    secrets: dict[str, str] = {}
    values: list[str] = []
    try:
        bundle = ca_bundle or environ.get("PIP_CERT") or environ.get("SSL_CERT_FILE")
        if bundle:
            if not Path(bundle).is_file():
                raise UserError(f"CA bundle {bundle} does not exist", "pass --ca-bundle PATH or unset PIP_CERT")
            secrets["pip_cert"] = bundle
        for env_name, secret_id in SECRET_ENV:
            value = environ.get(env_name)
            if value:
                path = tmp / secret_id
                path.write_text(value)
                os.chmod(path, 0o600)
                secrets[secret_id] = str(path)
                values.append(value)
        yield secrets, values
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- the command -----------------------------------------------------------------------------------------


def argv(spec: BuildSpec, secrets: Mapping[str, str], image_labels: Mapping[str, str]) -> list[str]:
    out = engine.client().build_argv() + ["--progress=plain", "--network=host", "-t", spec.ref]
    for key, value in sorted(build_args(spec).items()):
        out += ["--build-arg", f"{key}={value}"]
    if spec.no_cache:
        out.append("--no-cache")
    if spec.cache_ref and engine.client().mode == "buildx":
        out += ["--cache-from", f"type=registry,ref={spec.cache_ref}",
                "--cache-to", f"type=registry,ref={spec.cache_ref},mode=max"]
    for secret_id, path in sorted(secrets.items()):
        out += ["--secret", f"id={secret_id},src={path}"]
    for key, value in sorted(image_labels.items()):
        out += ["--label", f"{key}={value}"]
    return out + ["-f", str(spec.context / "Dockerfile"), str(spec.context)]


def run(spec: BuildSpec, image_labels: Mapping[str, str], ca_bundle: str | None) -> tuple[int, str, str]:
    """Run the build; returns (exit code, combined output, the command as shown), secrets masked in all three."""
    with secret_files(ca_bundle) as (secrets, secret_values):
        proc = engine.run_cli(argv(spec, secrets, image_labels), mask=tuple(secret_values))
    return proc.returncode, proc.stdout, proc.shown


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
    r"^(?:ERROR: )?(?:failed to solve: )?(?:rpc error: code = Unavailable desc = )?(?:error reading from server: )?"
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


def planned_input_hash(entry: Entry, root: Path = paths.CONTEXT_ROOT / "plan") -> str:
    """The input hash a CI build of the entry will have (pinned base, no mirror), computed without an engine:
    the plan compares it with the published image's label to rebuild only what changed."""
    context = stage_context(entry, root=root)
    return input_hash(BuildSpec(entry=entry, context=context, ref=paths.image_ref(entry), base_ref=entry.base,
                                base_substituted=False, epoch=source_date_epoch(entry)))
