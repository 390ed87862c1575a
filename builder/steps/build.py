"""Build images with BuildKit (step 5): stage the context, skip unchanged inputs, hand secrets in as
BuildKit secrets, label, verify, report.

Reads only what render and lock wrote (dockerfiles/<tag>/) plus smoke/, which is copied into every image.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from builder import log, reports
from builder.boundary import engine
from builder.boundary import inspect as verify
from builder.errors import BuilderError, EnvironmentProblem, StepFailed, UserError
from builder.model.matrix import Entry
from builder.steps import lock

DOCKERFILES = Path("dockerfiles")
SMOKE_DIR = Path("smoke")
CONTEXT_ROOT = Path("build/context")
LABEL_PREFIX = "io.train-images"
SOURCE_URL = os.environ.get("BUILDER_SOURCE_URL", "https://github.com/train-images/train-images")
# Files that go into the image's build context, besides smoke/.
CONTEXT_FILES = ("Dockerfile", "image.json", lock.TORCH_LOCK, lock.LOCK, lock.APT_LOCK, lock.FLASH_LOCK)


def add_arguments(p) -> None:
    p.add_argument("--all", action="store_true", help="build every entry")
    p.add_argument("--force", action="store_true", help="build even when an image with the same inputs exists")
    p.add_argument("--no-cache", action="store_true", help="no BuildKit layer cache (downloads stay cached)")
    p.add_argument("--local-base", action="store_true",
                   help="prefer a local image named like the base (name:tag, no digest) when one exists; "
                        "the substitution is recorded in labels and the report")
    p.add_argument("--base-image", metavar="REF", help="use this base reference instead (a mirror)")
    p.add_argument("--apt-mirror", metavar="URL", help="apt mirror, e.g. http://mirror.local/debian")
    p.add_argument("--ca-bundle", metavar="PATH",
                   help="extra CA bundle for pip inside the build (default: $PIP_CERT or $SSL_CERT_FILE)")


# --- inputs --------------------------------------------------------------------------------------------


def stage_context(entry: Entry, root: Path = CONTEXT_ROOT) -> Path:
    """Copy exactly the files the image is made of into build/context/<tag>/ (a clean build context)."""
    source = DOCKERFILES / entry.tag
    if not (source / "Dockerfile").exists():
        raise UserError(f"{source}/Dockerfile does not exist", f"run `python -m builder render {entry.tag}`")
    target = root / entry.tag
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in CONTEXT_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)
    shutil.copytree(SMOKE_DIR, target / "smoke", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def input_hash(context: Path) -> str:
    """sha256 over every file in the context: path, executable bit and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        digest.update(f"{rel}\0{os.access(path, os.X_OK)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def source_date_epoch(entry: Entry) -> int:
    """Timestamps the build writes come from the inputs' last commit, not the clock."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct", "--", str(DOCKERFILES / entry.tag), str(SMOKE_DIR)],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return int(out) if out else 315532800
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 315532800  # 1980-01-01, the zip epoch: fixed when there is no git history


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(DOCKERFILES), str(SMOKE_DIR)],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "unknown") + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


def local_ref(entry: Entry) -> str:
    return f"{entry.image}:{entry.tag}"


def labels(entry: Entry, facts: dict, digest: str, epoch: int, base: dict) -> dict[str, str]:
    created = datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = {
        "org.opencontainers.image.title": local_ref(entry),
        "org.opencontainers.image.version": entry.tag,
        "org.opencontainers.image.source": SOURCE_URL,
        "org.opencontainers.image.revision": git_revision(),
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.base.name": entry.base_name,
        "org.opencontainers.image.base.digest": entry.base_digest or "",
        f"{LABEL_PREFIX}.tag": entry.tag,
        f"{LABEL_PREFIX}.input-hash": digest,
        f"{LABEL_PREFIX}.python": facts["python"],
        f"{LABEL_PREFIX}.cuda": facts["cuda"],
        f"{LABEL_PREFIX}.min-driver": facts["min_driver"],
        f"{LABEL_PREFIX}.base.used": base["ref"],
        f"{LABEL_PREFIX}.base.substituted": "true" if base["substituted"] else "false",
    }
    for name, version in facts["pins"].items():
        out[f"{LABEL_PREFIX}.pin.{name}"] = version or "none"
    return out


# --- secrets -------------------------------------------------------------------------------------------


@contextmanager
def secret_files(ca_bundle: str | None):
    """Sensitive settings as files in a private temp dir, handed to BuildKit as secrets, then deleted."""
    tmp = Path(tempfile.mkdtemp(prefix="builder-secrets-"))
    os.chmod(tmp, 0o700)
    secrets: dict[str, str] = {}
    values: list[str] = []
    try:
        bundle = ca_bundle or os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
        if bundle:
            if not Path(bundle).is_file():
                raise UserError(f"CA bundle {bundle} does not exist", "pass --ca-bundle PATH or unset PIP_CERT")
            secrets["pip_cert"] = bundle
        for env_name, secret_id in (("PIP_INDEX_URL", "pip_index_url"), ("PIP_EXTRA_INDEX_URL", "pip_extra_index_url")):
            value = os.environ.get(env_name)
            if value:
                path = tmp / secret_id
                path.write_text(value)
                os.chmod(path, 0o600)
                secrets[secret_id] = str(path)
                values.append(value)
        yield secrets, values
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- one build -----------------------------------------------------------------------------------------


def base_choice(entry: Entry, args) -> dict:
    from builder.boundary import baseimage

    if args.base_image:
        return {"ref": args.base_image, "substituted": args.base_image != entry.base}
    return baseimage.describe(entry, baseimage.reference(entry, local=args.local_base))


def build_argv(entry: Entry, context: Path, facts: dict, digest: str, base: dict, secrets: dict, args,
               ref: str | None = None, epoch: int | None = None) -> list[str]:
    epoch = source_date_epoch(entry) if epoch is None else epoch
    argv = engine.client().build_argv() + ["--progress=plain", "--network=host", "-t", ref or local_ref(entry),
                                           "--build-arg", f"SOURCE_DATE_EPOCH={epoch}",
                                           "--build-arg", f"BASE_IMAGE={base['ref']}"]
    if args.apt_mirror:
        argv += ["--build-arg", f"APT_MIRROR={args.apt_mirror}"]
    if args.no_cache:
        argv.append("--no-cache")
    for secret_id, path in sorted(secrets.items()):
        argv += ["--secret", f"id={secret_id},src={path}"]
    for key, value in sorted(labels(entry, facts, digest, epoch, base).items()):
        argv += ["--label", f"{key}={value}"]
    return argv + ["-f", str(context / "Dockerfile"), str(context)]


FAILURE_PATTERNS = (
    (r"no space left on device", "the disk is full", "free space: `docker system prune` / `docker builder prune`"),
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


def explain_failure(output: str) -> tuple[str, str]:
    for pattern, message, hint in FAILURE_PATTERNS:
        m = re.search(pattern, output)
        if m:
            groups = [g for g in m.groups() if g] if m.groups() else []
            return message.format(*(groups + ["", ""])).strip(), hint
    tail = [line.strip() for line in output.splitlines() if line.strip()][-3:]
    return "docker build failed: " + " | ".join(tail)[-400:], "see the build log above"


def build_one(entry: Entry, args) -> dict:
    started = time.monotonic()
    lock.require_complete(entry, DOCKERFILES / entry.tag)
    context = stage_context(entry)
    digest = input_hash(context)
    facts = json.loads((context / "image.json").read_text())
    existing = engine.image_or_none(local_ref(entry))
    if existing and not args.force and existing.labels.get(f"{LABEL_PREFIX}.input-hash") == digest:
        previous = reports.read(entry.tag, "build", required=False) or {}
        report = {**previous, "result": "skipped", "reason": "an image with the same input hash exists",
                  "image_id": existing.id, "input_hash": digest, "duration_s": round(time.monotonic() - started, 1)}
        reports.write(entry.tag, "build", report)
        return report
    base = base_choice(entry, args)
    epoch = source_date_epoch(entry)
    with secret_files(args.ca_bundle) as (secrets, secret_values):
        argv = build_argv(entry, context, facts, digest, base, secrets, args, epoch=epoch)
        proc = engine.run_cli(argv, mask=secret_values)
    shown = " ".join(argv)
    for value in secret_values:
        shown = shown.replace(value, "****")
    if proc.returncode != 0:
        message, hint = explain_failure(proc.stdout)
        reports.write(entry.tag, "build", {"result": "failed", "error": message, "command": shown,
                                           "input_hash": digest, "duration_s": round(time.monotonic() - started, 1)})
        kind = EnvironmentProblem if "base image" in message or "disk" in message else StepFailed
        raise kind(f"{entry.tag}: {message}", hint)
    image = engine.sdk().images.get(local_ref(entry))
    found = verify.installed(local_ref(entry))
    mismatches = verify.problems(facts, found)
    report = {
        "result": "failed" if mismatches else "built",
        "image": local_ref(entry), "image_id": image.id, "size_bytes": image.attrs.get("Size"),
        "duration_s": round(time.monotonic() - started, 1), "input_hash": digest, "command": shown,
        "base": base, "versions": found.get("versions"), "torch_cuda": found.get("torch_cuda"),
        "verification": mismatches or "ok", "source_date_epoch": epoch,
        "docker": {"binary": engine.client().binary, "mode": engine.client().mode},
    }
    reports.write(entry.tag, "build", report)
    if mismatches:
        raise StepFailed(f"{entry.tag}: the image is not what the matrix says: " + "; ".join(mismatches),
                         "see build/reports/" + entry.tag + ".build.json")
    return report


def main(args) -> int:
    from builder import cli
    from builder.model import matrix

    m = cli._load(args)
    if args.all and args.tags:
        raise UserError("give tags or --all, not both")
    if not args.all and not args.tags:
        raise UserError("which image? name tags (or globs), or pass --all", f"e.g. {m.default.tag}")
    entries = matrix.select(m, None if args.all else args.tags)
    from builder.model import compat

    compat.require(entries)
    engine.sdk()  # fail early, once, when no engine answers
    engine.client()
    rows, failed, interrupted = [], 0, False
    for entry in entries:
        try:
            with log.step(f"build {entry.tag}") as note:
                report = build_one(entry, args)
                note["result"] = report["result"]
            size = report.get("size_bytes")
            rows.append([entry.tag, f"{log.mark(True)} {report['result']}", f"{report['duration_s']:.0f}s",
                         f"{size / 1e9:.2f} GB" if size else "—"])
        except KeyboardInterrupt:
            rows.append([entry.tag, f"{log.mark(False)} interrupted", "—", "—"])
            interrupted = True
            break
        except EnvironmentProblem:
            raise
        except BuilderError as exc:
            failed += 1
            log.info(f"error: {exc}")
            rows.append([entry.tag, f"{log.mark(False)} {exc.message.splitlines()[0][:70]}", "—", "—"])
    log.summary("Builds", ("tag", "result", "duration", "size"), rows)
    if interrupted:
        return 130
    return 1 if failed else 0
