"""`python -m builder sign TAG|REF`: sign a published image's digest and each attestation stored beside it.

TAG means the digest `publish` pushed (build/reports/<tag>.publish.json `pull`); REF is repo@sha256:…. The
SBOM and provenance publish attached are OCI referrers of the digest: each is a manifest of its own, and
each is signed by its digest, so `verify --require-signature` can refuse one that was replaced or added
later. In the workflow this runs keyless (the job's GitHub OIDC identity); `--key` signs with a key pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder import log, reports
from builder.boundary import cosign
from builder.errors import UserError
from builder.flags import arg


@dataclass(frozen=True)
class Options:
    target: str = arg(metavar="TAG|REF", help="a published tag (its publish report) or HOST/NAME@sha256:…")
    key: str | None = arg("--key", default=None, metavar="PATH",
                          help="cosign private key (default: keyless, the CI job's OIDC identity)")


def target_reference(target: str) -> str:
    if "@" in target:
        return target
    report = reports.read(target, "publish", required=False) or {}
    if report.get("result") != "published" or not report.get("pull"):
        raise UserError(f"{target}: no published image in its publish report", f"run `builder publish {target}` first")
    return report["pull"]


def main(options: Options, m=None) -> int:
    ref = target_reference(options.target)
    repo, digest = cosign.split_reference(ref)
    signed = [ref, *cosign.attestation_refs(repo, digest)]
    for each in signed:
        cosign.sign(each, key=options.key)
    log.info(f"signed {ref} and {len(signed) - 1} attestation(s) "
             f"({'key ' + options.key if options.key else 'keyless'})")
    return 0
