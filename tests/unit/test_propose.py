"""`propose`: the entry derived from PyPI's shapes (project JSON, core metadata), the text edit of matrix.yaml, and
the verb's outcomes (proposed, nothing new, rejected by a rule, PyPI unreachable, bad input), with PyPI served from
fixtures at the web boundary. The run against the real PyPI is tests/integration/test_propose_pypi.py."""

from __future__ import annotations

import json
import re

import pytest

from builder.boundary import pypi, web
from builder.model import matrix, proposal
from tests.conftest import VALID_MATRIX, run_cli

# The CI entry at torch 2.12 (compat.yaml knows 2.13, so a proposal for 2.13 passes every rule).
OLDER = VALID_MATRIX.replace("cu130-torch2.13-bookworm", "cu130-torch2.12-bookworm").replace(
    "torch: 2.13.0", "torch: 2.12.0") + "\n# the last line: a top-level comment after the entries stays last\n"
CUDA_13_0 = 'cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == "Linux"'
CUDNN = 'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"'


def wheel(version: str, py: str = "cp311", platform: str = "manylinux_2_28_x86_64", yanked: bool = False) -> dict:
    name = f"torch-{version}-{py}-{py}-{platform}.whl"
    return {"filename": name, "url": f"../../packages/xx/{name}", "yanked": yanked}


def torch_project(newest: str = "2.13.1", requires: tuple = (CUDA_13_0, CUDNN), **extra) -> dict:
    releases = {"2.12.0": [wheel("2.12.0")], newest: [wheel(newest, py) for py in ("cp311", "cp312", "cp313")],
                "2.99.0rc1": [wheel("2.99.0rc1")], "2.98.0": [wheel("2.98.0", yanked=True)], "2.97.0": [], **extra}
    return {"info": {"version": newest, "requires_dist": list(requires)}, "releases": releases}


def project_json(*versions: str) -> dict:
    return {"info": {"version": versions[-1]}, "releases": {v: [{"filename": "x.whl", "yanked": False}]
                                                             for v in versions}}


STACK = {"transformers": project_json("5.24.0", "5.25.0", "6.0.0.dev0"), "deepspeed": project_json("0.19.8"),
         "peft": project_json("0.21.2"), "accelerate": project_json("1.16.0", "1.17.0"),
         "nvidia-ml-py": project_json("13.615.71")}


class FakePyPI:
    """Serves fixture JSON in place of PyPI's API; wheel metadata (PEP 658) is missing, as it is for new torch."""

    def __init__(self, torch: dict):
        self.projects = {"torch": torch, **STACK}

    def __call__(self, url: str, **_kwargs) -> bytes:
        for name, data in self.projects.items():
            if url == pypi.JSON_URL.format(name=name):
                return json.dumps(data).encode()
        raise web.Failed(url, "HTTP 404 Not Found", 404)


def entries_of(text: str) -> list[str]:
    return re.findall(r"^  - tag: (\S+)", text, re.M)


# --- what PyPI says ---------------------------------------------------------------------------------------


def test_newest_is_the_newest_final_release_with_a_file_not_yanked():
    assert proposal.newest(torch_project()["releases"]) == "2.13.1"
    assert proposal.newest({"1.0rc1": [wheel("1.0rc1")]}) is None


def test_the_cuda_line_comes_from_the_newest_releases_metadata():
    facts = proposal.torch_release(torch_project())
    assert facts == {"release": "2.13.1", "python": ">=3.11,<3.14", "cxx11abi": True, "pypi_cuda": "13.0",
                     "cudnn": 9}
    # The project JSON's `info` describes another release: its requirements say nothing about this one.
    other = torch_project()
    other["info"]["version"] = "2.12.0"
    assert "pypi_cuda" not in proposal.torch_release(other)
    # Core metadata fetched for the release wins over `info`.
    metadata = "Requires-Dist: cuda-toolkit[cudart]==13.2.2\nRequires-Dist: nvidia-cudnn-cu13==9.26.0.51\n"
    assert proposal.torch_release(torch_project(requires=()), metadata)["pypi_cuda"] == "13.2"


# --- the entry --------------------------------------------------------------------------------------------


def test_tag_keeps_the_templates_scheme():
    assert proposal.tag_for("cu130-torch2.13-bookworm", "13.2", "2.15.0") == "cu132-torch2.15-bookworm"
    assert proposal.tag_for("cu124-torch2.6", "13.0", "2.15.1") == "cu130-torch2.15"


def test_the_proposal_is_shaped_like_the_newest_ci_entry(tmp_path):
    (tmp_path / "matrix.yaml").write_text(OLDER)
    m = matrix.load(tmp_path / "matrix.yaml")
    template = proposal.template(m)
    assert template.tag == "cu130-torch2.12-bookworm"
    stack = {"transformers": "5.25.0", "deepspeed": "0.19.8", "peft": "0.21.2", "accelerate": "1.17.0",
             "nvidia-ml-py": "13.615.71"}
    p = proposal.derive(template, proposal.torch_release(torch_project()), stack)
    assert p.tag == "cu130-torch2.13-bookworm" and proposal.already(m, p) is None
    assert list(p.fields) == ["tag", "base", "base_source", "python", "cuda", "torch", "transformers", "deepspeed",
                              "peft", "accelerate", "nvidia-ml-py", "runner", "ci"]
    assert p.fields["base"] == template.base and p.fields["python"] == "3.11" and p.fields["cuda"] == "13.0"
    assert p.fields["runner"] == ["ubuntu-latest"] and p.fields["ci"] is False  # hosted: the PR builds and gates it
    text = p.text(["proposed"])
    assert text.startswith(f"  # proposed\n  - tag: cu130-torch2.13-bookworm\n    base: {template.base}\n")
    assert '    python: "3.11"\n    cuda: "13.0"\n    torch: 2.13.1\n' in text and "    ci: false\n" in text


def test_flash_attn_only_where_compat_lists_a_prebuilt_wheel(tmp_path):
    (tmp_path / "matrix.yaml").write_text(OLDER)
    template = proposal.template(matrix.load(tmp_path / "matrix.yaml"))
    stack = {p: template.pins[p] for p in proposal.STACK}
    base = template.base.replace("debian:bookworm-slim", "nvidia/cuda:12.8.1-runtime-ubuntu24.04")
    torch28 = {"release": "2.8.0", "python": ">=3.9,<3.14", "cxx11abi": True, "pypi_cuda": "12.8", "cudnn": 9}
    from dataclasses import replace
    p = proposal.derive(replace(template, base=base, python="3.12"), torch28, stack)
    assert p.fields["flash-attn"] == "2.8.3.post1"  # newest release with a torch 2.8 CUDA 12 cp312 wheel
    assert "flash-attn" not in proposal.derive(template, proposal.torch_release(torch_project()), stack).fields


def test_no_cuda_build_named_is_not_proposable(tmp_path):
    (tmp_path / "matrix.yaml").write_text(OLDER)
    template = proposal.template(matrix.load(tmp_path / "matrix.yaml"))
    with pytest.raises(proposal.NotProposable, match="names no CUDA build"):
        proposal.derive(template, proposal.torch_release(torch_project(requires=())), {})


def test_append_keeps_every_line_and_lands_before_what_follows_the_entries():
    text = "entries:\n  - tag: a\n    x: 1\n\n# about the defaults\ndefaults:\n  image: i\n"
    out = proposal.append(text, "  # new\n  - tag: b\n    x: 2\n", "b")
    assert out == "entries:\n  - tag: a\n    x: 1\n\n  # new\n  - tag: b\n    x: 2\n\n# about the defaults\n" \
                  "defaults:\n  image: i\n"
    with pytest.raises(ValueError, match="entries"):
        proposal.append("defaults: {}\n", "  - tag: b\n", "b")


# --- the verb ---------------------------------------------------------------------------------------------


def test_propose_appends_once_and_then_finds_nothing_new(project, monkeypatch, capsys):
    (project / "matrix.yaml").write_text(OLDER)
    monkeypatch.setattr(web, "get", FakePyPI(torch_project()))
    out_file = project / "github_output"
    assert run_cli("propose", "--github-output", str(out_file)) == 0
    text = (project / "matrix.yaml").read_text()
    assert text.startswith(OLDER.rsplit("\n# the last line", 1)[0])  # everything before is untouched
    assert text.endswith("    ci: false\n\n# the last line: a top-level comment after the entries stays last\n")
    assert entries_of(text)[-1] == "cu130-torch2.13-bookworm"
    new = matrix.load(project / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    assert new.pins["transformers"] == "5.25.0" and new.pins["accelerate"] == "1.17.0" and not new.ci
    assert "  - tag: cu130-torch2.13-bookworm" in capsys.readouterr().out
    assert out_file.read_text() == "tag=cu130-torch2.13-bookworm\n"
    assert run_cli("validate", "--strict") == 0
    assert run_cli("propose", "--github-output", str(out_file)) == 0
    assert "nothing new: the matrix already has cu130-torch2.13-bookworm" in capsys.readouterr().err
    assert (project / "matrix.yaml").read_text() == text and out_file.read_text().endswith("\ntag=\n")


def test_dry_run_prints_and_writes_nothing(project, monkeypatch, capsys):
    (project / "matrix.yaml").write_text(OLDER)
    monkeypatch.setattr(web, "get", FakePyPI(torch_project()))
    assert run_cli("propose", "--dry-run") == 0
    assert "torch: 2.13.1" in capsys.readouterr().out and (project / "matrix.yaml").read_text() == OLDER


def test_a_release_the_rules_reject_is_not_proposed_and_the_rule_is_named(project, monkeypatch, capsys):
    before = (project / "matrix.yaml").read_text()
    cuda_13_2 = 'cuda-toolkit[cublas,cudart]==13.2.2; platform_system == "Linux"'
    monkeypatch.setattr(web, "get", FakePyPI(torch_project("2.15.0", (cuda_13_2, CUDNN))))
    assert run_cli("propose") == 0
    err = capsys.readouterr().err
    assert "nothing proposed: cu132-torch2.15-bookworm (torch 2.15.0: CUDA 13.2 build on PyPI" in err
    assert "[torch-known] torch 2.15 is not in the compatibility data" in err
    assert (project / "matrix.yaml").read_text() == before


def test_pypi_unreachable_is_exit_3_in_one_line(project, monkeypatch, capsys):
    def unreachable(url, **_kwargs):
        raise web.Failed(url, "ConnectionError: connection refused")

    monkeypatch.setattr(web, "get", unreachable)
    assert run_cli("propose") == 3
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert errors == ["error: cannot read https://pypi.org/pypi/torch/json: ConnectionError: connection refused"]
    assert "Traceback" not in err


def test_a_matrix_without_a_ci_entry_is_exit_2(project, capsys):
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace("    ci: true\n", ""))
    assert run_cli("propose") == 2
    assert "no entry has `ci: true`" in capsys.readouterr().err
