"""Release data -> compat.yaml facts, the diff against compat.yaml, applying it, and the `compat` report.

Fixtures are real files: flash-attention's publish.yml/setup.py at v2.8.3 and v2.6.3, a trimmed PyPI
project JSON for torch, and the core metadata of torch-2.6.0-cp311 (tests/unit/data/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from builder.boundary import pypi, web
from builder.model import compat, explain, knowledge
from builder.model.matrix import Entry
from builder.steps import refresh
from tests.conftest import run_cli

DATA = Path(__file__).parent / "data"
COMPAT = Path(compat.__file__).parent.parent / "data" / "compat.yaml"


def flash_files(tag: str) -> tuple[str, str]:
    base = DATA / "flash_attn" / tag
    return (base / "publish.yml").read_text(), (base / "setup.py.txt").read_text()


def test_flash_attn_release_reads_the_wheel_matrix_and_build_cuda():
    release = knowledge.flash_attn_release(*flash_files("v2.8.3"))
    # torch 2.6 wheels were compiled against PyTorch's cu126 build: that is what decides their ABI.
    assert release["torch"] == {"2.4": ["12.4"], "2.5": ["12.4"], "2.6": ["12.6"], "2.7": ["12.8"], "2.8": ["12.9"]}
    assert release["cuda_tag"] == {"12": "cu12"}
    assert release["python"] == ["3.9", "3.10", "3.11", "3.12", "3.13"]
    assert release["exclude"] == [["2.4", "3.13"]]


def test_flash_attn_release_old_style_cuda_tag():
    release = knowledge.flash_attn_release(*flash_files("v2.6.3"))
    assert release["cuda_tag"] == {"11": "cu118", "12": "cu123"}  # setup.py maps every 12.x to cu123
    assert release["torch"]["2.0"] == ["11.7"]  # CUDA 12 excluded for torch 2.0 in the matrix
    assert release["torch"]["2.4"] == ["11.8", "12.1"]


@pytest.mark.parametrize("tag", ["v2.8.3", "v2.6.3"])
def test_shipped_flash_attn_data_matches_the_release_files(tag):
    # compat.yaml's wheel matrices are what the parser reads from the release's own files.
    shipped = dict(compat.rules()["flash_attn"]["releases"][tag[1:]])
    for key in ("source", "extra"):
        shipped.pop(key, None)
    assert shipped == knowledge.flash_attn_release(*flash_files(tag))


def test_flash_attn_release_rejects_an_unknown_layout():
    with pytest.raises(ValueError, match="unrecognised layout"):
        knowledge.flash_attn_release("jobs: {}\n", flash_files("v2.8.3")[1])


def pypi_torch() -> dict:
    return json.loads((DATA / "pypi" / "torch.json").read_text())


def test_torch_facts_from_pypi_files_and_metadata():
    releases = pypi_torch()["releases"]
    latest = knowledge.latest_per_minor(releases, since="2.5")
    assert latest == {"2.5": "2.5.1", "2.6": "2.6.0", "2.7": "2.7.1", "2.8": "2.8.0", "2.15": "2.15.0"}  # no rc
    metadata = (DATA / "pypi" / "torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl.metadata").read_text()
    facts = knowledge.torch_facts("2.6.0", releases["2.6.0"], metadata)
    assert facts == {"release": "2.6.0", "python": ">=3.9,<3.14", "cxx11abi": False, "pypi_cuda": "12.4", "cudnn": 9}
    new = knowledge.torch_facts("2.7.1", releases["2.7.1"], None)
    assert new["cxx11abi"] is True and "pypi_cuda" not in new  # manylinux_2_28 wheels: the C++11 ABI
    assert knowledge.torch_facts("2.15.0", releases["2.15.0"], None)["python"] == ">=3.11,<3.16"


def test_diff_reports_changed_new_and_nothing_for_agreement():
    current = yaml.safe_load(COMPAT.read_text())["torch"]
    fetched = {
        "2.6": {"release": "2.6.0", "python": ">=3.9,<3.14", "cxx11abi": False, "pypi_cuda": "12.4", "cudnn": 9},
        "2.7": {"release": "2.7.1", "python": ">=3.9,<3.15", "cxx11abi": True},
        "2.15": {"release": "2.15.0", "python": ">=3.11,<3.16", "cxx11abi": True, "pypi_cuda": "13.0", "cudnn": 9},
        "2.16": {"release": "2.16.0", "python": ">=3.11,<3.16", "cxx11abi": True},
    }
    changes = knowledge.diff_torch(current, fetched)
    assert [c.render() for c in changes] == [
        "~ torch.2.7.python: '>=3.9,<3.14' -> '>=3.9,<3.15'",
        "+ torch.2.15: {cuda_builds: ['13.0'], cudnn: 9, cxx11abi: true, pypi_cuda: '13.0', python: '>=3.11,<3.16'}",
        "+ torch.2.16: 2.16.0 on PyPI ({cxx11abi: true, python: '>=3.11,<3.16'}); pypi_cuda, cudnn unknown: add by hand"
        " with a source",
    ]


def test_diff_flash_attn_new_release_without_wheel_data_is_listed_not_invented():
    current = yaml.safe_load(COMPAT.read_text())["flash_attn"]["releases"]
    changes = knowledge.diff_flash_attn(current, {"2.8.3": knowledge.flash_attn_release(*flash_files("v2.8.3")),
                                                  "2.9.0": None})
    assert [c.render() for c in changes] == ["+ flash_attn.2.9.0: released on PyPI; wheel list not read"]


def test_apply_text_changes_values_in_place_and_keeps_comments():
    text = COMPAT.read_text()
    changes = [knowledge.Change("torch", "2.7", "python", ">=3.9,<3.14", ">=3.9,<3.15"),
               knowledge.Change("torch", "2.15", "", None, {"cuda_builds": ["13.0"], "python": ">=3.11,<3.16",
                                                             "pypi_cuda": "13.0", "cxx11abi": True, "cudnn": 9}),
               knowledge.Change("flash_attn", "2.9.0", "", None, {"python": ["3.12"], "cuda_tag": {"12": "cu12"},
                                                                  "torch": {"2.9": ["12.8"]}})]
    out = knowledge.apply_text(text, changes, "refresh-compat test")
    data = yaml.safe_load(out)
    assert data["torch"]["2.7"]["python"] == ">=3.9,<3.15"
    assert data["torch"]["2.15"] == {"cuda_builds": ["13.0"], "python": ">=3.11,<3.16", "pypi_cuda": "13.0",
                                     "cxx11abi": True, "cudnn": 9, "source": "refresh-compat test"}
    assert data["flash_attn"]["releases"]["2.9.0"]["source"] == "refresh-compat test"
    before = yaml.safe_load(text)
    assert data["torch"]["2.6"] == before["torch"]["2.6"] and data["rules"] == before["rules"]
    comments = [ln for ln in text.splitlines() if ln.lstrip().startswith("#")]
    assert comments == [ln for ln in out.splitlines() if ln.lstrip().startswith("#")]
    assert len(out.splitlines()) == len(text.splitlines()) + 1 + 5


def entry(**over) -> Entry:
    pins = {"torch": "2.6.0", "transformers": "4.49.0", "deepspeed": "0.16.4", "peft": "0.14.0",
            "accelerate": "1.4.0", "nvidia-ml-py": "12.570.86", "flash-attn": "2.7.4.post1"}
    pins.update(over.pop("pins", {}))
    fields = dict(tag="t", image="i", base="nvidia/cuda:12.4.1-runtime-ubuntu22.04", python="3.10", cuda="12.4",
                  pins=pins, index_url="https://pypi.org/simple", runner=("x",), nvcc=True)  # DeepSpeed 0.16 needs nvcc
    fields.update(over)
    return Entry(**fields)


def test_report_lists_rules_with_evidence_and_derived_facts():
    text = explain.report(entry())
    assert "| flash-attn-abi " in text and "| pass " in text
    assert "https://github.com/Dao-AILab/flash-attention/issues/1783" in text  # evidence column
    assert "flash_attn-2.7.4.post1+cu12torch2.6cxx11abiFALSE-cp310-cp310-linux_x86_64.whl" in text
    assert "min driver: 525.60.13" in text and "flash-attn kernels need compute capability >= 8.0" in text
    assert "| arch list     | 7.0;8.0;9.0+PTX" in text  # derived, with its evidence


def test_report_of_a_broken_entry_names_the_failure_and_derives_nothing():
    text = explain.report(entry(cuda="12.6", index_url="https://download.pytorch.org/whl/cu126",
                                base="debian:bookworm-slim", python="3.11"))
    assert "| flash-attn-abi " in text and "FAIL" in text and "rule(s) broken: flash-attn-abi" in text
    assert "flash-attn wheel:" not in text


def test_compat_verb(project, capsys):
    assert run_cli("compat", "cu121-torch2.3") == 0
    out = capsys.readouterr().out
    assert "flash_attn-2.6.3+cu123torch2.3cxx11abiFALSE-cp310-cp310-linux_x86_64.whl" in out


class FakePyPI:
    """Serves the fixture files in place of pypi.org; GitHub is unreachable, as on this machine."""

    def __call__(self, url: str, **_bounds) -> bytes:
        if url == pypi.JSON_URL.format(name="torch"):
            return (DATA / "pypi" / "torch.json").read_bytes()
        if url == pypi.JSON_URL.format(name="flash-attn"):
            return json.dumps({"releases": {"2.8.3": [{}], "2.9.0": [{}], "2.5.0": [{}]}}).encode()
        if "/torch-2.6.0-" in url and url.endswith(".metadata"):  # same Requires-Dist for every cpXY wheel
            return (DATA / "pypi" / "torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl.metadata").read_bytes()
        raise OSError(f"unreachable: {url}")


def refresh_args(tmp_path, **over) -> refresh.Options:
    path = tmp_path / "compat.yaml"
    if not path.exists():
        path.write_text(COMPAT.read_text())
    return refresh.Options(write=over.get("write", False), flash_attn_git=None, since="2.5", compat_file=str(path))


def test_refresh_shows_the_diff_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(web, "get", FakePyPI())
    args = refresh_args(tmp_path)
    before = Path(args.compat_file).read_text()
    assert refresh.main(args) == refresh.DIFFERENCES_EXIT  # differences found, nothing written
    captured = capsys.readouterr()
    assert "+ torch.2.15: 2.15.0 on PyPI ({cxx11abi: true, python: '>=3.11,<3.16'}); pypi_cuda, cudnn unknown" \
        in captured.out
    assert "+ flash_attn.2.9.0: released on PyPI; wheel list not read" in captured.out
    assert "torch.2.6" not in captured.out  # 2.6 agrees with PyPI, metadata included
    assert "GitHub not reachable" in captured.err
    assert Path(args.compat_file).read_text() == before


def test_refresh_write_applies_what_has_data(tmp_path, monkeypatch):
    monkeypatch.setattr(web, "get", FakePyPI())
    args = refresh_args(tmp_path, write=True)
    text = Path(args.compat_file).read_text()
    Path(args.compat_file).write_text(text.replace('python: ">=3.9,<3.14", cxx11abi: false,\n          cxx11abi_builds',
                                                   'python: ">=3.9,<3.13", cxx11abi: false,\n          cxx11abi_builds'))
    assert refresh.main(args) == 0
    data = yaml.safe_load(Path(args.compat_file).read_text())
    assert data["torch"]["2.6"]["python"] == ">=3.9,<3.14"  # set back to what PyPI's files say
    assert "refresh-compat" in data["torch"]["2.6"]["source"]
    assert "2.15" not in data["torch"]  # CUDA build unknown without metadata: left to a person
    assert "2.9.0" not in data["flash_attn"]["releases"]  # no wheel data: left to a person


def test_refresh_network_failure_is_a_machine_problem(tmp_path, monkeypatch, capsys):
    def down(url, **_bounds):
        raise OSError("Name or service not known")

    monkeypatch.setattr(web, "get", down)
    assert run_cli("refresh-compat", "--compat-file", refresh_args(tmp_path).compat_file) == 3
    err = capsys.readouterr().err
    assert "error: cannot read https://pypi.org/pypi/torch/json" in err and "Traceback" not in err
