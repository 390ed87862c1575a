"""Signatures a user can check: `builder sign` and `builder verify --require-signature` with real cosign against a
real registry on 127.0.0.1 (key pairs, offline; CI signs keyless with the same commands).

The image is small and made over the registry API (one layer, a config with a label), with an SBOM and a
provenance attached as OCI referrers exactly as `publish` attaches them: what is under test is who signed what,
not building. Cases a user relies on: a properly signed image passes and says who signed; an unsigned image, an
attestation replaced after signing, and an image signed by another key all fail.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from builder.boundary import registry
from builder.model import attestations
from tests.conftest import ROOT
from tests.integration import registry_fixture

pytestmark = pytest.mark.skipif(not registry_fixture.available(), reason="needs Debian's docker-registry")


def cosign_binary() -> str:
    found = shutil.which("cosign")
    if not found:
        pytest.fail("cosign is missing: run `bash ci/setup-cosign.sh` (`make docker` does)")
    return found


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory):
    reg = registry_fixture.Registry(tmp_path_factory.mktemp("sig-registry")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two key pairs: `ours` (the publisher's) and `other` (anyone else's)."""
    out = {}
    for name in ("ours", "other"):
        where = tmp_path_factory.mktemp(f"key-{name}")
        subprocess.run([cosign_binary(), "generate-key-pair"], cwd=where, check=True, capture_output=True,
                       env=dict(os.environ, COSIGN_PASSWORD=""), timeout=60)
        out[name] = {"key": str(where / "cosign.key"), "pub": str(where / "cosign.pub")}
    return out


def layer(text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def bound_documents(ref: str, digest: str, marker: str) -> tuple[dict, dict]:
    """An SBOM and a provenance whose content names `ref`@`digest`, as publish writes them (attestations.BINDING)."""
    sbom = {"spdxVersion": "SPDX-2.3", "name": marker, "documentDescribes": ["SPDXRef-image"],
            "packages": [{"SPDXID": "SPDXRef-image", "name": f"{ref}@{digest}",
                          "checksums": [{"algorithm": "SHA256", "checksumValue": digest.split(":", 1)[1]}]}]}
    statement = {"_type": "https://in-toto.io/Statement/v1", "predicateType": attestations.SLSA_PROVENANCE,
                 "subject": [{"name": ref, "digest": {"sha256": digest.split(":", 1)[1]}}],
                 "predicate": {"builder": {"id": "local"}}, "marker": marker}
    return sbom, statement


def push_image(reg, name: str, marker: str, about: str | None = None) -> str:
    """A one-layer OCI image with SBOM and provenance referrers about it (or, given `about`, naming that other
    HOST/NAME@sha256:… in their content); returns HOST/NAME@sha256:…."""
    repo = registry.Repository(reg.host, name)
    blob = layer(marker)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"test": marker}},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(blob).hexdigest()]}})
    manifest = {"schemaVersion": 2, "mediaType": registry.OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": registry.put_blob(repo, config.encode()), "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": registry.put_blob(repo, blob),
                            "size": len(blob)}]}
    raw = json.dumps(manifest).encode()
    digest = registry.put_manifest(repo, "latest", raw, registry.OCI_MANIFEST)
    subject = {"mediaType": registry.OCI_MANIFEST, "digest": digest, "size": len(raw)}
    sbom, statement = bound_documents(*(about or f"{repo.ref}@{digest}").split("@"), marker)
    for kind, doc in ((attestations.SBOM_TYPE, sbom), (attestations.PROVENANCE_TYPE, statement)):
        registry.push_referrer(repo, subject, kind, json.dumps(doc).encode())
    return f"{repo.ref}@{digest}"


def builder(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, COSIGN_PASSWORD=""))


def verify(ref: str, pub: str) -> subprocess.CompletedProcess:
    return builder("verify", ref, "--signatures-only", "--require-signature", "--key", pub)


def test_a_signed_image_passes_and_says_who_signed(local_registry, keys):
    ref = push_image(local_registry, "sig/good", "good")
    signed = builder("sign", ref, "--key", keys["ours"]["key"])
    assert signed.returncode == 0, signed.stderr
    proc = verify(ref, keys["ours"]["pub"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "signature of" in line]
    assert len(lines) == 3 and all(f"signed by key {keys['ours']['pub']}" in line for line in lines), proc.stdout


def test_an_unsigned_image_fails(local_registry, keys):
    ref = push_image(local_registry, "sig/unsigned", "unsigned")
    proc = verify(ref, keys["ours"]["pub"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is not signed by key" in proc.stderr and "signature of image" in proc.stdout


def test_full_verify_refuses_an_unsigned_image_before_pulling_or_running_it(local_registry, keys):
    """Without --signatures-only the check comes first: by tag too, with no engine asked anything."""
    push_image(local_registry, "sig/bytag", "bytag")
    proc = builder("verify", f"{local_registry.host}/sig/bytag:latest", "--require-signature",
                   "--key", keys["ours"]["pub"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is not signed by key" in proc.stderr and "▶ image" not in proc.stdout + proc.stderr


def test_an_attestation_added_after_signing_fails(local_registry, keys):
    ref = push_image(local_registry, "sig/tampered", "tampered")
    assert builder("sign", ref, "--key", keys["ours"]["key"]).returncode == 0
    repo, digest = registry.Repository(local_registry.host, "sig/tampered"), ref.rsplit("@", 1)[1]
    subject = registry.descriptor(repo, digest)
    registry.push_referrer(repo, subject, attestations.PROVENANCE_TYPE,
                           json.dumps({"predicate": {"builder": {"id": "https://evil.example"}}}).encode())
    proc = verify(ref, keys["ours"]["pub"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    bad = [line for line in proc.stdout.splitlines() if "NOT signed" in line]
    assert len(bad) == 1 and "signature of attestation" in bad[0], proc.stdout


def test_an_image_signed_by_another_identity_fails(local_registry, keys):
    ref = push_image(local_registry, "sig/other", "other")
    assert builder("sign", ref, "--key", keys["other"]["key"]).returncode == 0
    proc = verify(ref, keys["ours"]["pub"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("NOT signed by key") == 3, proc.stdout
    assert verify(ref, keys["other"]["pub"]).returncode == 0, "the other key's own check passes"


def test_require_signature_without_a_signer_is_a_user_error(local_registry):
    proc = builder("verify", f"{local_registry.host}/sig/x@sha256:{'0' * 64}", "--signatures-only")
    assert proc.returncode == 2 and "--certificate-identity" in proc.stderr, proc.stderr


def test_signatures_only_refuses_signed_attestations_about_another_image(local_registry, keys):
    """Signed by the right key and stored beside this digest, but the SBOM and provenance describe another image:
    a signature binds bytes to a signer, not to this image. Before, --signatures-only passed it."""
    other = push_image(local_registry, "sig/victim", "victim")
    ref = push_image(local_registry, "sig/liar", "liar", about=other)
    assert builder("sign", ref, "--key", keys["ours"]["key"]).returncode == 0
    proc = verify(ref, keys["ours"]["pub"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "not this image" in errors[0] and ref in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "✓ PASS" not in proc.stdout
