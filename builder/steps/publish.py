"""Publish images that passed the gate (step 7): immutable full tag first, digest read back, alias last.

Order, per tag, and why:
  1. gate: build/reports/<tag>.smoke.json must say passed, with every check run, for the *current* local
     image ID (a rebuilt or retagged image has another ID and needs a new gate run), at the level the entry
     needs (GPU for entries of GPU runners) and on the pinned base; --allow-cpu-gate and
     --allow-substituted-base are the recorded exceptions.
  2. push the immutable full tag (format below); an existing full tag is never overwritten.
  3. read the digest back from the registry (HTTP API, not the push output) and check it equals the digest
     the push reported and the local image's RepoDigests.
  4. attach the SBOM and the provenance beside that digest (OCI referrers).
  5. only then push the short alias (`cu121-torch2.3`) and read it back too.
A failure anywhere stops before the alias moves, so users pulling the alias never get an unchecked image.

Full tag format (Docker tags are at most 128 characters of [A-Za-z0-9_.-]):
  <tag>-torch<V>-tf<V>-ds<V>-peft<V>-acc<V>-nvml<V>[-fa<V>]-<YYYYMMDD>-<rev7>[-dirty]
e.g. cu130-torch2.13-bookworm-torch2.13.0-tf5.24.0-ds0.19.8-peft0.21.2-acc1.16.0-nvml13.615.71-20261202-a94488e
Versions come from the image's own labels (verified by the build), the date is the publish date (UTC)
and rev the source revision the image was built from. When that is longer than 128 characters the
version block becomes `pins<first 12 hex of its sha256>`; every version is still in the image's labels
and in build/reports/<tag>.publish.json.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from builder import fsutil, log, reports
from builder.boundary import engine, inspect, process, registry
from builder.boundary import host as machine
from builder.errors import StepFailed, UserError
from builder.flags import arg, switch
from builder.model import attestations, paths, plan
from builder.model import audit as audit_model
from builder.steps import Done, audit

MAX_TAG = 128
SHORT = {"torch": "torch", "transformers": "tf", "deepspeed": "ds", "peft": "peft", "accelerate": "acc",
         "nvidia-ml-py": "nvml", "flash-attn": "fa"}
BACKOFF_S = 2.0  # first retry delay; doubles each time
DIGEST_LINE = re.compile(r"digest: (sha256:[a-f0-9]{64})")
# Worth another try: the registry or the network hiccupped. Anything else (auth, quota, bad name) is final.
TRANSIENT = re.compile(r"connection refused|connection reset|i/o timeout|timeout|EOF|TLS handshake|"
                       r"\b50[0234]\b|toomanyrequests|429|temporary failure|broken pipe", re.IGNORECASE)
AUTH = re.compile(r"unauthorized|authentication required|no basic auth credentials|denied", re.IGNORECASE)


@dataclass(frozen=True)
class Options:
    registry: str = arg("--registry", default="", required=True, metavar="HOST[:PORT][/NAMESPACE]",
                        help="where to push; the repository is NAMESPACE/<last part of the matrix image name>")
    dry_run: bool = switch("--dry-run", help="check the gate and show the tags; push nothing")
    username: str | None = arg("--username", default=None,
                               help="with --password-stdin: log in for this run only (temporary Docker config)")
    password_stdin: bool = switch("--password-stdin", help="read the registry password or token from stdin")
    date: str | None = arg("--date", default=None, help="YYYYMMDD in the full tag (default: today, UTC)")
    revision: str | None = arg("--revision", default=None,
                               help="source revision in the full tag (default: the image's revision label)")
    retries: int = arg("--retries", default=3, type=int, help="tries per registry operation (default 3)")
    allow_cpu_gate: bool = switch(
        "--allow-cpu-gate",
        help="publish an entry of GPU runners whose gate ran on CPU only (recorded where users look)")
    allow_substituted_base: bool = switch(
        "--allow-substituted-base", help="publish an image built on a substituted base (recorded where users look)")
    max_severity: str | None = audit.max_severity()  # the same audit as `builder audit`, before any push
    waivers: str = arg("--waivers", default="waivers.yaml", metavar="PATH", help="waivers for --max-severity's audit")
    password: str | None = field(default=None, repr=False)  # read from stdin by prepare(), never an argument


def prepare(entries, options: Options) -> Options:
    """Flags first, before any Docker or registry I/O; then the password, read once from stdin."""
    validate_options(options.registry, options.date, options.retries, options.username, options.password_stdin,
                     options.revision)
    password = None
    if options.password_stdin and not options.dry_run:
        password = sys.stdin.read().rstrip("\r\n")
        if not password:
            raise UserError("--password-stdin: nothing on stdin",
                            "pipe the password or token in: printf %s \"$TOKEN\" | …")
    engine.sdk()
    engine.client()
    return replace(options, password=password)


# --- flags, checked before any Docker or registry I/O --------------------------------------------------

MAX_RETRIES = 10


def validate_options(registry_arg: str, date: str | None = None, retries: int = 3, username: str | None = None,
                     password_stdin: bool = False, revision: str | None = None) -> None:
    """Every publish flag that can be wrong, checked without I/O; raises UserError (exit 2).

    No message echoes a credential: a --registry holding one is refused without showing it."""
    if not isinstance(registry_arg, str) or not registry_arg.strip():
        raise UserError("--registry is empty", "e.g. --registry ghcr.io/acme or 127.0.0.1:5000")
    if re.search(r"[\s\x00-\x1f\x7f]", registry_arg):
        raise UserError("--registry contains whitespace or control characters", "e.g. --registry ghcr.io/acme")
    if "@" in registry_arg:
        raise UserError("--registry contains credentials (something@host); the value is not shown here",
                        "pass --registry HOST[/NAMESPACE] and log in with --username U --password-stdin")
    if "://" in registry_arg:
        raise UserError(f"--registry {registry_arg[:100]!r} is a URL; give HOST[:PORT][/NAMESPACE]",
                        "e.g. --registry ghcr.io/acme (drop the scheme)")
    repo = registry.repository(registry_arg, "x")  # raises UserError on bad syntax
    port = repo.host.rsplit(":", 1)[1] if ":" in repo.host and not repo.host.endswith("]") else None
    if port is not None and not 0 < int(port) < 65536:
        raise UserError(f"--registry port {port} is out of range", "ports are 1 to 65535")
    if date is not None:
        try:
            valid = bool(re.fullmatch(r"20[0-9]{6}", date)) and datetime.strptime(date, "%Y%m%d") is not None
        except ValueError:
            valid = False
        if not valid:
            raise UserError(f"--date {date[:40]!r} is not a date as YYYYMMDD", "e.g. --date 20261202")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 1 <= retries <= MAX_RETRIES:
        raise UserError(f"--retries {retries!r}: must be 1 to {MAX_RETRIES}", "e.g. --retries 3")
    if username is not None and not password_stdin:
        raise UserError("--username needs --password-stdin", "or log in once with `docker login`")
    if password_stdin and not username:
        raise UserError("--password-stdin needs --username")
    if username is not None and not re.fullmatch(r"[^\s\x00-\x1f\x7f:]{1,256}", username):
        raise UserError("--username is not a user name (empty, whitespace, ':' or control characters)")
    if revision is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", revision):
        raise UserError(f"--revision {revision[:40]!r} is not a revision", "e.g. --revision a94488e")


# --- what may be published, and under which names -----------------------------------------------------


def gate(entry, options: Options) -> tuple[object, dict, list[str]]:
    """The local image, its smoke report and the exceptions taken, or a refusal saying what to run."""
    ref = paths.image_ref(entry)
    image = engine.image_or_none(ref)
    if image is None:
        raise UserError(f"{entry.tag}: there is no local image {ref}", f"build it: python -m builder build {entry.tag}")
    smoke = reports.read(entry.tag, "smoke", required=False)
    rerun = f"python -m builder smoke {entry.tag}"
    if smoke is None:
        raise StepFailed(f"{entry.tag}: refusing to publish: no smoke report ({paths.report(entry.tag, 'smoke')})",
                         f"run the gate first: {rerun}")
    if smoke.get("passed") is not True:
        raise StepFailed(f"{entry.tag}: refusing to publish: the smoke gate did not pass "
                         f"(report of {smoke.get('finished_at', '?')})", f"fix the image, rebuild, then {rerun}")
    if smoke.get("image_id") != image.id:
        raise StepFailed(f"{entry.tag}: refusing to publish: the passing smoke report is for image "
                         f"{str(smoke.get('image_id'))[:19]}, but {ref} is now {image.id[:19]} (rebuilt or retagged)",
                         f"gate this exact image: {rerun}")
    if smoke.get("not_run"):
        raise StepFailed(f"{entry.tag}: refusing to publish: the gate left out {', '.join(smoke['not_run'])}",
                         f"run the whole gate: {rerun}")
    exceptions = []
    level = smoke.get("level") or {"kind": smoke.get("mode")}
    if plan.needs_gpu_gate(entry) and level.get("kind") != "gpu":
        if not options.allow_cpu_gate:
            raise StepFailed(f"{entry.tag}: refusing to publish: {entry.tag} runs on GPU runners, but its gate ran on "
                             "CPU only (GPU checks, NCCL and the GPU training step were not run)",
                             f"gate it on a GPU host: {rerun} --gpus all; or, knowingly, --allow-cpu-gate "
                             "(recorded in the publish report and the catalog)")
        exceptions.append("cpu-gate")
    substituted = (image.labels or {}).get("io.train-images.base.substituted")
    if substituted not in ("true", "false"):
        raise StepFailed(f"{entry.tag}: refusing to publish: {ref} carries no io.train-images.base.substituted label, "
                         "so this builder did not build it", f"build it: python -m builder build {entry.tag}")
    if substituted == "true":
        if not options.allow_substituted_base:
            raise StepFailed(f"{entry.tag}: refusing to publish: {ref} was built on a substituted base "
                             f"({(image.labels or {}).get('io.train-images.base.used')}), not the pinned "
                             f"{entry.base}", "build on the pinned base, or, knowingly, --allow-substituted-base "
                             "(recorded in the publish report and the catalog)")
        exceptions.append("substituted-base")
    return image, smoke, exceptions


def versions(entry, labels: dict) -> dict:
    """Pinned versions as the image's labels state them (the build verified them), else the matrix pins."""
    out = {}
    for name in SHORT:
        label = labels.get(f"io.train-images.pin.{name}")
        value = label if label is not None else entry.pins.get(name)
        if value and value != "none":
            out[name] = value
    return out


def full_tag(tag: str, pins: dict, date: str, revision: str) -> str:
    block = "-".join(f"{SHORT[name]}{pins[name]}" for name in SHORT if name in pins)
    tail = f"-{date}-{revision}"
    full = f"{tag}-{block}{tail}"
    if len(full) <= MAX_TAG:
        return full
    tail = f"-pins{hashlib.sha256(block.encode()).hexdigest()[:12]}{tail}"
    return tag[: MAX_TAG - len(tail)] + tail


def revision_of(labels: dict, override: str | None) -> str:
    raw = override or labels.get("org.opencontainers.image.revision") or "unknown"
    rev, dirty = raw.removesuffix("-dirty"), raw.endswith("-dirty")
    cleaned = re.sub(r"[^A-Za-z0-9_.]", "", rev)[:7] or "unknown"
    return cleaned + ("-dirty" if dirty else "")


# --- docker CLI with retries ---------------------------------------------------------------------------


def retrying(what: str, attempt, tries: int):
    """Call attempt() up to `tries` times while it raises registry.Transient, backing off between tries."""
    delay = BACKOFF_S
    for n in range(1, max(tries, 1) + 1):
        try:
            return attempt()
        except registry.Transient as exc:
            if n >= tries:
                raise StepFailed(f"{what}: {exc.message} (gave up after {tries} tries)",
                                 "the registry is down or unreachable; nothing after this step was changed") from None
            log.info(f"  {what}: {exc.message}; retry {n + 1}/{tries} in {delay:.0f}s")
            time.sleep(delay)
            delay *= 2


def docker(config: Path | None, *argv: str) -> list[str]:
    return [engine.client().binary, *(["--config", str(config)] if config else []), *argv]


def tag_image(config: Path | None, image_id: str, ref: str) -> None:
    proc = engine.run_cli(docker(config, "tag", image_id, ref), stream=False)
    if proc.returncode != 0:
        raise StepFailed(f"docker tag {ref} failed: {(proc.stderr or proc.stdout).strip()[:200]}")


def push(config: Path | None, ref: str, host: str) -> str:
    """docker push; returns the digest it reports. Raises Transient for errors worth retrying."""
    proc = engine.run_cli(docker(config, "push", ref))
    out = proc.stdout
    if proc.returncode == 0:
        found = DIGEST_LINE.findall(out)
        if found:
            return found[-1]
        raise StepFailed(f"docker push {ref} reported no digest", "see the push output above")
    last = [line for line in out.splitlines() if line.strip()][-1:] or [f"exit {proc.returncode}"]
    if AUTH.search(out):
        raise StepFailed(f"{host} refused the push of {ref}: {last[0][:200]}",
                         f"log in first (`docker login {host}`), or pass --username U --password-stdin")
    if TRANSIENT.search(out):
        raise registry.Transient(f"push of {ref} failed: {last[0][:200]}")
    raise StepFailed(f"push of {ref} failed: {last[0][:200]}", "see the push output above")


@contextlib.contextmanager
def docker_config(options: Options, host: str):
    """A temporary Docker config holding a login made from the password, or None (use the user's own)."""
    if not options.password:
        yield None
        return
    tmp = Path(tempfile.mkdtemp(prefix="builder-docker-config-"))
    tmp.chmod(0o700)
    try:
        argv = docker(tmp, "login", "--username", options.username, "--password-stdin", host)
        try:
            proc = engine.run_cli(argv, mask=(options.password,), input=options.password, stream=False, timeout=120)
        except process.TimedOut:
            raise StepFailed(f"docker login {host} timed out") from None
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
            raise StepFailed(f"login to {host} as {options.username} failed: {reason}",
                             "check the user name and token")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- one tag -------------------------------------------------------------------------------------------


def _after_full_push(repo: registry.Repository, digest: str) -> None:
    """Nothing; a seam for tests that break the registry between the full tag and the alias."""


def _read_back(repo, ref: str, config, tries: int) -> str | None:
    return retrying(f"read back {repo.ref}:{ref}", lambda: registry.manifest_digest(repo, ref, config), tries)


def _local_digests(image, repo) -> set[str]:
    image.reload()
    return {d.split("@", 1)[1] for d in image.attrs.get("RepoDigests", []) if d.split("@", 1)[0] == repo.ref}


def binding_problem(entry, facts: dict, labels: dict, build: dict) -> str | None:
    """The first way the image's own facts (/opt/train-image/image.json) and labels contradict the entry it
    would be published as, one line naming the field; None when they agree. A label the image lacks is not
    compared (its facts are); the input hash is compared when the build report is of this image."""
    if facts.get("tag") != entry.tag:
        return f"tag: the image's facts say {str(facts.get('tag'))[:80]!r}, the entry is {entry.tag!r}"
    pins = facts.get("pins") if isinstance(facts.get("pins"), dict) else {}
    for name in sorted(set(entry.pins) | set(pins)):
        want, said = attestations.pin(entry.pins.get(name)), attestations.pin(pins.get(name))
        if said != want:
            return f"pin {name}: the image's facts say {said}, the entry pins {want}"
    wrong = attestations.label_problem(entry.tag, entry.pins, labels)
    if wrong:
        return wrong
    prefix = attestations.LABEL_PREFIX
    built, label = build.get("input_hash"), labels.get(f"{prefix}.input-hash")
    if built and label != built:
        return (f"input hash: the image's label {prefix}.input-hash is {str(label)[:19]}, its build report's "
                f"{str(built)[:19]}")
    return None


def build_report(entry, image) -> dict:
    """The build report when it is of this image; else {}: claim nothing from another image's report."""
    build = reports.read(entry.tag, "build", required=False) or {}
    return build if build.get("image_id") == image.id else {}


def publish_one(entry, args: Options, config: Path | None) -> dict:
    image, smoke, exceptions = gate(entry, args)
    facts, build = inspect.read_facts(image), build_report(entry, image)  # what the image says it is
    wrong = binding_problem(entry, facts, image.labels or {}, build)
    if wrong:
        raise StepFailed(f"{entry.tag}: refusing to publish: the image is not the entry's: {wrong}",
                         f"rebuild it from this checkout: python -m builder build {entry.tag}")
    locks = image_locks(entry, image)  # before anything is pushed: the provenance must be true of this checkout
    audited = audit_gate(entry, image, args)
    labels = image.labels or {}
    repo = registry.repository(args.registry, entry.image)
    date = args.date or datetime.now(timezone.utc).strftime("%Y%m%d")
    full = full_tag(entry.tag, versions(entry, labels), date, revision_of(labels, args.revision))
    planned = {"registry": args.registry, "repository": repo.ref, "full_tag": full, "alias": entry.tag,
            "image_id": image.id, "smoke_finished_at": smoke.get("finished_at"), "smoke_mode": smoke.get("mode"),
            "gate": smoke.get("level") or {"kind": smoke.get("mode")}, "exceptions": exceptions,
            **({"audit": audited["summary"]} if audited else {})}
    if args.dry_run:
        log.info(f"  would push {repo.ref}:{full}, then move {repo.ref}:{entry.tag}")
        return {**planned, "result": "dry-run"}
    started = time.monotonic()
    existing = _read_back(repo, full, config, args.retries)
    if existing and existing not in _local_digests(image, repo):
        raise StepFailed(f"{repo.ref}:{full} already exists with another image ({existing[:19]}); full tags are "
                         "immutable", "rebuild from a new commit, or publish with another --date")
    tag_image(config, image.id, f"{repo.ref}:{full}")
    pushed = retrying(f"push {repo.ref}:{full}", lambda: push(config, f"{repo.ref}:{full}", repo.host), args.retries)
    served = _read_back(repo, full, config, args.retries)
    local = _local_digests(image, repo)
    if served != pushed or pushed not in local:
        raise StepFailed(f"{repo.ref}:{full}: the registry serves {served}, the push reported {pushed}, the local "
                         f"image records {sorted(local) or 'none'}",
                         "the alias was not moved; investigate the registry")
    compression = served_compression(repo, served, config, args.retries)
    evidence = {"smoke": smoke, "locks": locks, "audit": audited, "facts": facts, "build": build}
    attached = attest(entry, repo, pushed, image, evidence, config, args.retries)
    _after_full_push(repo, served)
    tag_image(config, image.id, f"{repo.ref}:{entry.tag}")
    alias_pushed = retrying(f"push {repo.ref}:{entry.tag}", lambda: push(config, f"{repo.ref}:{entry.tag}", repo.host),
                            args.retries)
    alias_served = _read_back(repo, entry.tag, config, args.retries)
    if not alias_pushed == alias_served == served:
        raise StepFailed(f"{repo.ref}:{entry.tag} points at {alias_served}, expected {served}",
                         "publish again; the full tag is correct")
    report = {**planned, "result": "published", "digest": served, "attestations": attached,
              "size_bytes": image.attrs.get("Size"), "layer_compression": compression,
              "pull": f"{repo.ref}@{served}", "push_seconds": round(time.monotonic() - started, 1),
              "published_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    reports.write(entry.tag, "publish", report)
    return report


def served_compression(repo, digest: str, config, tries: int) -> str:
    """The layers' compression of repo@digest as served; of an index (an engine that attached its own attestations),
    that of its linux/amd64 image."""
    found = retrying(f"read back {repo.ref}@{digest[:19]}", lambda: registry.manifest(repo, digest, config), tries)
    if found and isinstance(found[0].get("manifests"), list):
        child = next((m for m in found[0]["manifests"] if isinstance(m, dict) and isinstance(m.get("digest"), str)
                      and (m.get("platform") or {}).get("architecture") == "amd64"), None)
        found = None if child is None else retrying(f"read back {repo.ref}@{child['digest'][:19]}",
                                                    lambda: registry.manifest(repo, child["digest"], config), tries)
    return layer_compression(found)


def layer_compression(found: tuple[dict, str, str] | None) -> str:
    """The compression of the layers as the registry serves them (registry.manifest's answer), which decides who
    can pull: zstd needs Docker >= 23 or containerd >= 1.5, gzip any client. "mixed" or "unknown" (an index, or
    a media type we do not know) are said as they are."""
    layers = (found[0].get("layers") if found else None) or []
    kinds = {str(layer.get("mediaType", "")).rsplit(".", 1)[-1].rsplit("+", 1)[-1] if isinstance(layer, dict) else ""
             for layer in layers}
    kinds = {"gzip" if k in ("gzip", "tar.gzip") else k for k in kinds}
    if not layers or not kinds <= {"gzip", "zstd"}:
        return "unknown"
    return kinds.pop() if len(kinds) == 1 else "mixed"


# What publish stores beside each digest, by artifact type, under the names build/attest/<tag>/ keeps them.
ATTACHED = {attestations.SBOM_TYPE: "sbom.spdx.json", attestations.CYCLONEDX_TYPE: "sbom.cdx.json",
            attestations.PROVENANCE_TYPE: "provenance.intoto.json"}


def attest(entry, repo, digest: str, image, evidence: dict, config, tries: int) -> dict:
    """SBOM and provenance for the pushed digest, stored beside it as OCI referrers (before the alias moves,
    so the alias never names an image without them); copies in build/attest/<tag>/ for signing in CI.
    evidence: the smoke report, locks, audit, the image's facts and its build report, all read before the push."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    inventory = inspect.inventory(image.id)
    smoke, audited = evidence["smoke"], evidence["audit"]
    os_release = attestations.parse_os_release(inspect.read_os_release(image))
    labels = image.labels or {}
    source = {"uri": labels.get("org.opencontainers.image.source", ""),
              "revision": labels.get("org.opencontainers.image.revision", "unknown")}
    docs = {
        attestations.SBOM_TYPE: attestations.sbom(entry.tag, repo.ref, digest, inventory, now, os_release),
        attestations.CYCLONEDX_TYPE: attestations.cyclonedx(entry.tag, repo.ref, digest, inventory, now, os_release),
        attestations.PROVENANCE_TYPE: attestations.provenance(
            repository=repo.ref, digest=digest, entry=evidence["facts"], locks=evidence["locks"], source=source,
            build=evidence["build"], gate=smoke, builder_id=builder_identity(), started=smoke.get("finished_at"),
            finished=now, audit=audited),
    }
    # The subject is the manifest whose bytes hash to the pushed digest: never the registry's HEAD answer.
    subject = retrying(f"read back {repo.ref}@{digest}", lambda: registry.checked_descriptor(repo, digest, config),
                       tries)
    if subject is None:
        raise StepFailed(f"{repo.ref}@{digest}: the registry does not serve the manifest just pushed",
                         "the alias was not moved; investigate the registry")
    out_dir = paths.ATTEST_DIR / entry.tag
    stored = {}
    for kind, doc in docs.items():
        payload = json.dumps(doc, sort_keys=True, indent=1).encode()
        name = ATTACHED[kind]
        fsutil.write_atomic(out_dir / name, payload.decode())
        stored[name] = retrying(f"attach {name} to {repo.ref}@{digest[:19]}", lambda p=payload, k=kind:
                                registry.push_referrer(repo, subject, k, p, {"org.opencontainers.image.created": now},
                                                       config), tries)
    buildkit = buildkit_statement(evidence["build"], digest)
    if buildkit is not None:
        payload = json.dumps(buildkit, sort_keys=True, indent=1).encode()
        fsutil.write_atomic(out_dir / "buildkit-provenance.intoto.json", payload.decode())
        stored["buildkit-provenance.intoto.json"] = retrying(
            f"attach BuildKit's provenance to {repo.ref}@{digest[:19]}",
            lambda: registry.push_referrer(repo, subject, attestations.PROVENANCE_TYPE, payload,
                                           {"org.opencontainers.image.created": now,
                                            "in-toto.io/predicate-type": attestations.BUILDKIT_PROVENANCE}, config),
            tries)
    log.info(f"  attached {', '.join(stored)} to {repo.ref}@{digest}")
    return stored


def buildkit_statement(build: dict | None, digest: str) -> dict | None:
    """BuildKit's provenance the build kept (build report's `buildkit_provenance`), when it is for the pushed
    digest; None where the engine wrote none (Docker 20.10) or it is for another image."""
    path = (build or {}).get("buildkit_provenance")
    if not path:
        return None
    try:
        statement = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return statement if attestations.buildkit_binding(statement, digest) is None else None


def audit_gate(entry, image, options: Options) -> dict | None:
    """With --max-severity: the image's vulnerability audit (kept as build/reports/<tag>.audit.json), or a
    refusal naming what is above the level or which waiver expired. Without it: None (nothing is claimed)."""
    if options.max_severity is None:
        return None
    verdict = audit.audit_image(image, options.waivers, options.max_severity)
    reports.write(entry.tag, "audit", verdict)
    wrong = audit_model.problems(verdict, options.waivers)
    if wrong:
        raise StepFailed(f"{entry.tag}: refusing to publish: " + "; ".join(wrong[:5]),
                         f"upgrade the package, or waive it in {options.waivers} with a reason and an expiry date")
    log.info(f"  {verdict['summary']}")
    return verdict


def image_locks(entry, image) -> dict[str, str]:
    """{name: sha256} of the locks inside the image (what the provenance attests), each checked against the
    checkout's locks/<tag>/: an image built from other locks than the checkout's is not published under it."""
    inside = {name: hashlib.sha256(data).hexdigest() for name, data in inspect.read_locks(image).items()}
    folder = paths.lock_dir(entry)
    checkout = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.lock"))}
    wrong = attestations.lock_mismatches(inside, checkout, f"{folder}/")
    if wrong:
        raise StepFailed(f"{entry.tag}: refusing to attest: the image was not built from this checkout's locks: "
                         + "; ".join(wrong), f"check out the revision the image was built from, or rebuild: "
                         f"python -m builder build {entry.tag}")
    return inside


def builder_identity() -> str:
    """Who ran the build: the GitHub Actions run when there is one, else this machine (not CI)."""
    env = os.environ
    if env.get("GITHUB_RUN_ID"):
        return f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env.get('GITHUB_REPOSITORY')}/actions/runs/" \
               f"{env['GITHUB_RUN_ID']}"
    return f"local:{machine.name()} (not CI)"


def run(entry, options: Options) -> Done:
    host = registry.repository(options.registry, entry.image).host
    with docker_config(options, host) if not options.dry_run else contextlib.nullcontext() as config:
        report = publish_one(entry, options, config)
    if report["result"] == "dry-run":
        return Done("dry-run", f"would push {report['repository']}:{report['full_tag']}")
    return Done("published", f"{report['repository']}@{report['digest']}")
