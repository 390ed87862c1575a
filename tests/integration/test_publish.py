"""publish against a real registry on 127.0.0.1: the gate, the order (full tag, read-back, alias), auth, failures.

Most tests push a tiny real image (FROM scratch, one file, a label: pushes in well under a second) and
write a smoke report for its ID themselves: what is under test is publish's gate and push logic, not
the gate's checks. test_publish_real_ci_image pushes the real CI image with its real smoke report.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from spdx_tools.spdx.parser.jsonlikedict.json_like_dict_parser import JsonLikeDictParser
from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

from builder import reports
from builder.boundary import engine
from builder.model import matrix, paths
from builder.steps import publish, render
from tests.conftest import ROOT, run_cli
from tests.integration import registry_fixture
from tests.unit.test_attestations import ntia_gaps

TAG = "cu121-torch2.3"
LOCAL = f"example.org/team/train:{TAG}"  # the project fixture's matrix image
pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("require_docker")]


def docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([engine.client().binary, *argv], capture_output=True, text=True, check=check, timeout=600)


PYBASE = "builder-test/pybase:latest"


@pytest.fixture(scope="session")
def pybase(require_docker, tmp_path_factory):
    """Debian with python3 and smoke/: the least an image needs for publish to list its packages (SBOM)."""
    ctx = tmp_path_factory.mktemp("pybase")
    (ctx / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN apt-get update -qq && apt-get install -y -qq "
                                    "--no-install-recommends python3 >/dev/null && ln -s /usr/bin/python3 "
                                    "/usr/local/bin/python && rm -rf /var/lib/apt/lists/*\n")
    subprocess.run([engine.client().binary, "build", "-q", "--network=host", "-t", PYBASE, str(ctx)], check=True,
                   capture_output=True, timeout=900,
                   env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items()
                                                                        if k == "DOCKER_HOST"}})
    return PYBASE


@pytest.fixture
def images(pybase):
    """Build tiny images on demand; remove them (every tag) afterwards."""
    made: list[str] = []

    def make(tmp_dir, ref: str = LOCAL, substituted: str | None = "false") -> str:
        marker = uuid.uuid4().hex
        ctx = tmp_dir / f"ctx-{marker[:8]}"
        ctx.mkdir()
        (ctx / "hello.txt").write_text(marker + "\n")
        # The label `build` sets on every image it makes; publish refuses an image without it.
        label = f"LABEL io.train-images.base.substituted={substituted}\n" if substituted else ""
        shutil.copytree(ROOT / "smoke", ctx / "smoke", ignore=shutil.ignore_patterns("__pycache__"))
        entry = matrix.load(tmp_dir / "matrix.yaml").by_tag()[TAG]
        (ctx / "image.json").write_text(json.dumps(render.facts(entry)))
        locks = tmp_dir / "locks" / TAG  # the checkout's locks, copied in as build does: the provenance reads them
        locks.mkdir(parents=True, exist_ok=True)
        if not (locks / "requirements.lock").exists():
            (locks / "requirements.lock").write_text("# a test lock\n")
        shutil.copytree(locks, ctx / "locks")
        (ctx / "Dockerfile").write_text(f"FROM {pybase}\nCOPY smoke/ /opt/train-image/smoke/\n"
                                        "COPY locks/ /opt/train-image/locks/\n"
                                        "COPY image.json /opt/train-image/image.json\nCOPY hello.txt /\n"
                                        f"LABEL io.train-images.test={marker}\n{label}")
        docker("build", "-q", "-t", ref, str(ctx))
        image_id = docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        made.append(image_id)
        return image_id

    yield make
    for image_id in made:
        docker("rmi", "-f", image_id, check=False)


@pytest.fixture
def registry(tmp_path):
    if not registry_fixture.available():
        pytest.fail("needs /usr/bin/docker-registry and htpasswd: apt-get install docker-registry apache2-utils")
    reg = registry_fixture.Registry(tmp_path / "registry").start()
    yield reg
    reg.stop()


@pytest.fixture(autouse=True)
def no_ambient_credentials(tmp_path, monkeypatch):
    """An empty Docker config: only what a test passes in can authenticate."""
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setattr(publish, "BACKOFF_S", 0.05)


GPU_LEVEL = {"kind": "gpu", "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "driver": "580.82.07"}
CPU_LEVEL = {"kind": "cpu", "gpu_model": None, "gpu_count": 0, "driver": None}


def passing_smoke(image_id: str, tag: str = TAG, level: dict = GPU_LEVEL) -> None:
    """The smoke report publish reads (publish's input; the gate itself is tested in test_smoke_e2e)."""
    reports.write(tag, "smoke", {"image": LOCAL, "passed": True, "image_id": image_id, "mode": level["kind"],
                                 "level": level, "finished_at": "2026-12-02T00:00:00Z", "checks": []})


# --- the happy path ------------------------------------------------------------------------------------


def test_publish_then_pull_back_by_digest_and_alias(project, registry, images, capsys):
    image_id = images(project)
    passing_smoke(image_id)
    assert run_cli("publish", TAG, "--registry", f"{registry.host}/team", "--date", "20261202",
                   "--revision", "abcdef0123") == 0
    report = reports.read(TAG, "publish")
    full = f"{TAG}-torch2.3.1-tf4.44.2-ds0.15.1-peft0.12.0-acc0.34.2-nvml12.555.43-fa2.6.3-20261202-abcdef0"
    assert report["full_tag"] == full and report["alias"] == TAG and report["image_id"] == image_id
    assert registry.digest("team/train", full) == report["digest"] == registry.digest("team/train", TAG)
    assert report["digest"] in capsys.readouterr().err  # the summary names the digest
    assert report["layer_compression"] == "gzip"  # `docker build` pushes gzip on every engine: any client pulls it

    docker("rmi", "-f", image_id)  # gone locally: the pulls below must fetch from the registry
    repo = f"{registry.host}/team/train"
    docker("pull", f"{repo}@{report['digest']}")
    assert docker("image", "inspect", "--format", "{{.Id}}", f"{repo}@{report['digest']}").stdout.strip() == image_id
    docker("rmi", "-f", image_id)
    docker("pull", f"{repo}:{TAG}")
    assert docker("image", "inspect", "--format", "{{.Id}}", f"{repo}:{TAG}").stdout.strip() == image_id


def test_sbom_and_provenance_are_stored_beside_the_digest(project, registry, images, tmp_path):
    """Registry 2.8 has no referrers API: the artifacts land under the fallback tag sha256-<hex>, and verify
    finds them there, checks they name this digest, and says who built it, from what, behind which gate."""
    from builder.boundary import registry as reg
    from builder.model import attestations
    from builder.steps import verify

    image_id = images(project)
    passing_smoke(image_id)
    assert run_cli("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "abc1234") == 0
    report = reports.read(TAG, "publish")
    digest = report["digest"]
    assert set(report["attestations"]) == {"sbom.spdx.json", "sbom.cdx.json", "provenance.intoto.json"}
    assert registry.digest("train", digest.replace(":", "-")) is not None  # the fallback index exists
    repo = reg.Repository(registry.host, "train")
    kinds = {d["artifactType"]: d for d in reg.referrers(repo, digest)}
    assert set(kinds) == {attestations.SBOM_TYPE, attestations.CYCLONEDX_TYPE, attestations.PROVENANCE_TYPE}
    # The CycloneDX twin, for scanners that read only that: valid 1.6, bound to this digest, the same packages.
    cdx_text = reg.referrer_payload(repo, kinds[attestations.CYCLONEDX_TYPE], digest).decode()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(cdx_text) is None
    cdx = json.loads(cdx_text)
    assert attestations.cyclonedx_binding(cdx, digest) is None and cdx["specVersion"] == "1.6"
    sbom = json.loads(reg.referrer_payload(repo, kinds[attestations.SBOM_TYPE], digest))
    # As a consumer reads it, pulled from a registry whose name has a port: valid SPDX 2.3, and the NTIA
    # minimum elements (every package's supplier from its own metadata, the document's author and time).
    assert validate_full_spdx_document(JsonLikeDictParser().parse(sbom)) == []
    assert ntia_gaps(sbom, tmp_path) == {}
    assert {c["purl"] for c in cdx["components"] if "purl" in c} == {
        r["referenceLocator"] for p in sbom["packages"][2:] for r in p["externalRefs"]}
    assert all(c.get("supplier") for c in cdx["components"])
    python3 = next(p for p in sbom["packages"] if p["name"] == "python3")
    assert python3["versionInfo"] and len(python3["checksums"][0]["checksumValue"]) == 64
    assert python3["externalRefs"][0]["referenceLocator"].startswith("pkg:deb/debian/python3@") and \
        python3["externalRefs"][0]["referenceLocator"].endswith("&distro=debian-12")
    assert any(p.get("primaryPackagePurpose") == "OPERATING-SYSTEM" and p["versionInfo"] == "12"
               for p in sbom["packages"])
    statement = json.loads(reg.referrer_payload(repo, kinds[attestations.PROVENANCE_TYPE], digest))
    assert statement["subject"][0]["digest"]["sha256"] == digest.split(":", 1)[1]
    lock = next(d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
                if d["uri"].endswith(f"/locks/{TAG}/requirements.lock"))
    assert lock["digest"]["sha256"] == hashlib.sha256(b"# a test lock\n").hexdigest()  # read from the image
    gate = statement["predicate"]["runDetails"]["byproducts"][0]["annotations"]
    assert gate["passed"] is True and gate["level"]["kind"] == "gpu" and gate["image_id"] == image_id
    # Pulled by digest on another host: verify reads them back and binds them to that digest.
    docker("rmi", "-f", image_id)
    pulled = f"{registry.host}/train@{digest}"
    docker("pull", pulled)
    found = verify.attestations_of(pulled, engine.sdk().images.get(pulled))
    assert found["sbom"] and found["provenance"] and found["problem"] is None
    text = "\n".join(found["lines"])
    assert "bound to this digest" in text and "gate: passed on GPU: 8 × NVIDIA H100 80GB HBM3" in text
    # An artifact for another digest listed under this digest's tag is not believed.
    other = reg.descriptor(repo, report["full_tag"])
    assert reg.referrer_payload(repo, kinds[attestations.SBOM_TYPE], "sha256:" + "0" * 64) is None and other


def test_an_image_built_from_other_locks_than_the_checkout_is_refused_before_any_push(project, registry, images,
                                                                                      capsys):
    passing_smoke(images(project))
    (project / "locks" / TAG / "requirements.lock").write_text("# relocked since the build\n")
    assert run_cli("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "abc1234") == 1
    err = capsys.readouterr().err
    assert "not built from this checkout's locks: requirements.lock differs" in err
    assert registry.digest("train", TAG) is None  # nothing pushed


EXPIRED_WAIVER = """waivers:
  - id: PYSEC-2000-1
    package: pip
    reason: "a test waiver that expired long ago"
    expires: 2000-01-01
"""


def test_max_severity_audits_the_image_before_any_push(project, registry, images, capsys):
    passing_smoke(images(project))
    argv = ("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "abc1234",
            "--max-severity", "high")
    (project / "waivers.yaml").write_text(EXPIRED_WAIVER)
    assert run_cli(*argv) == 1
    assert "refusing to publish: waivers.yaml:2: waiver for PYSEC-2000-1 (pip) expired on 2000-01-01" in \
        capsys.readouterr().err
    assert registry.digest("train", TAG) is None and reports.read(TAG, "audit")["passed"] is False
    (project / "waivers.yaml").write_text(EXPIRED_WAIVER.replace("2000-01-01", "2099-12-31"))
    assert run_cli(*argv) == 0
    report = reports.read(TAG, "publish")
    assert report["audit"] == reports.read(TAG, "audit")["summary"] and ": passed;" in report["audit"]


def test_republishing_the_same_image_is_idempotent(project, registry, images):
    passing_smoke(images(project))
    argv = ("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "abc1234")
    assert run_cli(*argv) == 0
    first = reports.read(TAG, "publish")["digest"]
    assert run_cli(*argv) == 0
    assert reports.read(TAG, "publish")["digest"] == first


def test_full_tags_are_immutable(project, registry, images, capsys):
    argv = ("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "abc1234")
    passing_smoke(images(project))
    assert run_cli(*argv) == 0
    old = registry.digest("train", TAG)
    passing_smoke(images(project))  # a rebuild with the same versions, date and revision
    assert run_cli(*argv) == 1
    assert "already exists with another image" in capsys.readouterr().err
    assert registry.digest("train", TAG) == old


def test_dry_run_pushes_nothing(project, registry, images, capsys):
    passing_smoke(images(project))
    assert run_cli("publish", TAG, "--registry", registry.host, "--dry-run") == 0
    assert "would push" in capsys.readouterr().err
    assert registry.digest("train", TAG) is None and reports.read(TAG, "publish", required=False) is None


# --- the gate ------------------------------------------------------------------------------------------


def test_refused_without_smoke_report(project, registry, images, capsys):
    images(project)
    assert run_cli("publish", TAG, "--registry", registry.host) == 1
    err = capsys.readouterr().err
    assert "refusing to publish: no smoke report" in err and f"python -m builder smoke {TAG}" in err
    assert registry.digest("train", TAG) is None


def test_refused_when_smoke_failed(project, registry, images, capsys):
    image_id = images(project)
    reports.write(TAG, "smoke", {"image": LOCAL, "passed": False, "image_id": image_id, "mode": "gpu",
                                 "finished_at": "2026-12-02T00:00:00Z", "checks": [{"name": "nccl", "passed": False}]})
    assert run_cli("publish", TAG, "--registry", registry.host) == 1
    assert "the smoke gate did not pass" in capsys.readouterr().err
    assert registry.digest("train", TAG) is None


def test_refused_when_smoke_passed_for_another_image(project, registry, images, capsys):
    old = images(project)
    passing_smoke(old)
    images(project)  # rebuilt: same tag, new image ID, not gated
    assert run_cli("publish", TAG, "--registry", registry.host) == 1
    err = capsys.readouterr().err
    assert "is for image " + old[:19] in err and "rebuilt or retagged" in err
    assert registry.digest("train", TAG) is None


def test_refused_without_local_image(project, registry, capsys):
    docker("rmi", "-f", LOCAL, check=False)
    assert run_cli("publish", TAG, "--registry", registry.host) == 2
    assert f"there is no local image {LOCAL}" in capsys.readouterr().err


def test_cpu_gate_refused_for_a_gpu_entry(project, registry, images, capsys):
    passing_smoke(images(project), level=CPU_LEVEL)
    assert run_cli("publish", TAG, "--registry", registry.host) == 1
    err = capsys.readouterr().err
    assert "runs on GPU runners, but its gate ran on CPU only" in err and "--allow-cpu-gate" in err
    assert registry.digest("train", TAG) is None


def test_cpu_gate_allowed_explicitly_and_recorded(project, registry, images):
    """With --allow-cpu-gate the image goes out, and what users read says how far it was proven: the report,
    and the provenance stored beside the digest, which verify reads back."""
    from builder.steps import verify

    image_id = images(project)
    passing_smoke(image_id, level=CPU_LEVEL)
    assert run_cli("publish", TAG, "--registry", registry.host, "--allow-cpu-gate") == 0
    report = reports.read(TAG, "publish")
    assert report["exceptions"] == ["cpu-gate"] and report["gate"]["kind"] == "cpu"
    assert registry.digest("train", TAG) == report["digest"]
    pulled = f"{registry.host}/train@{report['digest']}"
    found = verify.attestations_of(pulled, engine.sdk().images.get(image_id))
    assert found["sbom"] and found["provenance"] and found["problem"] is None
    assert "gate: passed on CPU only" in "\n".join(found["lines"])


def test_gpu_gate_level_is_recorded(project, registry, images):
    passing_smoke(images(project))
    assert run_cli("publish", TAG, "--registry", registry.host) == 0
    report = reports.read(TAG, "publish")
    assert report["gate"] == GPU_LEVEL and report["exceptions"] == []


def test_substituted_base_refused_unless_allowed(project, registry, images, capsys):
    passing_smoke(images(project, substituted="true"))
    assert run_cli("publish", TAG, "--registry", registry.host) == 1
    assert "built on a substituted base" in capsys.readouterr().err
    assert registry.digest("train", TAG) is None
    assert run_cli("publish", TAG, "--registry", registry.host, "--allow-substituted-base") == 0
    assert reports.read(TAG, "publish")["exceptions"] == ["substituted-base"]


def test_an_image_this_builder_did_not_build_is_refused(project, registry, images, capsys):
    passing_smoke(images(project, substituted=None))
    assert run_cli("publish", TAG, "--registry", registry.host) == 1
    assert "this builder did not build it" in capsys.readouterr().err
    assert registry.digest("train", TAG) is None


# --- credentials ---------------------------------------------------------------------------------------


@pytest.fixture
def auth_registry(tmp_path):
    reg = registry_fixture.Registry(tmp_path / "auth-registry", users={"ci": "s3cr3t-Pa55"}).start()
    yield reg
    reg.stop()


def test_auth_registry_with_password_stdin(project, auth_registry, images, monkeypatch, capsys):
    passing_smoke(images(project))
    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cr3t-Pa55\n"))
    assert run_cli("publish", TAG, "--registry", auth_registry.host, "--username", "ci", "--password-stdin") == 0
    digest = reports.read(TAG, "publish")["digest"]
    assert auth_registry.digest("train", TAG, user="ci") == digest
    out = capsys.readouterr()
    assert "s3cr3t-Pa55" not in out.out + out.err
    assert "s3cr3t-Pa55" not in paths.report(TAG, "publish").read_text()


def test_auth_registry_with_docker_config(project, auth_registry, images, tmp_path, capsys):
    """Credentials the user stored with `docker login` (DOCKER_CONFIG) serve both the push and the read-back."""
    passing_smoke(images(project))
    login = subprocess.run([engine.client().binary, "login", "-u", "ci", "--password-stdin", auth_registry.host],
                           input="s3cr3t-Pa55", capture_output=True, text=True)
    assert login.returncode == 0, login.stderr
    assert run_cli("publish", TAG, "--registry", auth_registry.host) == 0
    assert auth_registry.digest("train", TAG, user="ci") == reports.read(TAG, "publish")["digest"]


def test_auth_registry_without_credentials_fails_cleanly(project, auth_registry, images, capsys):
    passing_smoke(images(project))
    assert run_cli("publish", TAG, "--registry", auth_registry.host) == 1
    err = capsys.readouterr().err
    assert "needs credentials" in err or "refused the push" in err
    assert "--password-stdin" in err and "Traceback" not in err
    assert auth_registry.digest("train", TAG, user="ci") is None


def test_auth_registry_wrong_password(project, auth_registry, images, monkeypatch, capsys):
    passing_smoke(images(project))
    monkeypatch.setattr(sys, "stdin", io.StringIO("wrong-password\n"))
    assert run_cli("publish", TAG, "--registry", auth_registry.host, "--username", "ci", "--password-stdin") == 1
    err = capsys.readouterr().err
    assert "login to" in err and "failed" in err and "wrong-password" not in err


# --- failures in the middle ----------------------------------------------------------------------------


def test_registry_dies_after_full_tag_alias_unmoved(project, registry, images, monkeypatch, capsys):
    passing_smoke(images(project))
    assert run_cli("publish", TAG, "--registry", registry.host, "--date", "20261201", "--revision", "aaaaaaa") == 0
    before = reports.read(TAG, "publish")
    new_id = images(project)
    passing_smoke(new_id)
    monkeypatch.setattr(publish, "_after_full_push", lambda repo, digest: registry.stop())
    assert run_cli("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "bbbbbbb") == 1
    err = capsys.readouterr().err
    assert "gave up after 3 tries" in err and "nothing after this step was changed" in err
    registry.start()  # same port, same storage: what did the registry keep?
    assert registry.digest("train", TAG) == before["digest"]  # the alias still points at the old image
    assert registry.digest("train", before["full_tag"]) == before["digest"]
    assert reports.read(TAG, "publish") == before  # no success was recorded


def test_kill_9_mid_publish_leaves_the_alias_and_resumes(project, registry, images):
    """SIGKILL after the full tag and its attestations are in the registry, before the alias: the alias is
    untouched, no report claims success, and the next run finishes the job with the same digest."""
    import os
    import signal

    image_id = images(project)
    passing_smoke(image_id)
    argv = [sys.executable, "-m", "builder", "publish", TAG, "--registry", registry.host, "--date", "20261202",
            "--revision", "abc1234"]
    proc = subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    seen = ""
    for line in proc.stdout:
        seen += line
        if "attached sbom.spdx.json" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, seen[-2000:]
    full = f"{TAG}-torch2.3.1-tf4.44.2-ds0.15.1-peft0.12.0-acc0.34.2-nvml12.555.43-fa2.6.3-20261202-abc1234"
    staged = registry.digest("train", full)
    assert staged is not None and registry.digest("train", TAG) is None, "the alias must not have moved"
    assert reports.read(TAG, "publish", required=False) is None
    assert run_cli("publish", TAG, "--registry", registry.host, "--date", "20261202", "--revision", "abc1234") == 0
    assert registry.digest("train", TAG) == staged == reports.read(TAG, "publish")["digest"]


def test_registry_down_from_the_start(project, registry, images, capsys):
    passing_smoke(images(project))
    registry.stop()
    assert run_cli("publish", TAG, "--registry", registry.host, "--retries", "2") == 1
    assert "does not answer" in capsys.readouterr().err
    assert reports.read(TAG, "publish", required=False) is None


# --- the real CI image ---------------------------------------------------------------------------------

CI_TAG = "cu130-torch2.13-bookworm"


def test_publish_real_ci_image(registry, tmp_path, monkeypatch, ci_gate):
    """The real image (~5.7 GB) with its real smoke report: push, read back, pull by digest."""
    monkeypatch.chdir(ROOT)
    assert ci_gate["proc"].returncode == 0, f"the real smoke gate failed for {CI_TAG}: see its report"
    smoke = json.loads(paths.report(CI_TAG, "smoke").read_text())
    local = f"ghcr.io/train-images/train:{CI_TAG}"
    current = docker("image", "inspect", "--format", "{{.Id}}", local, check=False).stdout.strip()
    if not current:
        pytest.fail(f"{local} is not built: run `make image` (build + smoke) first")
    if not smoke.get("passed") or smoke.get("image_id") != current:
        pytest.fail(f"the smoke report does not pass for {current[:19]}: run `python -m builder smoke {CI_TAG} --cpu`")
    # Work on a copy of the reports so this test never rewrites the project's publish report.
    copy = tmp_path / "reports"
    copy.mkdir()
    built = json.loads(paths.report(CI_TAG, "build").read_text())
    for step in ("smoke", "build"):
        (copy / f"{CI_TAG}.{step}.json").write_text(paths.report(CI_TAG, step).read_text())
    monkeypatch.setenv("BUILDER_REPORTS", str(copy))
    # Where the build writes the image itself into the containerd store (Docker >= 26, buildx), its layers are
    # zstd and BuildKit's provenance was kept; elsewhere (Docker 20.10) gzip and none.
    modern = engine.rewrites_timestamps() and engine.image_store() == "containerd"
    assert built["layer_compression"] == ("zstd" if modern else "gzip")
    assert bool(built["buildkit_provenance"]) is modern
    if modern:  # BuildKit's record of this very build (buildx's metadata file): its inputs, its image
        statement = json.loads((ROOT / built["buildkit_provenance"]).read_text())
        args = statement["predicate"]["invocation"]["parameters"]["args"]
        assert args["label:io.train-images.input-hash"] == built["input_hash"]
        assert statement["subject"][0]["digest"]["sha256"] == current.split(":", 1)[1]
    # Our CI builds on a debootstrapped copy of the base (no registry reachable): an explicit exception.
    assert run_cli("publish", CI_TAG, "--registry", registry.host) == 1
    assert run_cli("publish", CI_TAG, "--registry", registry.host, "--allow-substituted-base") == 0
    report = reports.read(CI_TAG, "publish")
    assert report["exceptions"] == ["substituted-base"] and report["gate"]["kind"] == "cpu"
    assert reports.problems("publish", report) == []
    assert report["full_tag"].startswith(f"{CI_TAG}-torch2.13.0-tf5.24.0-ds0.19.8-peft0.21.2-acc1.16.0-nvml13.615.71-")
    assert registry.digest("train", CI_TAG) == report["digest"] == registry.digest("train", report["full_tag"])
    pulled = f"{registry.host}/train@{report['digest']}"
    docker("pull", pulled)
    assert docker("image", "inspect", "--format", "{{.Id}}", pulled).stdout.strip() == current
    print(f"\nreal CI image: {report['size_bytes'] / 1e9:.2f} GB pushed in {report['push_seconds']}s, "
          f"digest {report['digest']}")
    # The round trip a user does on a cloud host: pull by digest, then re-verify there.
    verdict = tmp_path / "verify.json"
    # The whole gate ran on this image in test_smoke_e2e; here the round trip re-runs the quick checks (compile
    # and train are most of the gate's two minutes), and the verdict must say what it left out.
    assert run_cli("verify", pulled, "--json", str(verdict), "--checks", "env,ops,nccl") == 0
    result = json.loads(verdict.read_text())
    assert result["passed"] and result["image_id"] == current
    assert result["attestations"]["sbom"] and result["attestations"]["provenance"], result["attestations"]
    # ... and the registry serves what the engine made: the layers' compression, BuildKit's provenance beside ours
    assert report["layer_compression"] == built["layer_compression"]
    assert ("buildkit-provenance.intoto.json" in report["attestations"]) is modern
    assert result["attestations"]["buildkit_provenance"] is modern, result["verdict"]
    if not result["gpu_mode"]:
        assert any("GPU checks" in line and "NOT run" in line for line in result["verdict"])
    assert any("gate checks NOT run (--checks): compile, train" in line for line in result["verdict"])
    for ref in (f"{registry.host}/train:{CI_TAG}", f"{registry.host}/train:{report['full_tag']}"):
        docker("rmi", ref, check=False)  # untag only: the image itself stays
