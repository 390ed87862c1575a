"""cosign, the signature tool (ci/setup-cosign.sh installs it): sign a digest, verify one, say who signed.

Two ways to sign, one way to check each:
- keyless (GitHub Actions): the OIDC token of the job becomes a short-lived certificate whose identity is
  `https://github.com/OWNER/REPO/.github/workflows/images.yml@refs/heads/main`; verify names that exact
  identity and issuer (a regexp over the owner would accept any of the owner's repositories and refs);
- a key pair (`--key`): what the tests use offline; the transparency log is neither written nor required.
Plain-HTTP registries on the loopback (the local test registry) are allowed, nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from builder.boundary import process, registry
from builder.errors import EnvironmentProblem, StepFailed, UserError
from builder.model import attestations

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
TIMEOUT_S = 180
# What publish attaches beside the digest (and sign signs).
KINDS = (attestations.SBOM_TYPE, attestations.CYCLONEDX_TYPE, attestations.PROVENANCE_TYPE)


@dataclass(frozen=True)
class Identity:
    """Who must have signed: a public key file, or a certificate identity and its OIDC issuer."""

    key: str | None = None
    certificate_identity: str | None = None
    issuer: str = GITHUB_ISSUER

    def describe(self) -> str:
        return f"key {self.key}" if self.key else f"{self.certificate_identity} (issuer {self.issuer})"


def binary() -> str:
    found = shutil.which("cosign")
    if not found:
        raise EnvironmentProblem("cosign is not installed", "run `bash ci/setup-cosign.sh` (or `make docker`)")
    return found


def _registry_flags(ref: str) -> list[str]:
    host = ref.split("/", 1)[0]
    return ["--allow-http-registry"] if host.startswith(("127.0.0.1", "localhost", "[::1]")) else []


def _run(argv: list[str]) -> process.Result:
    env = dict(os.environ)
    env.setdefault("COSIGN_PASSWORD", "")  # key files made for CI/tests carry no passphrase unless one is set
    try:
        secrets = [env["COSIGN_PASSWORD"]] if env["COSIGN_PASSWORD"] else []
        return process.run(argv, timeout=TIMEOUT_S, env=env, secrets=secrets)
    except process.TimedOut:
        raise StepFailed(f"cosign {argv[1]} did not finish in {TIMEOUT_S} s") from None


def sign(ref: str, key: str | None = None) -> None:
    """Sign the manifest `ref` (repo@sha256:…): keyless where no key is given (GitHub OIDC)."""
    argv = [binary(), "sign", "--yes", *_registry_flags(ref)]
    argv += ["--key", key, "--tlog-upload=false"] if key else []
    proc = _run([*argv, ref])
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise StepFailed(f"cosign could not sign {ref}: {last[:300]}", "check the registry login and the key")


def verify(ref: str, identity: Identity) -> tuple[bool, str]:
    """(signed by `identity`?, who signed or why not), checked by cosign against the registry."""
    argv = [binary(), "verify", "--output", "json", *_registry_flags(ref)]
    if identity.key:
        argv += ["--key", identity.key, "--insecure-ignore-tlog=true"]
    else:
        argv += ["--certificate-identity", identity.certificate_identity or "",
                 "--certificate-oidc-issuer", identity.issuer]
    proc = _run([*argv, ref])
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no valid signature"])[-1]
        return False, reason.removeprefix("Error: ")[:300]
    return True, _signer(proc.stdout, identity)


def _signer(output: str, identity: Identity) -> str:
    """The identity cosign verified: the certificate's subject and issuer (keyless), else the key."""
    try:
        optional = (json.loads(output or "[]")[0].get("optional") or {})
    except (ValueError, IndexError, AttributeError):
        optional = {}
    subject = optional.get("Subject")
    return f"{subject} (issuer {optional.get('Issuer', identity.issuer)})" if subject else identity.describe()


def split_reference(ref: str) -> tuple[registry.Repository, str]:
    """HOST[:PORT]/NAME@sha256:… → (repository, digest); anything else is a user error."""
    name, _, digest = ref.partition("@")
    host, _, path = name.partition("/")
    if not digest.startswith("sha256:") or not path or not ("." in host or ":" in host or host == "localhost"):
        raise UserError(f"{ref[:120]!r} is not HOST/NAME@sha256:DIGEST", "sign and verify need an immutable reference")
    return registry.Repository(host, path), digest


def attestation_refs(repo: registry.Repository, digest: str) -> list[str]:
    """repo@digest of every SBOM and provenance artifact that names `digest` as its subject."""
    return [f"{repo.ref}@{d['digest']}" for d in registry.referrers(repo, digest) if d.get("artifactType") in KINDS]
