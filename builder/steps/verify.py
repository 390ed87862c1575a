"""Re-verify a pulled image on this host (`python -m builder verify IMAGE`): host checks, then the gate.

For a user on any cloud: is this host able to run this image, and does the image still pass its own
smoke gate here? The image says what it needs in /opt/train-image/image.json (min driver, versions);
the host is checked against that, then the same gate that allowed publication runs in the image.
Without a usable GPU the gate runs in CPU mode and the verdict says plainly that GPU checks were not run.

Signatures (docs/publishing.md): with `--key PATH` or `--certificate-identity ID` cosign checks the image digest
and every SBOM/provenance stored beside it, and the verdict names who signed. `--require-signature` refuses an
unsigned image, an attestation that was replaced or added unsigned, and one signed by anyone else, before the
gate runs; `--signatures-only` checks that much without pulling the image or running anything, and, like a full
verify, refuses an SBOM or provenance whose content names another image (a signature binds bytes to a signer,
not to this digest).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, replace

from packaging.version import InvalidVersion, Version

from builder import fsutil, log
from builder.boundary import cosign, engine, host, inspect, registry
from builder.boundary.gate import run_gate
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.flags import arg, switch
from builder.model import attestations, reference

MIN_SHM_MB = 1024  # below this, NCCL and DataLoader workers fail when containers share the host's /dev/shm


@dataclass(frozen=True)
class Options:
    image: str = arg(metavar="IMAGE", help="image reference, e.g. ghcr.io/acme/train@sha256:…")
    cpu: bool = switch("--cpu", help="run the gate in CPU mode even when GPUs are present")
    no_pull: bool = switch("--no-pull", help="use the local image only")
    timeout: int = arg("--timeout", default=600, type=int, help="seconds per gate check (default 600)")
    shm_size: str = arg("--shm-size", default="8g", help="/dev/shm size for the gate container (default 8g)")
    json: str | None = arg("--json", default=None, metavar="PATH", help="also write the verdict as JSON")
    checks: str | None = arg("--checks", default=None, metavar="LIST",
                             help="run only these gate checks (e.g. env,ops,nccl: minutes faster on CPU, where train "
                                  "JIT-builds DeepSpeed's CPU ops); the verdict names what did not run")
    require_signature: bool = switch(
        "--require-signature",
        help="fail unless the digest and every attestation are signed by the identity given below")
    signatures_only: bool = switch("--signatures-only", help="check the signatures, and that the attestations name "
                                                             "this digest, only: no pull, no host checks, no gate")
    key: str | None = arg("--key", default=None, metavar="PATH", help="cosign public key the image must be signed with")
    certificate_identity: str | None = arg(
        "--certificate-identity", default=None, metavar="ID",
        help="keyless signer, exactly: https://github.com/OWNER/REPO/.github/workflows/images.yml@refs/heads/main")
    certificate_oidc_issuer: str = arg("--certificate-oidc-issuer", default=cosign.GITHUB_ISSUER, metavar="URL",
                                       help=f"keyless issuer (default {cosign.GITHUB_ISSUER})")


# --- the image -----------------------------------------------------------------------------------------


def ensure_image(ref: str, pull: bool):
    image = engine.image_or_none(ref)
    if image is None and pull:
        proc = engine.run_cli([engine.client().binary, "pull", ref])
        if proc.returncode != 0:
            raise EnvironmentProblem(f"cannot pull {ref}", "check the name, your network and `docker login`")
        image = engine.image_or_none(ref)
    if image is None:
        raise UserError(f"image {ref} is not here", "drop --no-pull, or `docker pull` it first")
    return image


# --- the host ------------------------------------------------------------------------------------------


def driver_ok(found: str, minimum: str) -> bool:
    try:
        return Version(found) >= Version(minimum)
    except InvalidVersion:
        return False


def shm_mb(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
        return st.f_blocks * st.f_frsize // (1024 * 1024)
    except OSError:
        return None


def fabric_rows(fabric: dict, facts: dict) -> list[tuple]:
    """The host's readiness between nodes, read from /sys and /dev (boundary/host.fabric): what NCCL will find,
    and what makes it fall back to TCP silently. Informational (None) where it cannot be wrong for one node."""
    devices = fabric.get("rdma") or []
    if not devices:
        ipoib = ", ".join(fabric.get("ipoib") or [])
        return [("RDMA fabric", False if ipoib else None, f"no RDMA device; IPoIB {ipoib}" if ipoib else
                 "none: NCCL uses sockets (TCP) between nodes", "the InfiniBand driver stack (ib_uverbs, the NIC's "
                 "RDMA driver) is not loaded: NCCL would use TCP over IPoIB" if ipoib else "")]
    layers = {d["name"]: sorted({p.get("link_layer") or "?" for p in d["ports"].values()}) for d in devices}
    shown = ", ".join(f"{d['name']} ({'/'.join(layers[d['name']])}, {d['driver'] or '?'})" for d in devices[:6])
    uverbs = fabric.get("uverbs") or []
    rows = [("RDMA fabric", bool(uverbs), f"{shown}; {len(uverbs)} uverbs device(s)",
             "" if uverbs else "load ib_uverbs (`modprobe ib_uverbs`): without /dev/infiniband/uverbs* no process "
             "can open the devices")]
    roce = [d for d in devices if "Ethernet" in layers[d["name"]]]
    if roce:
        v2 = [d["name"] for d in roce if any(p.get("roce_v2_gid") for p in d["ports"].values())]
        rows.append(("RoCE v2 GID", bool(v2), ", ".join(v2) or f"none on {', '.join(d['name'] for d in roce)}",
                     "" if v2 else "give the RoCE NIC's interface an IP address (the RoCE v2 GID follows it); "
                     "NCCL_IB_GID_INDEX must name a RoCE v2 GID the peer also has"))
    if fabric.get("efa") and not facts.get("efa_plugin"):
        rows.append(("EFA plugin", None, "this host has EFA; this image carries no aws-ofi-nccl",
                     "NCCL will use sockets (TCP) between nodes here: one node is unaffected"))
    memlock = fabric.get("memlock_kib")
    rows.append(("locked memory (ulimit -l)", None, "unlimited" if memlock is None else f"{memlock} KiB here",
                 "" if memlock is None else "RDMA registers memory: run containers with --ulimit memlock=-1"))
    return rows


def host_checks(facts: dict, info: dict, gpus: list[dict], source: str, force_cpu: bool,
                fabric: dict | None = None) -> tuple[list, bool]:
    """Rows (check, ok True/False/None, detail, what to do) and whether the gate can use GPUs."""
    rows = [("Docker engine", True, f"{info.get('ServerVersion', '?')} ({info.get('OperatingSystem', '?')})", "")]
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    nvidia = "nvidia" in runtimes or bool(shutil.which("nvidia-container-runtime-hook"))
    rows.append(("NVIDIA container runtime", nvidia if gpus else None, ", ".join(runtimes) or "none",
                 "" if nvidia or not gpus else "install the NVIDIA Container Toolkit and run "
                 "`nvidia-ctk runtime configure --runtime=docker`, then restart Docker"))
    minimum = facts.get("min_driver", "0")
    driver_good = False
    if gpus:
        driver = gpus[0]["driver"]
        ok = driver_good = driver_ok(driver, minimum)
        rows.append(("NVIDIA driver", ok, f"{driver} (image needs ≥ {minimum}, via {source})",
                     "" if ok else f"upgrade the driver to {minimum} or newer, or use an image for an older CUDA"))
        names = sorted({g["name"] for g in gpus})
        rows.append(("GPUs", True, f"{len(gpus)} × {', '.join(names)}", ""))
    else:
        rows.append(("NVIDIA driver", None, f"none found ({source}); the image needs ≥ {minimum} for GPU use", ""))
        rows.append(("GPUs", None, "0", ""))
    shm = shm_mb()
    shm_ok = shm is not None and shm >= MIN_SHM_MB
    rows.append(("host /dev/shm", shm_ok if shm is not None else None, f"{shm} MB" if shm is not None else "missing",
                 "" if shm_ok else f"with --ipc=host give /dev/shm ≥ {MIN_SHM_MB} MB; otherwise pass --shm-size=8g"))
    rows += fabric_rows(host.fabric() if fabric is None else fabric, facts)
    use_gpus = bool(gpus) and nvidia and driver_good and not force_cpu
    return rows, use_gpus


# --- verdict -------------------------------------------------------------------------------------------


def registry_reference(ref: str, image) -> tuple[registry.Repository, str] | None:
    """(repository, digest) of a reference that names a registry host (host.tld/…, host:port/…, localhost/…),
    with the digest taken from the reference or the pulled image's RepoDigests; None for anything else."""
    name = ref.split("@", 1)[0]
    host, _, rest = name.partition("/")
    if not rest or not ("." in host or ":" in host or host == "localhost"):
        return None
    path = rest.rsplit(":", 1)[0] if ":" in rest.rsplit("/", 1)[-1] else rest
    pulled = [d.split("@", 1) for d in image.attrs.get("RepoDigests", [])] if image is not None else []
    digest = ref.split("@", 1)[1] if "@" in ref else next((d for n, d in pulled if n == f"{host}/{path}"), None)
    if digest is None and image is None:  # nothing pulled: ask the registry what the tag names now
        digest = registry.manifest_digest(registry.Repository(host, path), ref.split("@", 1)[0].rsplit(":", 1)[-1])
    return (registry.Repository(host, path), digest) if digest else None


def _identities(repo, digest: str, image) -> set[str]:
    """Every ID this image goes by, for what a provenance says ran on it: the registry digest, the local image ID
    (a config digest in the classic store, a manifest or index digest in the containerd one) and the config
    digest of the manifest (of each platform's, for an index) the registry serves."""
    found = {digest} | ({image.id} if image is not None and isinstance(getattr(image, "id", None), str) else set())
    served = registry.manifest(repo, digest)
    docs = [served[0]] if served else []
    for child in (served[0].get("manifests") if served and isinstance(served[0].get("manifests"), list) else [])[:8]:
        if isinstance(child, dict) and isinstance(child.get("digest"), str):
            found.add(child["digest"])
            sub = registry.manifest(repo, child["digest"])
            docs += [sub[0]] if sub else []
    for doc in docs:
        config = doc.get("config")
        if isinstance(config, dict) and isinstance(config.get("digest"), str):
            found.add(config["digest"])
    return found


def attestations_of(ref: str, image, strict: bool = False, facts: dict | None = None) -> dict:
    """The SBOM and provenance stored beside the image's digest (OCI referrers), read and summarised. One counts
    only when its content names this digest too (attestations.BINDING): another image's SBOM or provenance is
    ignored with a warning line, and with `strict` (--require-signature) it is the verdict's problem."""
    where = registry_reference(ref, image)
    if where is None:
        return {"sbom": None, "provenance": None, "problem": None,
                "lines": ["attestations: not looked up (give a registry reference, e.g. host/name@sha256:…)"]}
    repo, digest = where
    found, ignored = {}, []
    for descriptor in registry.referrers(repo, digest):
        kind = descriptor.get("artifactType")
        if kind in attestations.BINDING:
            slot, doc, why = _bound_document(repo, descriptor, digest, kind)
            if doc is not None:
                found.setdefault(slot, doc)
            elif why:
                ignored.append(f"warning: ignored the referrer {descriptor['digest'][:19]}…: {why}")
    sbom, statement = found.get(attestations.SBOM_TYPE), found.get(attestations.PROVENANCE_TYPE)
    buildkit = found.get(attestations.BUILDKIT)
    identities = _identities(repo, digest, image) if statement is not None else None
    lines = attestations.summary(sbom, statement, digest, identities, facts)
    lines += [attestations.buildkit_summary(buildkit, digest)]
    cdx = found.get(attestations.CYCLONEDX_TYPE)
    lines += [f"CycloneDX SBOM: {len(cdx.get('components') or [])} components, bound to this digest" if cdx else
              "CycloneDX SBOM: none stored beside this digest"]
    # `found` holds only documents bound to this digest (_bound_document), so the statement's binding is given.
    contradicted = attestations.claim_problems(statement, identities, facts) if statement is not None else []
    if contradicted:
        ignored.append(f"warning: the provenance bound to {digest[:19]}… claims what this image contradicts: "
                       f"{contradicted[0]}")
    lines += ignored
    problem = ignored[0].removeprefix("warning: ") if ignored and strict else None
    return {"sbom": sbom is not None, "provenance": statement is not None, "buildkit_provenance": buildkit is not None,
            "cyclonedx": cdx is not None, "problem": problem, "lines": lines}


def _bound_document(repo, descriptor: dict, digest: str, kind: str) -> tuple[str, dict | None, str | None]:
    """(slot, the referrer's document, None) when its content names `digest`; (slot, None, why) when it does not;
    (kind, None, None) when the referrer itself is not for `digest` (registry.referrer_payload). The slot tells
    BuildKit's provenance from ours (attestations.slot): both are in-toto statements."""
    payload = registry.referrer_payload(repo, descriptor, digest)
    if payload is None:
        return kind, None, None
    try:
        doc = json.loads(payload)
    except ValueError:
        return kind, None, f"its {kind} content is not JSON"
    slot = attestations.slot(kind, doc)
    why = (attestations.buildkit_binding if slot == attestations.BUILDKIT else attestations.BINDING[kind])(doc, digest)
    return (slot, None, why) if why else (slot, doc, None)


# --- signatures ----------------------------------------------------------------------------------------


def signer(args: Options) -> cosign.Identity | None:
    """Who must have signed, from the flags; None when no signature is asked about."""
    if args.key and args.certificate_identity:
        raise UserError("give --key or --certificate-identity, not both")
    if args.key:
        if not os.path.isfile(args.key):
            raise UserError(f"--key {args.key}: no such file", "give the cosign public key (cosign.pub) to check with")
        return cosign.Identity(key=args.key)
    if args.certificate_identity:
        return cosign.Identity(certificate_identity=args.certificate_identity, issuer=args.certificate_oidc_issuer)
    if args.require_signature or args.signatures_only:
        raise UserError("which signer? --require-signature/--signatures-only need --key PATH or --certificate-identity",
                        "e.g. --certificate-identity https://github.com/OWNER/REPO/.github/workflows/images.yml"
                        "@refs/heads/main (docs/publishing.md)")
    return None


def signatures(ref: str, identity: cosign.Identity) -> dict:
    """cosign's verdict on the digest and on every SBOM/provenance beside it: ok, one line per subject, and the
    digest reference checked (a tag is resolved once, here, and that digest is what verify then pulls)."""
    where = registry_reference(ref, None)
    if where is None:
        return {"ok": False, "lines": [f"signatures: {ref} names no registry digest to check (host/name@sha256:…)"]}
    repo, digest = where
    subjects = [("image", f"{repo.ref}@{digest}")] + [("attestation", r) for r in cosign.attestation_refs(repo, digest)]
    ok, lines = True, []
    for what, subject in subjects:
        good, who = cosign.verify(subject, identity)
        ok = ok and good
        lines.append(f"signature of {what} {subject.rsplit('@', 1)[1][:19]}…: "
                     + (f"signed by {who}" if good else f"NOT signed by {identity.describe()}: {who}"))
    if len(subjects) == 1:
        lines.append("signatures: no attestations stored beside the digest")
    return {"ok": ok, "lines": lines, "ref": subjects[0][1]}


def check_signatures(args: Options, identity: cosign.Identity | None) -> dict:
    """Signatures checked and printed; with --require-signature a bad one stops verify here (before the gate)."""
    if identity is None:
        return {"ok": None, "lines": ["signatures: not checked: the attestation lines are the registry's unsigned "
                                      "claims (pass --key or --certificate-identity)"]}
    with log.step(f"signatures of {args.image} ({identity.describe()})") as note:
        signed = signatures(args.image, identity)
        note["result"] = "valid" if signed["ok"] else "NOT valid"
        if args.require_signature and not signed["ok"]:
            for line in signed["lines"]:
                log.out(f"  {line}")
            raise StepFailed(f"{args.image} is not signed by {identity.describe()}",
                             "do not use this image; check the identity you expect (docs/publishing.md)")
    return signed


def refuse_unbound(image: str, attested: dict) -> None:
    """Stop verify when an attestation stored beside the digest is about another image (strict mode)."""
    if attested["problem"]:
        raise StepFailed(f"{image}: {attested['problem']}",
                         "do not use this image: its attestations are not bound to it (docs/publishing.md)")


def verdict(image_ref: str, rows: list, gate: dict, use_gpus: bool, why_cpu: str) -> tuple[bool, list[str]]:
    failed = [r for r in rows if r[1] is False]
    checks = gate.get("checks") or []
    bad_checks = [c for c in checks if not c.get("passed")]
    ok = not failed and gate.get("passed") is True
    lines = [f"{'✓ PASS' if ok else '✕ FAIL'}: {image_ref} on this host"]
    if not use_gpus:
        lines.append(f"  note: the gate ran in CPU mode; GPU checks (CUDA, NCCL over GPUs) were NOT run — {why_cpu}")
    for name, _, detail, fix in failed:
        lines.append(f"  host: {name}: {detail}" + (f" → {fix}" if fix else ""))
    for check in bad_checks:
        diagnosis = check.get("diagnosis") or [check.get("summary") or "failed"]
        diagnosis = [diagnosis] if isinstance(diagnosis, str) else diagnosis
        lines.append(f"  image: {check.get('name')}: {'; '.join(str(d) for d in diagnosis if d)[:400]}")
    return ok, lines


def validate_options(image: str, timeout: int, shm_size: str, checks: str | None = None) -> None:
    """Flags checked before the engine is asked anything (exit 2, not 3)."""
    reference.check_image_name(image)
    if checks is not None and not re.fullmatch(r"[a-z]+(,[a-z]+)*", checks):
        raise UserError(f"--checks {checks[:40]!r} is not a comma list of check names", "e.g. --checks env,ops,nccl")
    if not 1 <= timeout <= 86_400:
        raise UserError(f"--timeout {timeout}: must be 1 to 86400 seconds")
    if not re.fullmatch(r"[1-9][0-9]{0,6}[bkmg]?", shm_size):
        raise UserError(f"--shm-size {shm_size[:40]!r} is not a size", "e.g. --shm-size 8g")


def _write_verdict(path: str, data: dict) -> None:
    try:
        fsutil.write_json(path, data)
    except OSError as exc:
        raise EnvironmentProblem(f"{path}: cannot write ({exc.strerror or exc})",
                                 "pick a writable --json path") from None


def main(args: Options, m=None) -> int:
    validate_options(args.image, args.timeout, args.shm_size, args.checks)
    identity = signer(args)
    if args.signatures_only:
        signed = check_signatures(replace(args, require_signature=True), identity)
        # A signature says who signed the bytes, not what they are about: another image's SBOM or provenance,
        # signed by the right key and stored beside this digest, must fail here as in a full verify.
        attested = attestations_of(signed["ref"], None, strict=True)
        refuse_unbound(args.image, attested)
        log.out(f"✓ PASS: {args.image}: digest and attestations signed, attestations about this digest")
        for line in signed["lines"] + attested["lines"]:
            log.out(f"  {line}")
        return 0
    # Signatures first: nothing unsigned is pulled or run, and what runs is the digest that was checked.
    signed = check_signatures(args, identity)
    target = signed.get("ref") or args.image
    engine.sdk()  # no engine: EnvironmentProblem with how to start one
    with log.step(f"image {target}") as note:
        image = ensure_image(target, pull=not args.no_pull)
        facts = inspect.read_facts(image)
        wrong = attestations.label_problem(facts.get("tag"), facts.get("pins") or {}, image.labels or {})
        if wrong:  # the image contradicts itself: neither its facts nor its labels can be believed
            raise StepFailed(f"{target}: its labels contradict its own facts ({inspect.FACTS}): {wrong}",
                             "do not use this image: it was altered after it was built")
        note["result"] = f"{facts.get('tag')}: torch {facts.get('pins', {}).get('torch')}, CUDA {facts.get('cuda')}"
    with log.step("host") as note:
        gpus, source = host.gpus()
        rows, use_gpus = host_checks(facts, engine.info(), gpus, source, args.cpu)
        note["result"] = f"{len(gpus)} GPU(s), gate in {'GPU' if use_gpus else 'CPU'} mode"
    why_cpu = ("--cpu was given" if args.cpu else "no usable GPU here" if not gpus
               else "the host checks above failed")
    with log.step(f"attestations of {args.image}") as note:
        attested = attestations_of(target, image, strict=args.require_signature, facts=facts)
        note["result"] = attested["lines"][0] if attested["lines"] else "—"
        refuse_unbound(args.image, attested)  # strict: an attestation of another image stops verify before the gate
    with log.step(f"smoke gate in {args.image} ({'GPU' if use_gpus else 'CPU'})") as note:
        gate = run_gate(image.id, gpus=use_gpus, timeout=args.timeout, shm_size=args.shm_size, only=args.checks)
        note["result"] = "passed" if gate.get("passed") else "FAILED"
    table = [[name, log.mark(ok) if ok is not None else "–", detail] for name, ok, detail, _ in rows]
    table += [[f"gate: {c.get('name')}", log.mark(bool(c.get("passed"))), (c.get("summary") or "")[:90]]
              for c in gate.get("checks") or []]
    log.summary(f"verify {args.image}", ("check", "ok", "detail"), table)
    ok, lines = verdict(args.image, rows, gate, use_gpus, why_cpu)
    lines += [f"  {line}" for line in attested["lines"] + signed["lines"]]
    if gate.get("not_run"):
        lines.append(f"  note: gate checks NOT run (--checks): {', '.join(gate['not_run'])}")
    if attested["problem"] or signed["ok"] is False:
        ok = False
        lines[0] = lines[0].replace("✓ PASS", "✕ FAIL")
    for line in lines:
        log.out(line)
    if args.json:
        _write_verdict(args.json, {"image": args.image, "image_id": image.id, "passed": ok, "gpu_mode": use_gpus,
                                      "host": [dict(zip(("check", "ok", "detail", "fix"), r)) for r in rows],
                                      "gate": gate, "attestations": attested, "signatures": signed,
                                      "verdict": lines})
    if not ok:
        raise StepFailed(f"{args.image} did not verify on this host", "see the lines above for what to do")
    return 0
