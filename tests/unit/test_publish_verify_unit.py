"""Pure parts of publish and verify: names, tag shortening, host checks and the verdict text."""

from __future__ import annotations

import hashlib
import json

import pytest

from builder.boundary import host, inspect, registry, web
from builder.errors import StepFailed, UserError
from builder.model import attestations, matrix
from builder.steps import publish, render
from builder.steps import verify as hostverify

PINS = {"torch": "2.13.0", "transformers": "5.24.0", "deepspeed": "0.19.8", "peft": "0.21.2",
        "accelerate": "1.16.0", "nvidia-ml-py": "13.615.71"}


def test_full_tag_format():
    assert publish.full_tag("cu130-torch2.13", PINS, "20261202", "a94488e") == (
        "cu130-torch2.13-torch2.13.0-tf5.24.0-ds0.19.8-peft0.21.2-acc1.16.0-nvml13.615.71-20261202-a94488e")


def test_full_tag_shortened_to_docker_limit():
    long_tag = "cu130-torch2.13-" + "x" * 100
    full = publish.full_tag(long_tag, {**PINS, "flash-attn": "2.7.4.post1"}, "20261202", "a94488e-dirty")
    assert len(full) <= 128 and full.endswith("-20261202-a94488e-dirty") and "-pins" in full
    assert full == publish.full_tag(long_tag, {**PINS, "flash-attn": "2.7.4.post1"}, "20261202", "a94488e-dirty")


def test_revision_from_label():
    assert publish.revision_of({"org.opencontainers.image.revision": "d96edf968d43-dirty"}, None) == "d96edf9-dirty"
    assert publish.revision_of({}, None) == "unknown"
    assert publish.revision_of({}, "abc/def;rm") == "abcdefr"


@pytest.mark.parametrize("given,host,name,loopback", [
    ("ghcr.io/acme", "ghcr.io", "acme/train", False),
    ("127.0.0.1:5000", "127.0.0.1:5000", "train", True),
    ("localhost:5000/a/b/", "localhost:5000", "a/b/train", True),
    ("registry.example.org", "registry.example.org", "train", False),
])
def test_registry_repository(given, host, name, loopback):
    repo = registry.repository(given, "ghcr.io/train-images/train")
    assert (repo.host, repo.name, repo.loopback) == (host, name, loopback)


def test_registry_rejects_junk():
    with pytest.raises(UserError):
        registry.repository("https://ghcr.io/acme", "x/train")


def test_parse_nvidia_smi():
    gpus = host.parse_nvidia_smi("580.65.06, NVIDIA H100 80GB HBM3, 81559\n580.65.06, NVIDIA H100 80GB HBM3, 81559\n")
    assert len(gpus) == 2 and gpus[0]["driver"] == "580.65.06" and gpus[0]["name"] == "NVIDIA H100 80GB HBM3"


def test_driver_comparison():
    assert hostverify.driver_ok("580.65.06", "580.65.06")
    assert hostverify.driver_ok("590.1", "580.65.06")
    assert not hostverify.driver_ok("570.124.06", "580.65.06")
    assert not hostverify.driver_ok("garbage", "580.65.06")


INFO = {"ServerVersion": "20.10.24", "OperatingSystem": "Debian", "Runtimes": {"runc": {}}}
NO_FABRIC = {"rdma": [], "efa": False, "ipoib": [], "uverbs": [], "memlock_kib": 8192}


def _device(name, driver, layer, v2=False):
    return {"name": name, "driver": driver, "ports": {"1": {"link_layer": layer, "roce_v2_gid": v2}}}


def test_fabric_rows_say_what_nccl_will_find_between_nodes():
    (row,) = hostverify.fabric_rows(NO_FABRIC, {})
    assert row[:3] == ("RDMA fabric", None, "none: NCCL uses sockets (TCP) between nodes")
    ready = {"rdma": [_device("mlx5_0", "mlx5_core", "InfiniBand")], "efa": False, "ipoib": ["ib0"],
             "uverbs": ["uverbs0"], "memlock_kib": None}
    rows = {r[0]: r for r in hostverify.fabric_rows(ready, {})}
    assert rows["RDMA fabric"][1] is True and "mlx5_0 (InfiniBand, mlx5_core)" in rows["RDMA fabric"][2]
    assert rows["locked memory (ulimit -l)"][2] == "unlimited" and "RoCE v2 GID" not in rows


@pytest.mark.parametrize("fabric, row, fix", [
    ({"rdma": [], "ipoib": ["ib0"]}, "RDMA fabric", "ib_uverbs"),
    ({"rdma": [_device("mlx5_0", "mlx5_core", "InfiniBand")], "uverbs": []}, "RDMA fabric", "modprobe ib_uverbs"),
    ({"rdma": [_device("mlx5_2", "mlx5_core", "Ethernet")], "uverbs": ["uverbs2"]}, "RoCE v2 GID", "IP address"),
])
def test_a_fabric_nccl_cannot_use_fails_verify_with_the_fix(fabric, row, fix):
    rows = hostverify.fabric_rows({**NO_FABRIC, **fabric}, {})
    failed = [r for r in rows if r[1] is False]
    assert [r[0] for r in failed] == [row] and fix in failed[0][3]
    ok, lines = hostverify.verdict("img", rows, {"passed": True, "checks": []}, False, "cpu")
    assert not ok and any(line.startswith(f"  host: {row}") for line in lines)


def test_an_efa_host_is_told_in_one_line_that_the_image_has_no_efa_plugin():
    efa = {**NO_FABRIC, "rdma": [_device("rdmap16s27", "efa", "Unspecified")], "efa": True, "uverbs": ["uverbs0"]}
    rows = {r[0]: r for r in hostverify.fabric_rows(efa, {"tag": "x"})}
    assert rows["EFA plugin"][1] is None and "no aws-ofi-nccl" in rows["EFA plugin"][2]
    assert "EFA plugin" not in {r[0] for r in hostverify.fabric_rows(efa, {"efa_plugin": "aws-ofi-nccl 1.17.0"})}


def test_cpu_host_runs_cpu_gate_and_says_so():
    rows, use_gpus = hostverify.host_checks({"min_driver": "580.65.06"}, INFO, [], "no nvidia-smi", False, NO_FABRIC)
    assert not use_gpus
    assert all(ok is not False for name, ok, _, _ in rows if name != "host /dev/shm")
    ok, lines = hostverify.verdict("img", rows, {"passed": True, "checks": []}, use_gpus, "no usable GPU here")
    assert any("GPU checks" in line and "NOT run" in line for line in lines)


def test_old_driver_fails_with_what_to_do():
    gpus = [{"driver": "570.124.06", "name": "NVIDIA A100", "memory_mb": "81920"}]
    info = {**INFO, "Runtimes": {"runc": {}, "nvidia": {}}}
    rows, use_gpus = hostverify.host_checks({"min_driver": "580.65.06"}, info, gpus, "nvidia-smi", False, NO_FABRIC)
    assert not use_gpus
    ok, lines = hostverify.verdict("img", rows, {"passed": True, "checks": []}, use_gpus, "host checks failed")
    assert not ok and any("upgrade the driver to 580.65.06" in line for line in lines)


def test_gpu_host_without_toolkit():
    gpus = [{"driver": "580.65.06", "name": "NVIDIA H100", "memory_mb": "81559"}]
    rows, use_gpus = hostverify.host_checks({"min_driver": "580.65.06"}, INFO, gpus, "nvidia-smi", False, NO_FABRIC)
    if not hostverify.shutil.which("nvidia-container-runtime-hook"):
        assert not use_gpus
        assert any("NVIDIA Container Toolkit" in fix for _, ok, _, fix in rows if ok is False)


# --- verify: attestations count only for the image they name (registry stubbed at its boundary) ----------

IMG = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def stored_beside(monkeypatch, *docs: tuple[str, dict]) -> None:
    """The registry serves these referrers for IMG, each with an OCI subject of IMG (the index-level check passes)."""
    found = [{"artifactType": kind, "digest": f"sha256:{n:064x}"} for n, (kind, _) in enumerate(docs)]
    payloads = {d["digest"]: json.dumps(doc).encode() for d, (_, doc) in zip(found, docs)}
    monkeypatch.setattr(registry, "referrers", lambda repo, digest: found if digest == IMG else [])
    monkeypatch.setattr(registry, "referrer_payload", lambda repo, d, digest: payloads[d["digest"]])
    # The image's manifest as the registry serves it: its config digest is the image ID of the classic store.
    monkeypatch.setattr(registry, "manifest", lambda repo, digest: ({"config": {"digest": CONFIG}}, "", digest)
                        if digest == IMG else None)


CONFIG = "sha256:" + "ef" * 32


def docs_for(digest: str, build: dict | None = None, ran_on: str | None = CONFIG,
             tag: str = "t") -> tuple[tuple[str, dict], tuple[str, dict]]:
    sbom = attestations.sbom("t", "reg.example/t", digest, {}, "now", {"ID": "debian", "VERSION_ID": "12"})
    statement = attestations.provenance(
        repository="reg.example/t", digest=digest, entry={"tag": tag}, locks={}, source={"uri": "u", "revision": "r"},
        build=build or {}, gate={"passed": True, "level": {"kind": "gpu", "gpu_count": 8, "gpu_model": "H100"},
                                 "image_id": ran_on},
        builder_id="https://ci.example/run/1", started=None, finished="now")
    return (attestations.SBOM_TYPE, sbom), (attestations.PROVENANCE_TYPE, statement)


def test_verify_shows_attestations_that_name_this_image(monkeypatch):
    stored_beside(monkeypatch, *docs_for(IMG))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True)
    assert found["sbom"] and found["provenance"] and found["problem"] is None
    assert found["lines"][0].startswith("provenance: bound to this digest; built by https://ci.example/run/1")
    assert " with Docker" not in found["lines"][0]  # a build report that named no engine: nothing made up


def test_verify_names_the_engine_the_provenance_records(monkeypatch):
    docker = {"binary": "docker", "mode": "legacy", "engine": "20.10.24+dfsg1", "image_store": "classic"}
    stored_beside(monkeypatch, *docs_for(IMG, {"docker": docker}))
    line = hostverify.attestations_of(f"reg.example/t@{IMG}", None)["lines"][0]
    assert line.endswith(" with Docker 20.10.24+dfsg1 (legacy docker build, BuildKit, classic image store)")


def test_verify_ignores_another_images_attestations_and_uses_the_bound_ones(monkeypatch):
    """The registry lists B's SBOM and provenance (their OCI subject rewritten to A) before A's own: B's are
    ignored with one warning line each, and what is shown is A's."""
    stored_beside(monkeypatch, *docs_for(OTHER), *docs_for(IMG))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None)
    assert found["sbom"] and found["provenance"] and found["problem"] is None
    warnings = [line for line in found["lines"] if line.startswith("warning: ignored the referrer")]
    assert len(warnings) == 2 and "describes sha256:cdcd" in warnings[0] and "is for sha256:cdcd" in warnings[1]


def test_verify_never_shows_another_images_gate_and_strict_mode_fails(monkeypatch):
    stored_beside(monkeypatch, *docs_for(OTHER))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None)
    assert not found["sbom"] and not found["provenance"] and found["problem"] is None
    assert not any("built by" in line or line.startswith("gate:") for line in found["lines"])
    strict = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True)
    assert strict["problem"].startswith("ignored the referrer") and "not this image" in strict["problem"]


@pytest.mark.parametrize("ran_on", [CONFIG, IMG], ids=["config-digest", "registry-digest"])
def test_verify_shows_a_gate_that_ran_on_this_image_as_checked(monkeypatch, ran_on):
    """The classic store's image ID is the config digest, the containerd store's the manifest digest: either
    is this image."""
    stored_beside(monkeypatch, *docs_for(IMG, ran_on=ran_on))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True, facts={"tag": "t"})
    gate = next(line for line in found["lines"] if line.startswith("gate:"))
    assert gate.startswith("gate: passed on GPU: 8 × H100") and gate.endswith(", on this image)")
    assert found["problem"] is None


def test_verify_never_shows_a_gate_that_ran_on_another_image_as_this_ones(monkeypatch):
    """A provenance bound to this digest (its subject) whose smoke-gate byproduct ran on another image ID: the
    8 × H100 verdict is not printed as this image's; a warning says so, and strict mode fails."""
    stored_beside(monkeypatch, *docs_for(IMG, ran_on="sha256:" + "99" * 32))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None)
    assert not any(line.startswith("gate:") or "8 × H100" in line for line in found["lines"]), found["lines"]
    assert found["lines"][0].startswith("provenance: bound to this digest, but what it claims is NOT this image's")
    assert "the gate ran on image sha256:99999999999" in found["lines"][0] and found["problem"] is None
    strict = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True)
    assert "claims what this image contradicts" in strict["problem"]


def test_verify_checks_the_provenance_tag_and_pins_against_the_images_facts(monkeypatch):
    stored_beside(monkeypatch, *docs_for(IMG, tag="cu999-other"))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True, facts={"tag": "t"})
    assert "it names tag 'cu999-other', the image's facts say 't'" in found["problem"]
    assert not any(line.startswith("gate:") for line in found["lines"])


def test_a_gate_whose_image_is_not_recorded_is_shown_as_not_checked(monkeypatch):
    stored_beside(monkeypatch, *docs_for(IMG, ran_on=None))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True)
    gate = next(line for line in found["lines"] if line.startswith("gate:"))
    assert gate.endswith("the image it ran on not recorded: not checked against this one)") and found["problem"] is None


def buildkit_statement(digest: str) -> tuple[str, dict]:
    """As BuildKit 0.13 writes it with --provenance=mode=max (trimmed)."""
    return attestations.PROVENANCE_TYPE, {
        "_type": "https://in-toto.io/Statement/v0.1", "predicateType": "https://slsa.dev/provenance/v0.2",
        "subject": [{"name": "pkg:docker/ghcr.io/train-images/train@t?platform=linux%2Famd64",
                     "digest": {"sha256": digest.split(":", 1)[1]}}],
        "predicate": {"builder": {"id": ""}, "buildType": "https://mobyproject.org/buildkit@v1",
                      "materials": [{"uri": "pkg:docker/debian@bookworm-slim?platform=linux%2Famd64"}],
                      "metadata": {"buildStartedOn": "2026-12-05T19:03:42.326257166Z"}}}


@pytest.mark.parametrize("buildkit_first", [True, False])
def test_verify_reads_buildkits_provenance_beside_ours_in_any_order(monkeypatch, buildkit_first):
    """Both are in-toto statements under the same artifact type: told apart by predicate type, whichever the
    registry lists first; neither is taken for the other (no warning, strict mode passes)."""
    sbom, ours = docs_for(IMG)
    stored_beside(monkeypatch, *([buildkit_statement(IMG), sbom, ours] if buildkit_first
                                 else [sbom, ours, buildkit_statement(IMG)]))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True)
    assert found["sbom"] and found["provenance"] and found["buildkit_provenance"] and found["problem"] is None
    assert found["lines"][0].startswith("provenance: bound to this digest; built by https://ci.example/run/1")
    assert ("buildkit provenance: SLSA v0.2, bound to this digest; build https://mobyproject.org/buildkit@v1 "
            "started 2026-12-05T19:03:42Z; 1 material(s): pkg:docker/debian@bookworm-slim?platform=linux%2Famd64"
            ) in found["lines"]
    assert not any(line.startswith("warning") for line in found["lines"])


def test_verify_says_when_there_is_no_buildkit_provenance_and_never_shows_another_images(monkeypatch):
    stored_beside(monkeypatch, *docs_for(IMG), buildkit_statement(OTHER))
    found = hostverify.attestations_of(f"reg.example/t@{IMG}", None, strict=True)
    assert found["provenance"] and not found["buildkit_provenance"]
    assert "buildkit provenance: none found for this digest (images built on Docker 20.10 have none)" in found["lines"]
    assert found["problem"].startswith("ignored the referrer") and "BuildKit provenance is for sha256:cdcd" in \
        found["problem"]


# --- publish: the image must be the entry's, and the subject is the manifest whose bytes were pushed ------


@pytest.fixture
def entry(project):
    return matrix.load(project / "matrix.yaml").entries[0]


def labels_of(entry, **extra) -> dict:
    pins = {f"io.train-images.pin.{name}": version or "none" for name, version in entry.pins.items()}
    return {"io.train-images.tag": entry.tag, "io.train-images.input-hash": "sha256:" + "1" * 64, **pins, **extra}


def test_an_image_built_as_its_entry_binds(entry):
    build = {"input_hash": "sha256:" + "1" * 64}
    assert publish.binding_problem(entry, render.facts(entry), labels_of(entry), build) is None
    assert publish.binding_problem(entry, render.facts(entry), {}, {}) is None  # labels absent: facts compared


@pytest.mark.parametrize("facts,labels,field", [
    (lambda f: {**f, "tag": "cu999-other"}, {}, "tag: the image's facts say 'cu999-other'"),
    (lambda f: f, {"io.train-images.tag": "cu999-other"}, "tag: the image's label says 'cu999-other'"),
    (lambda f: {**f, "pins": {**f["pins"], "torch": "9.9.9"}}, {}, "pin torch: the image's facts say 9.9.9"),
    (lambda f: f, {"io.train-images.pin.torch": "9.9.9"}, "pin torch: the image's label io.train-images.pin.torch "
                                                          "says 9.9.9, not"),
    (lambda f: f, {"io.train-images.input-hash": "sha256:" + "2" * 64}, "input hash: the image's label"),
])
def test_an_image_that_is_not_its_entry_is_named_by_field(entry, facts, labels, field):
    problem = publish.binding_problem(entry, facts(render.facts(entry)), labels_of(entry, **labels),
                                      {"input_hash": "sha256:" + "1" * 64})
    assert problem.startswith(field), problem


class FakeImage:
    id = "sha256:" + "9" * 64
    attrs = {"RepoDigests": []}

    def __init__(self, labels: dict):
        self.labels = labels

    def reload(self) -> None:
        pass


def stub_publish(monkeypatch, entry, facts: dict, pushed: str, served: str) -> list[str]:
    """publish_one with its boundary stubbed: no engine, no registry; returns the refs pushed, in order."""
    image = FakeImage(labels_of(entry))
    image.attrs = {"RepoDigests": [f"reg.example/train@{pushed}"]}
    monkeypatch.setattr(publish, "gate", lambda e, o: (image, {"finished_at": "now"}, []))
    monkeypatch.setattr(publish, "image_locks", lambda e, i: {})
    monkeypatch.setattr(inspect, "read_facts", lambda i: facts)
    monkeypatch.setattr(publish, "tag_image", lambda c, i, ref: None)
    pushes: list[str] = []
    # Before the push the full tag is absent; after it the registry claims `served`.
    monkeypatch.setattr(publish, "_read_back", lambda repo, ref, c, t: served if pushes else None)
    monkeypatch.setattr(publish, "push", lambda c, ref, host: pushes.append(ref) or pushed)
    monkeypatch.setattr(publish, "attest", lambda *a: pytest.fail("attested a digest that was not checked"))
    return pushes


def test_publish_refuses_an_image_built_for_another_tag_before_any_push(entry, monkeypatch):
    pushes = stub_publish(monkeypatch, entry, {**render.facts(entry), "tag": "cu999-other"}, IMG, IMG)
    with pytest.raises(StepFailed, match="refusing to publish: the image is not the entry's: tag: "):
        publish.publish_one(entry, publish.Options(registry="reg.example", date="20261202"), None)
    assert pushes == []


def test_the_alias_never_moves_to_a_digest_the_registry_claims_but_was_not_pushed(entry, monkeypatch):
    pushes = stub_publish(monkeypatch, entry, render.facts(entry), pushed=IMG, served=OTHER)
    with pytest.raises(StepFailed, match="the alias was not moved"):
        publish.publish_one(entry, publish.Options(registry="reg.example", date="20261202"), None)
    assert len(pushes) == 1 and not pushes[0].endswith(f":{entry.tag}")


def answer(body: bytes, **headers) -> web.Answer:
    return web.Answer(200, {"Content-Type": "application/vnd.docker.distribution.manifest.list.v2+json",
                            "Content-Length": "1", **headers}, body, "https://reg.example/")


def test_the_attestation_subject_comes_from_the_pushed_bytes_and_lying_headers_move_nothing(monkeypatch):
    raw = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"})
    digest = "sha256:" + hashlib.sha256(raw.encode()).hexdigest()
    honest = {"Content-Type": "application/vnd.docker.distribution.manifest.v2+json", "Content-Length": str(len(raw))}
    monkeypatch.setattr(registry, "call", lambda *a, **k: answer(raw.encode(), **honest))
    repo = registry.Repository("reg.example", "train")
    assert registry.checked_descriptor(repo, digest) == {
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": digest, "size": len(raw)}
    for lie in ({"Content-Length": "1"}, {"Content-Type": "application/vnd.docker.distribution.manifest.list.v2+json"},
                {"Docker-Content-Digest": "sha256:" + "0" * 64}):
        monkeypatch.setattr(registry, "call", lambda *a, lie=lie, **k: answer(raw.encode(), **{**honest, **lie}))
        with pytest.raises(registry.BadAnswer, match="contradict") as caught:
            registry.checked_descriptor(repo, digest)
        assert caught.value.exit_code == 1, "the registry is at fault, not this machine"
    monkeypatch.setattr(registry, "call", lambda *a, **k: answer(b'{"other": "manifest"}', **honest))
    with pytest.raises(StepFailed, match=f"not {digest}"):
        registry.checked_descriptor(repo, digest)


@pytest.mark.parametrize("types, said", [
    (["application/vnd.oci.image.layer.v1.tar+zstd"] * 2, "zstd"),
    (["application/vnd.docker.image.rootfs.diff.tar.gzip", "application/vnd.oci.image.layer.v1.tar+gzip"], "gzip"),
    (["application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar+zstd"], "mixed"),
    (["application/vnd.oci.image.layer.v1.tar"], "unknown"), ([], "unknown"), ([7], "unknown")])
def test_publish_reports_the_layers_compression_as_the_registry_serves_them(types, said):
    """What decides which clients can pull (zstd: Docker >= 23, containerd >= 1.5), read from the served manifest;
    anything it cannot tell is "unknown", never a guess."""
    layers = [{"mediaType": t} if isinstance(t, str) else t for t in types]
    assert publish.layer_compression(({"layers": layers}, "", "")) == said
    assert publish.layer_compression(None) == "unknown"
    assert publish.layer_compression(({"manifests": [{"mediaType": "x"}]}, "", "")) == "unknown"


def test_publish_attaches_buildkits_provenance_only_for_the_pushed_digest(tmp_path):
    """The statement build kept is attached when its subject is what was pushed; another image's, a missing or
    damaged file, or a build that kept none (Docker 20.10) attach nothing."""
    kept = tmp_path / "t.buildkit.intoto.json"
    kept.write_text(json.dumps(buildkit_statement(IMG)[1]))
    assert publish.buildkit_statement({"buildkit_provenance": str(kept)}, IMG) == buildkit_statement(IMG)[1]
    assert publish.buildkit_statement({"buildkit_provenance": str(kept)}, OTHER) is None
    assert publish.buildkit_statement({"buildkit_provenance": None}, IMG) is None
    assert publish.buildkit_statement({}, IMG) is None and publish.buildkit_statement(None, IMG) is None
    assert publish.buildkit_statement({"buildkit_provenance": str(tmp_path / "gone.json")}, IMG) is None
    kept.write_text("{not json")
    assert publish.buildkit_statement({"buildkit_provenance": str(kept)}, IMG) is None


def test_the_compression_of_an_index_is_that_of_its_amd64_image(monkeypatch):
    """An engine that attaches its own attestations pushes an index: its linux/amd64 image's layers are what a
    node pulls (the attestation manifests have no layers worth naming)."""
    child = "sha256:" + "12" * 32
    served = {IMG: {"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
                  {"digest": "sha256:" + "34" * 32, "platform": {"architecture": "unknown", "os": "unknown"}},
                  {"digest": child, "platform": {"architecture": "amd64", "os": "linux"}}]},
              child: {"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"}]}}
    monkeypatch.setattr(registry, "manifest", lambda repo, ref, config=None: (served[ref], "", ref) if ref in served
                        else None)
    repo = registry.Repository("reg.example", "t")
    assert publish.served_compression(repo, IMG, None, 1) == "gzip"
    assert publish.served_compression(repo, child, None, 1) == "gzip"
    del served[child]
    assert publish.served_compression(repo, IMG, None, 1) == "unknown"
