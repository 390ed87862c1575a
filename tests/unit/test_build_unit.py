"""Build-step logic that needs no engine: failure explanations, secret handling, exit codes."""

from __future__ import annotations

import json
import os
import re

import pytest

from builder import log
from builder.boundary import buildkit, engine
from builder.model import attestations, context
from builder.model.inputs import Inputs
from tests.conftest import ROOT, run_cli

REAL_SDK = engine.sdk  # taken before the autouse guard replaces it for every test

SAMPLES = {
    "write /opt/venv/x: no space left on device": "the disk is full",
    ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.\n"
     "    peft==0.21.2 from https://files/peft.whl:\n        Expected sha256 abc"): "lock hash: peft==0.21.2",
    "E: Version '3.11.2-6+deb12u8' for 'python3.11' was not found": "apt: version 3.11.2-6+deb12u8 of python3.11",
    ("failed to solve: failed to resolve source metadata for docker.io/library/debian:bookworm-slim@sha256:3783: "
     "dial tcp: lookup registry-1.docker.io"): "the base image cannot be pulled",
    "ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED]": "TLS verification failed",
    "ERROR: ResolutionImpossible: for help visit": "pip found a conflict",
}


@pytest.mark.parametrize("output, expected", SAMPLES.items(), ids=range(len(SAMPLES)))
def test_failures_are_explained(output, expected):
    message, hint, environmental = buildkit.explain_failure("#12 12.3 " + output + "\n")
    assert expected in message
    assert hint
    # Only a full disk or an unreachable base is the machine's fault (exit 3); the rest is a failed build.
    assert environmental == (expected in ("the disk is full", "the base image cannot be pulled"))


def test_unknown_failure_shows_the_tail():
    message, _, environmental = buildkit.explain_failure("step 1\nstep 2\nsomething odd happened\n")
    assert not environmental
    assert "something odd happened" in message


def _spec(tmp_path, **changes) -> buildkit.BuildSpec:
    from builder.model import matrix

    entry = matrix.load(ROOT / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    fields = dict(entry=entry, context=tmp_path, ref="example/train:t", base_ref="debian:bookworm-slim",
                  base_substituted=True, base_id="sha256:" + "1" * 64, epoch=1700000000)
    return buildkit.BuildSpec(**{**fields, **changes})


def test_secrets_go_to_files_never_argv(monkeypatch, tmp_path):
    token = "https://user:s3cr3t-token@index.example/simple"
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(buildkit.engine, "client", lambda: buildkit.engine.Client("/usr/bin/docker", "legacy"))
    inputs = Inputs(ca_bundle=str(bundle)).resolved(environ={"PIP_INDEX_URL": token})
    values = inputs.secret_values
    with buildkit.secret_files(inputs) as secrets:
        assert values == [token]
        argv = buildkit.argv(_spec(tmp_path), secrets, {"io.train-images.tag": "t"})
        secret_file = secrets["pip_index_url"]
        assert open(secret_file).read() == token and oct(os.stat(secret_file).st_mode)[-3:] == "600"
    assert not os.path.exists(secret_file), "secret files are removed after the build"
    text = " ".join(argv)
    assert "s3cr3t" not in text and "--build-arg PIP_INDEX_URL" not in text
    assert f"id=pip_cert,src={bundle}" in text and "id=pip_index_url,src=" in text
    assert log.command_line(argv + [token], values).count("****") == 1


def test_missing_ca_bundle_is_a_user_error(monkeypatch):
    from builder.errors import UserError

    with pytest.raises(UserError, match="does not exist"):
        Inputs(ca_bundle="/nonexistent/ca.pem").resolved(environ={})
    with pytest.raises(UserError, match="does not exist"):
        Inputs().resolved(environ={"SSL_CERT_FILE": "/nonexistent/ca.pem"})


def test_context_hash_covers_content_and_mode(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_text("2")
    first = context.digest(tmp_path)
    assert context.digest(tmp_path) == first
    (tmp_path / "sub" / "b").write_text("3")
    second = context.digest(tmp_path)
    assert second != first
    os.chmod(tmp_path / "a", 0o755)
    assert context.digest(tmp_path) != second


@pytest.mark.parametrize("change", [
    {"base_ref": "mirror.example/debian:bookworm-slim"},          # --base-image
    {"base_id": "sha256:" + "2" * 64},                           # another local copy under the same name
    {"build_args": {"APT_MIRROR": "http://mirror.example/debian"}},  # --apt-mirror
], ids=["base-ref", "base-id", "apt-mirror"])
def test_input_hash_changes_with_every_build_flag(tmp_path, change):
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    assert buildkit.input_hash(_spec(tmp_path, **change)) != buildkit.input_hash(_spec(tmp_path))


def test_a_new_commit_of_the_same_inputs_rebuilds_nothing(tmp_path, monkeypatch):
    """The commit date is a label, not a build argument: the layers (torch, the ops stage) survive commits."""
    monkeypatch.setattr(buildkit.engine, "client", lambda: buildkit.engine.Client("/usr/bin/docker", "legacy"))
    monkeypatch.setattr(buildkit.git, "revision", lambda paths: "a94488e")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    newer = _spec(tmp_path, epoch=1700000001)
    assert buildkit.input_hash(newer) == buildkit.input_hash(_spec(tmp_path))
    argv = " ".join(buildkit.argv(newer, {}, buildkit.labels(newer, _facts(), "d")))
    assert "SOURCE_DATE_EPOCH" not in argv
    assert "org.opencontainers.image.created=2023-11-14T22:13:21Z" in argv


def _facts() -> dict:
    return {"python": "3.11", "cuda": "13.0", "min_driver": "580", "pins": {"torch": "2.13.0"}}


def test_input_hash_changes_with_the_builder_version(tmp_path, monkeypatch):
    import builder

    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    before = buildkit.input_hash(_spec(tmp_path))
    monkeypatch.setattr(builder, "__version__", builder.__version__ + ".1")
    assert buildkit.input_hash(_spec(tmp_path)) != before


def test_no_engine_is_exit_3_with_how_to_start(project, monkeypatch, capsys):
    """The SDK finds no engine at DOCKER_HOST (here: its own error, as docker raises it without a socket)."""
    import docker

    def from_env(**_kwargs):
        raise docker.errors.DockerException("Error while fetching server API version: ('Connection aborted.', "
                                            "FileNotFoundError(2, 'No such file or directory'))")

    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/nothing.sock")
    monkeypatch.setattr(docker, "from_env", from_env)
    monkeypatch.setattr(engine, "sdk", REAL_SDK)
    assert run_cli("build", "cu130-torch2.13-bookworm") == 3
    err = capsys.readouterr().err
    assert "no Docker engine answers at unix:///tmp/nothing.sock" in err and "dockerd" in err
    assert "Traceback" not in err


def test_build_without_tags_is_a_user_error(project, capsys):
    assert run_cli("build") == 2 and "pass --all" in capsys.readouterr().err


def test_a_build_that_lost_its_buildkit_session_runs_once_more(monkeypatch, tmp_path, capsys):
    """moby/buildkit#6422: on a loaded machine BuildKit can lose the client session mid-build; one retry, said."""
    from types import SimpleNamespace

    outputs = iter([(1, "#22 ERROR: no active session for x1u2: context deadline exceeded\n"), (0, "done\n")])
    calls = []

    def run_cli(argv, mask=()):
        calls.append(argv)
        code, out = next(outputs)
        return SimpleNamespace(returncode=code, stdout=out, shown="docker build …")

    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "legacy"))
    monkeypatch.setattr(engine, "run_cli", run_cli)
    code, output, _ = buildkit.run(_spec(tmp_path), {}, Inputs())
    assert (code, output, len(calls)) == (0, "done\n", 2)
    assert "lost this build's client session" in capsys.readouterr().err


def test_any_other_build_failure_is_not_retried(monkeypatch, tmp_path):
    from types import SimpleNamespace

    calls = []

    def run_cli(argv, mask=()):
        calls.append(argv)
        return SimpleNamespace(returncode=1, stdout="E: Unable to locate package nope\n", shown="docker build …")

    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "legacy"))
    monkeypatch.setattr(engine, "run_cli", run_cli)
    assert buildkit.run(_spec(tmp_path), {}, Inputs())[0] == 1 and len(calls) == 1


@pytest.mark.parametrize("ref", ["ghcr.io/acme/cache:t,type=local,dest=/tmp/x", "ghcr.io/acme/cache@sha256:" + "a" * 64,
                                 "Ghcr.io/ACME/Cache", "cache ref", ""])
def test_a_cache_ref_that_is_not_a_plain_reference_is_exit_2_before_any_engine(project, capsys, ref):
    """`--cache-ref` lands inside `--cache-from type=registry,ref=…`: a comma would smuggle in cache options."""
    assert run_cli("build", "cu130-torch2.13-bookworm", "--cache-ref", ref) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --cache-ref") and "Traceback" not in err
    assert [line.split(":")[0] for line in err.strip().splitlines()] == ["error", "hint"]


# --- the registry build cache: probed, never assumed -------------------------------------------------------

PROBES = {  # (buildx inspect, the engine's DriverStatus) -> what the builder can do with a registry cache
    ("Name: ci\nDriver: docker-container\n", ""): "registry",
    ("Name: default\nDriver: docker\n", '[["driver-type","io.containerd.snapshotter.v1"]]'): "registry",
    ("Name: default\nDriver: docker\n", '[["Backing Filesystem","extfs"],["Supports d_type","true"]]'): "read",
    ("", ""): "read",  # buildx there, but `inspect` failed: assume nothing beyond reading
}


@pytest.mark.parametrize("answers, mode", PROBES.items(), ids=range(len(PROBES)))
def test_the_cache_the_builder_uses_is_what_its_driver_supports(monkeypatch, answers, mode):
    inspect, info = answers
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    monkeypatch.setattr(buildkit, "_probe", lambda argv: inspect)
    monkeypatch.setattr(engine, "info", lambda: {"DriverStatus": json.loads(info) if info else None})
    buildkit.cache_support.cache_clear()
    try:
        support = buildkit.cache_support()
    finally:
        buildkit.cache_support.cache_clear()
    assert support.mode == mode
    flags = buildkit.cache_flags("ghcr.io/acme/cache:t", support.mode)
    assert flags[:2] == ["--cache-from", "type=registry,ref=ghcr.io/acme/cache:t"]
    # Exporting with the classic `docker` driver fails the whole build, so it is asked for only where it works.
    assert ("--cache-to" in flags) == (mode == "registry")
    assert (support.why == "") == (mode == "registry")


def test_a_legacy_client_uses_no_registry_cache_and_build_says_so_once(project, monkeypatch, capsys):
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "legacy"))
    buildkit.cache_support.cache_clear()
    try:
        assert buildkit.cache_support().mode == "none"
        assert buildkit.cache_flags("ghcr.io/acme/cache:t", "none") == []
        from builder.steps import build
        monkeypatch.setattr(engine, "sdk", lambda: None)
        build.prepare([], build.Options(cache_ref="ghcr.io/acme/cache:t"))
    finally:
        buildkit.cache_support.cache_clear()
    err = capsys.readouterr().err
    assert err.count("--cache-ref ghcr.io/acme/cache:t: not used: /usr/bin/docker has no buildx") == 1


@pytest.mark.parametrize("server, mode, rewrites", [("26.1.5+dfsg1", "buildx", True), ("28.0.1", "buildx", True),
                                                    ("25.0.3", "buildx", False), ("20.10.24", "legacy", False),
                                                    ("26.1.5", "legacy", False), ("banana", "buildx", False)])
def test_file_times_are_rewritten_only_where_the_engine_can(monkeypatch, server, mode, rewrites):
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", mode))
    monkeypatch.setattr(engine, "info", lambda: {"ServerVersion": server})
    assert engine.rewrites_timestamps() is rewrites


def test_a_dating_build_exports_into_the_store_with_the_dockerfiles_epoch_and_keeps_its_input_hash(
        monkeypatch, tmp_path):
    """Same inputs, same image digest: the config is dated with the epoch the Dockerfile fixes (its steps date the
    files), the engine's own exporter writes the image into the containerd store as built (no archive, no load),
    and no attestation goes into it. The input hash does not move: file contents are what it covers."""
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    plain, dating = _spec(tmp_path), _spec(tmp_path, rewrite_timestamps=True, image_store="containerd")
    argv = buildkit.argv(dating, {}, {}, metadata=tmp_path / "metadata.json")
    assert argv[:5] == ["/usr/bin/docker", "buildx", "build", "--output",
                        "type=image,name=example/train:t,"
                        "compression=zstd,compression-level=3,force-compression=true,oci-mediatypes=true"]
    assert "--provenance=false" in argv and "--load" not in argv and "rewrite-timestamp" not in " ".join(argv)
    assert f"SOURCE_DATE_EPOCH={buildkit.ZIP_EPOCH}" in argv
    assert argv[argv.index("--metadata-file") + 1] == str(tmp_path / "metadata.json")  # BuildKit's provenance
    assert buildkit.argv(plain, {}, {})[:4] == ["/usr/bin/docker", "buildx", "build", "--load"]
    assert "--output" not in buildkit.argv(plain, {}, {}) and "SOURCE_DATE_EPOCH" not in " ".join(
        buildkit.argv(plain, {}, {}))
    # a classic store (an engine >= 26 without the containerd store) loads as always, dated all the same
    classic = buildkit.argv(_spec(tmp_path, rewrite_timestamps=True, image_store="classic"), {}, {})
    assert classic[:4] == ["/usr/bin/docker", "buildx", "build", "--load"] and "--provenance=false" in classic
    assert buildkit.input_hash(plain) == buildkit.input_hash(dating)
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "legacy"))
    assert "--metadata-file" not in buildkit.argv(plain, {}, {}, metadata=tmp_path / "m.json")  # 20.10: no buildx


@pytest.mark.parametrize("rewrite, store, asked, layers", [
    (True, "containerd", "zstd", "zstd"), (True, "containerd", "gzip", "gzip"), (True, "classic", "zstd", "gzip"),
    (False, "containerd", "zstd", "gzip"), (False, "classic", "gzip", "gzip")])
def test_layers_are_compressed_as_asked_where_the_build_writes_them_and_the_cache_alike(
        monkeypatch, tmp_path, rewrite, store, asked, layers):
    """zstd only where the build writes the image itself into a store that keeps it so (a classic store, e.g.
    GitHub's runners, decompresses on load and pushes gzip); elsewhere the engine's gzip. The registry cache
    holds the same compression, and the choice never moves the input hash (it is not content)."""
    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    monkeypatch.setattr(buildkit, "cache_support", lambda: buildkit.CacheSupport("registry", ""))
    spec = _spec(tmp_path, rewrite_timestamps=rewrite, compression=asked, cache_ref="127.0.0.1:5000/cache:t",
                 image_store=store)
    assert buildkit.layer_compression(spec) == layers
    argv = buildkit.argv(spec, {}, {})
    cache_to = argv[argv.index("--cache-to") + 1]
    assert f"compression={layers}" in cache_to and cache_to.startswith("type=registry,ref=127.0.0.1:5000/cache:t,")
    if rewrite and store == "containerd":
        assert f"compression={asked}" in argv[argv.index("--output") + 1]
    else:
        assert "--load" in argv and "--output" not in argv
    assert ("force-compression=true" in cache_to) is (layers == "zstd")
    assert buildkit.input_hash(spec) == buildkit.input_hash(_spec(tmp_path))


def test_the_exporters_epoch_is_the_one_every_dockerfile_fixes():
    for dockerfile in (ROOT / "dockerfiles").glob("*/Dockerfile"):
        epochs = set(re.findall(r"^ARG SOURCE_DATE_EPOCH=(\d+)$", dockerfile.read_text(), re.M))
        assert epochs == {str(buildkit.ZIP_EPOCH)}, dockerfile


PREDICATE = {"buildType": "https://mobyproject.org/buildkit@v1", "invocation": {"parameters": {}}}
DIGEST = "sha256:" + "c" * 64


@pytest.mark.parametrize("build_code, written", [
    (0, {"buildx.build.provenance": PREDICATE, "containerimage.digest": DIGEST}),  # buildx >= 0.14
    (0, {"containerimage.digest": DIGEST}),  # buildx 0.13: no provenance in the file
    (0, None),  # no file at all (legacy builds)
    (0, {"buildx.build.provenance": PREDICATE, "containerimage.digest": "sha256:short"}),
    (1, {"buildx.build.provenance": PREDICATE, "containerimage.digest": DIGEST})])
def test_buildkits_provenance_comes_from_the_metadata_file_of_a_build_that_succeeded(
        monkeypatch, tmp_path, build_code, written):
    from types import SimpleNamespace

    calls = []

    def run_cli(argv, mask=()):
        calls.append(argv)
        if written is not None:
            open(argv[argv.index("--metadata-file") + 1], "w").write(json.dumps(written))
        return SimpleNamespace(returncode=build_code, stdout="built\n", shown="docker buildx build …")

    monkeypatch.setattr(engine, "client", lambda: engine.Client("/usr/bin/docker", "buildx"))
    monkeypatch.setattr(engine, "run_cli", run_cli)
    kept = tmp_path / "prov" / "t.json"
    kept.parent.mkdir()
    kept.write_text("a previous build's")
    code, output, _ = buildkit.run(_spec(tmp_path, rewrite_timestamps=True, image_store="containerd"), {}, Inputs(),
                                   provenance=kept)
    assert code == build_code and len(calls) == 1 and output == "built\n"  # nothing archived, nothing loaded
    usable = build_code == 0 and written is not None and "buildx.build.provenance" in written \
        and written["containerimage.digest"] == DIGEST
    if usable:  # the statement BuildKit would attach: SLSA v0.2 about the image manifest the build wrote
        statement = json.loads(kept.read_text())
        assert statement["predicate"] == PREDICATE and statement["subject"][0]["digest"] == {"sha256": "c" * 64}
        assert attestations.buildkit_binding(statement, DIGEST) is None
    else:  # a failed build, or none reported: the last image's statement stays as it was
        assert kept.read_text() == "a previous build's"
    metadata = calls[0][calls[0].index("--metadata-file") + 1]
    assert not os.path.exists(os.path.dirname(metadata)), "the scratch directory goes with the build"


@pytest.mark.parametrize("fails", [False, True])
def test_the_image_a_build_replaces_is_named_only_while_the_build_runs(monkeypatch, capsys, fails):
    """The containerd store deletes a replaced image at once: the size budget needs it named until it has
    compared; afterwards only that name goes (never the image by ID), even when the build failed, and a name
    that cannot be removed is a warning, not a second error over the build's own."""
    from types import SimpleNamespace

    events = []
    old = SimpleNamespace(id="sha256:" + "a" * 64, tag=lambda repo, tag: events.append(("tag", f"{repo}:{tag}")))

    def remove(ref):
        events.append(("remove", ref))
        if fails:
            raise RuntimeError("engine gone")

    monkeypatch.setattr(engine, "image_or_none", lambda ref: old if ref == "r/x:t" else None)
    monkeypatch.setattr(engine, "sdk", lambda: SimpleNamespace(images=SimpleNamespace(remove=remove)))
    with pytest.raises(KeyError), engine.holding("r/x:t", "r/x:t-previous"):
        events.append(("build",))
        raise KeyError("the build failed")
    assert events == [("tag", "r/x:t-previous"), ("build",), ("remove", "r/x:t-previous")]
    assert ("the name r/x:t-previous was left" in capsys.readouterr().err) is fails
    events.clear()
    with engine.holding("r/y:t", "r/y:t-previous"):  # no image yet: nothing named, nothing removed
        events.append(("build",))
    assert events == [("build",)]


def test_a_build_reported_done_with_no_image_behind_it_is_one_line_not_image_not_found(monkeypatch):
    """The engine (or the exporter) says the build finished, yet no image has the name: build and repro read the
    image through engine.built_image, which says so in one line (exit 3: this engine is not behaving as one)."""
    from builder.errors import EnvironmentProblem

    monkeypatch.setattr(engine, "image_or_none", lambda ref: None)
    with pytest.raises(EnvironmentProblem) as caught:
        engine.built_image("ghcr.io/x/train:t")
    assert "reported the build of ghcr.io/x/train:t done" in caught.value.message
    assert "\n" not in caught.value.message and caught.value.exit_code == 3
    here = object()
    monkeypatch.setattr(engine, "image_or_none", lambda ref: here)
    assert engine.built_image("ghcr.io/x/train:t") is here
