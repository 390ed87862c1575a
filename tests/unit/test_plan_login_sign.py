"""`builder plan` per event, `builder login`'s Docker config, and the signer flags of `verify` (no network here:
the registry-reading paths run against a real registry in tests/workflow and tests/integration)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from types import SimpleNamespace

import pytest

from builder import cli
from builder.boundary import cosign
from builder.errors import UserError
from builder.model import plan as plan_model
from builder.steps import plan, verify


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """`python -m builder ARGV` in this process (unit tests start no process): stdin, environment, exit code."""

    def run(*argv: str, input: str = "", env: dict | None = None) -> SimpleNamespace:
        monkeypatch.setattr(sys, "stdin", io.StringIO(input))
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def test_pull_request_and_schedule_plan_every_entry_without_reading_a_registry(project):
    from builder.model import matrix

    m = matrix.load(project / "matrix.yaml")
    for event in ("pull_request", "schedule"):
        # An unreachable registry: any read would be logged as "cannot read"; none is made.
        got = plan.planned(m, plan.Options(event=event, registry="127.0.0.1:9"))
        assert [e.tag for e in got] == [e.tag for e in m.entries]


def test_plan_writes_github_outputs_split_by_runner(project, tmp_path, run_cli):
    out = tmp_path / "out"
    proc = run_cli("--matrix", str(project / "matrix.yaml"), "plan", "--event", "pull_request", "--github-output",
                   str(out))
    assert proc.returncode == 0, proc.stderr
    found = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert set(found) == {"hosted", "gpu"}
    assert all("include" in json.loads(v) for v in found.values())


@pytest.mark.parametrize("variable", ["", "false", "TRUE", "true"])
def test_gpu_entries_are_planned_only_where_the_repository_has_gpu_runners(project, tmp_path, run_cli, variable):
    """A fresh fork (no GPU_RUNNERS variable) gets no GPU job that would wait a day for a runner it lacks; each
    entry left out is named. `--gpu-runners` / `--no-gpu-runners` override the variable."""
    from builder.model import matrix

    m = matrix.load(project / "matrix.yaml")
    gpu = [e.tag for e in m.entries if plan_model.needs_gpu_gate(e)]
    hosted = [e.tag for e in m.entries if not plan_model.needs_gpu_gate(e)]
    assert gpu and hosted, "the project matrix has both kinds"
    out = tmp_path / "out"
    proc = run_cli("--matrix", str(project / "matrix.yaml"), "plan", "--event", "pull_request", "--github-output",
                   str(out), env={"GPU_RUNNERS": variable})
    assert proc.returncode == 0, proc.stderr
    found = {k: [i["tag"] for i in json.loads(v)["include"]]
             for k, v in (line.split("=", 1) for line in out.read_text().splitlines())}
    enabled = variable.lower() == "true"
    assert found == {"hosted": hosted, "gpu": gpu if enabled else []}
    for tag in gpu:
        assert (f"{tag}: gated on a GPU runner" in proc.stderr) is not enabled
    flag = "--no-gpu-runners" if enabled else "--gpu-runners"
    out.unlink()
    proc = run_cli("--matrix", str(project / "matrix.yaml"), "plan", "--event", "pull_request", flag,
                   "--github-output", str(out), env={"GPU_RUNNERS": variable})
    flipped = json.loads(dict(line.split("=", 1) for line in out.read_text().splitlines())["gpu"])["include"]
    assert [i["tag"] for i in flipped] == ([] if enabled else gpu)


def test_default_registry_is_the_variable_else_the_owners_ghcr(monkeypatch):
    assert plan_model.default_registry({"REGISTRY": "reg.example/x", "GITHUB_REPOSITORY_OWNER": "A"}) == "reg.example/x"
    assert plan_model.default_registry({"GITHUB_REPOSITORY_OWNER": "AcMe"}) == "ghcr.io/acme"
    with pytest.raises(UserError, match="--registry"):
        plan_model.default_registry({})


def test_login_writes_a_private_docker_config_and_keeps_other_entries(tmp_path, run_cli):
    config = tmp_path / "docker"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"auths": {"other.example": {"auth": "eDp5"}}}))
    env = dict(os.environ, DOCKER_CONFIG=str(config), GITHUB_OUTPUT=str(tmp_path / "out"))
    proc = run_cli("login", "--registry", "reg.example:5000/acme", "--username", "ci", "--password-stdin",
                   input="s3cret\n", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((config / "config.json").read_text())
    assert set(data["auths"]) == {"other.example", "reg.example:5000"}
    assert stat.S_IMODE((config / "config.json").stat().st_mode) == 0o600
    assert "s3cret" not in proc.stdout + proc.stderr
    assert (tmp_path / "out").read_text() == "registry=reg.example:5000/acme\n"


def test_login_refuses_an_empty_password(tmp_path, run_cli):
    proc = run_cli("login", "--registry", "reg.example", "--username", "ci", "--password-stdin", input="",
                   env=dict(os.environ, DOCKER_CONFIG=str(tmp_path)))
    assert proc.returncode == 2 and "nothing on stdin" in proc.stderr


@pytest.mark.parametrize("flags, message", [
    ({"require_signature": True}, "--certificate-identity"),
    ({"signatures_only": True}, "--key PATH"),
    ({"key": "k.pub", "certificate_identity": "x"}, "not both"),
    ({"key": "/nonexistent/cosign.pub"}, "no such file"),
])
def test_verify_needs_exactly_one_signer_when_signatures_matter(flags, message):
    with pytest.raises(UserError, match=message):
        verify.signer(verify.Options(image="r.example/x@sha256:" + "0" * 64, **flags))


def test_keyless_signer_is_the_exact_identity_and_github_issuer():
    identity = verify.signer(verify.Options(image="x", certificate_identity="https://github.com/a/b/.github/"
                                            "workflows/images.yml@refs/heads/main"))
    assert identity.issuer == cosign.GITHUB_ISSUER == "https://token.actions.githubusercontent.com"
    assert verify.signer(verify.Options(image="x")) is None


def test_sign_needs_an_immutable_reference():
    with pytest.raises(UserError, match="HOST/NAME@sha256"):
        cosign.split_reference("reg.example/team/train:latest")


def test_sign_takes_the_digest_publish_reported(project):
    from builder import reports
    from builder.steps import sign

    with pytest.raises(UserError, match="no published image"):
        sign.target_reference("cu121-torch2.3")
    digest = "sha256:" + "a" * 64
    reports.write("cu121-torch2.3", "publish", {
        "result": "published", "image_id": "sha256:" + "b" * 64, "registry": "reg.example/team",
        "repository": "reg.example/team/train", "full_tag": "cu121-torch2.3-x", "alias": "cu121-torch2.3",
        "digest": digest, "pull": f"reg.example/team/train@{digest}", "published_at": "2026-12-02T15:40:00Z"})
    assert sign.target_reference("cu121-torch2.3") == f"reg.example/team/train@{digest}"
    assert sign.target_reference("r.example/x@" + digest) == "r.example/x@" + digest  # a reference as given
