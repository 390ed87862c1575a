"""PyPI's own signals (issue #45): the judge (builder/model/signals.py) on small synthetic data, the derivation's
pure parts (builder/derive/pypi_signals.py) on files made here, and the committed data against every shipped stack.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import zipfile

import pytest

from builder.derive import pypi_signals
from builder.model import matrix, signals
from builder.model.matrix import PACKAGES, Entry
from tests.unit.test_compat_corpus import CORPUS, complete

BOOKWORM = "debian:bookworm-slim"


def entry(python="3.11", base=BOOKWORM, index="https://pypi.org/simple", **pins) -> Entry:
    full = {p: None for p in PACKAGES} | {"torch": "2.6.0"} | {k.replace("_", "-"): v for k, v in pins.items()}
    return Entry(tag="t", image="x/y", base=base, python=python, cuda="12.4", pins=full, index_url=index,
                 runner=("r",))


def row(**fields) -> dict:
    base = {"yanked": False, "yanked_reason": None, "requires_python": None, "requires_dist": [],
            "wheel_tags": ["py3-none-any"], "sdist": True,
            "metadata": {"file": "x-1.0-py3-none-any.whl", "sha256": "0" * 64, "part": "METADATA"}}
    return base | fields


@pytest.fixture
def data(monkeypatch):
    """Synthetic signals documents: data[name][version] = row; packages absent from it have no document."""
    docs: dict[str, dict] = {}
    monkeypatch.setattr(signals, "load", lambda name: {"releases": docs[name]} if name in docs else None)
    # torch is pinned in every entry: a plain release keeps it out of the way unless a test replaces it.
    docs["torch"] = {"2.6.0": row(wheel_tags=[f"cp3{m}-cp3{m}-manylinux_2_17_x86_64" for m in range(8, 14)], sdist=False)}
    return docs


def failed(found) -> dict[tuple[str, str], str]:
    return {(o.field, o.rule): o.reason for o in found if o.ok is False}


# --- yanked, Requires-Python ---------------------------------------------------------------------------------


def test_a_yanked_release_is_refused_with_its_reason(data):
    data["transformers"] = {"4.52.0": row(yanked=True, yanked_reason="Error in the setup")}
    found = failed(signals.evaluate(entry(transformers="4.52.0")))
    assert list(found) == [("transformers", "pypi-yanked")]
    assert '"Error in the setup"' in found["transformers", "pypi-yanked"]


def test_a_yank_without_a_reason_says_so(data):
    data["peft"] = {"0.5.0": row(yanked=True)}
    assert "no reason given" in failed(signals.evaluate(entry(peft="0.5.0")))["peft", "pypi-yanked"]


def test_requires_python_excluding_the_entrys_python_is_refused_once(data):
    # No wheel for 3.9 either: Requires-Python already says it, the wheel check does not repeat it.
    data["tokenizers"] = {"0.23.1": row(requires_python=">=3.10", wheel_tags=["cp310-abi3-manylinux_2_17_x86_64"])}
    found = failed(signals.evaluate(entry(python="3.9", tokenizers="0.23.1")))
    assert list(found) == [("tokenizers", "requires-python")]
    assert ">=3.10" in found["tokenizers", "requires-python"] and "3.9" in found["tokenizers", "requires-python"]


@pytest.mark.parametrize("spec, python, admitted", [
    (None, "3.13", True), (">=3.8", "3.12", True), ("<3.12", "3.12", False), (">=3.10.0", "3.9", False),
    # The base decides the patch: a release that needs 3.9.2 installs on a 3.9 base with a later patch.
    (">=3.9.2", "3.9", True), ("!=3.11.*", "3.11", False), ("not a spec", "3.11", True),
])
def test_python_admitted(spec, python, admitted):
    assert signals.python_admitted(spec, python) is admitted


# --- wheel tags ----------------------------------------------------------------------------------------------

TOKENIZERS_0_13 = [f"cp{v}-cp{v}-manylinux_2_17_x86_64" for v in (38, 39, 310, 311)] + ["cp37-cp37m-manylinux_2_17_x86_64"]


def test_no_wheel_for_the_python_means_a_source_build_that_needs_rust(data):
    data["tokenizers"] = {"0.13.3": row(wheel_tags=TOKENIZERS_0_13)}
    found = failed(signals.evaluate(entry(python="3.12", tokenizers="0.13.3")))
    why = found["tokenizers", "wheel-tags"]
    assert "pip would build tokenizers 0.13.3 from its sdist" in why and "Rust toolchain" in why
    assert "cp37..cp311" in why and "glibc 2.36 of Debian 12" in why
    assert failed(signals.evaluate(entry(python="3.11", tokenizers="0.13.3"))) == {}


def test_another_compiled_package_needs_compilers(data):
    data["datasets"] = {"9.0": row(wheel_tags=["cp310-cp310-manylinux_2_17_x86_64"])}
    assert "compilers" in failed(signals.evaluate(entry(datasets="9.0")))["datasets", "wheel-tags"]


def test_abi3_wheels_install_on_newer_pythons(data):
    data["tokenizers"] = {"0.21.0": row(wheel_tags=["cp39-abi3-manylinux_2_17_x86_64", "cp39-abi3-manylinux_2_17_aarch64"])}
    assert failed(signals.evaluate(entry(python="3.13", tokenizers="0.21.0"))) == {}
    found = failed(signals.evaluate(entry(python="3.8", tokenizers="0.21.0")))
    assert "cp39-abi3 and newer" in found["tokenizers", "wheel-tags"]


def test_a_wheel_needing_a_newer_glibc_than_the_base_does_not_count(data):
    data["tokenizers"] = {"1.0": row(wheel_tags=["cp312-cp312-manylinux_2_39_x86_64"])}
    pinned = {"tokenizers": "1.0"}
    assert failed(signals.evaluate(entry(python="3.12", base="nvidia/cuda:12.8.1-runtime-ubuntu24.04", **pinned))) == {}
    why = failed(signals.evaluate(entry(python="3.12", **pinned)))["tokenizers", "wheel-tags"]
    assert "glibc 2.36" in why and "manylinux_2_39" in why


def test_an_unknown_base_is_assumed_manylinux_2_28_and_says_so(data):
    data["tokenizers"] = {"1.0": row(wheel_tags=["cp312-cp312-manylinux_2_34_x86_64"])}
    why = failed(signals.evaluate(entry(python="3.12", base="nvcr.io/nvidia/pytorch:22.12-py3", tokenizers="1.0")))
    assert "glibc 2.28 assumed" in why["tokenizers", "wheel-tags"]
    data["tokenizers"] = {"1.0": row(wheel_tags=["cp312-cp312-manylinux_2_28_x86_64"])}
    assert failed(signals.evaluate(entry(python="3.12", base="example.org/own:1", tokenizers="1.0"))) == {}


def test_legacy_manylinux_names_are_read_as_pep600():
    assert signals.normalise_platform("manylinux2014_x86_64") == "manylinux_2_17_x86_64"
    assert signals.normalise_platform("manylinux1_x86_64") == "manylinux_2_5_x86_64"
    assert signals.normalise_platform("manylinux_2_28_aarch64") == "manylinux_2_28_aarch64"


def test_pure_python_and_sdist_only_packages_pass(data):
    data["peft"] = {"0.12.0": row()}
    data["deepspeed"] = {"0.15.1": row(wheel_tags=[]), "0.16.0": row(wheel_tags=[])}
    found = signals.evaluate(entry(python="3.13", peft="0.12.0", deepspeed="0.15.1"))
    assert failed(found) == {}
    assert any("sdist-only package" in o.reason for o in found if o.field == "deepspeed")


def test_an_sdist_only_release_of_a_compiled_package_is_a_source_build(data):
    data["tokenizers"] = {"0.13.3": row(wheel_tags=TOKENIZERS_0_13), "0.13.4": row(wheel_tags=[])}
    why = failed(signals.evaluate(entry(tokenizers="0.13.4")))["tokenizers", "wheel-tags"]
    assert "from its sdist" in why and "no Linux x86_64 wheel at all" in why


def test_no_wheel_and_no_sdist_means_no_distribution(data):
    data["torch"] = {"2.1.0": row(wheel_tags=["cp311-cp311-manylinux_2_17_x86_64"], sdist=False)}
    why = failed(signals.evaluate(entry(python="3.12", torch="2.1.0")))["torch", "wheel-tags"]
    assert "pip finds no distribution of torch 2.1.0" in why


def test_wheels_from_elsewhere_are_not_judged_by_pypis_list(data):
    data["torch"] = {"2.1.0": row(wheel_tags=["cp311-cp311-manylinux_2_17_x86_64"], sdist=False)}
    data["flash-attn"] = {"2.6.3": row(wheel_tags=[])}
    data["tokenizers"] = {"1.0": row(wheel_tags=["cp311-cp311-manylinux_2_17_x86_64"])}  # compiled elsewhere
    data["flash-attn"]["2.6.3"]["wheel_tags"] = []
    e = entry(python="3.12", torch="2.1.0", flash_attn="2.6.3", index="https://download.pytorch.org/whl/cu121")
    assert failed(signals.evaluate(e)) == {}


# --- Requires-Dist between pinned packages -------------------------------------------------------------------


def test_an_unconditional_requirement_is_enforced_with_both_bounds(data):
    data["transformers"] = {"4.44.2": row(requires_dist=["tokenizers<0.20,>=0.19", "huggingface-hub<1.0,>=0.23.2"])}
    data["tokenizers"] = {v: row() for v in ("0.18.0", "0.19.1", "0.20.0")}
    for pinned, ok in (("0.18.0", False), ("0.19.1", True), ("0.20.0", False)):
        found = failed(signals.evaluate(entry(transformers="4.44.2", tokenizers=pinned)))
        assert (("transformers", "requires-dist") not in found) is ok, pinned
    why = failed(signals.evaluate(entry(transformers="4.44.2", tokenizers="0.20.0")))["transformers", "requires-dist"]
    assert "transformers 4.44.2 requires tokenizers<0.20,>=0.19" in why and "pins tokenizers 0.20.0" in why


def test_requirement_names_are_compared_normalised(data):
    data["accelerate"] = {"1.16.0": row(requires_dist=["huggingface_hub>=0.21.0"])}
    data["huggingface-hub"] = {"0.20.0": row()}
    why = failed(signals.evaluate(entry(accelerate="1.16.0", huggingface_hub="0.20.0")))["accelerate", "requires-dist"]
    assert "pins huggingface-hub 0.20.0" in why


def test_a_used_extra_is_enforced_for_its_lower_bound_only(data):
    data["transformers"] = {"4.52.4": row(requires_dist=['torch<2.7,>=2.1; extra == "torch"',
                                                         'accelerate>=0.26.0; extra == "deepspeed"'])}
    data["torch"] = {v: row(wheel_tags=["cp311-cp311-manylinux_2_17_x86_64"], sdist=False)
                     for v in ("2.0.1", "2.7.0")}
    data["accelerate"] = {"0.25.0": row(), "1.0.0": row()}
    # Above the extra's upper bound: shipped stacks do this (transformers 4.52.4 + torch 2.7.0), not refused.
    assert failed(signals.evaluate(entry(transformers="4.52.4", torch="2.7.0", accelerate="1.0.0"))) == {}
    found = failed(signals.evaluate(entry(transformers="4.52.4", torch="2.0.1", accelerate="0.25.0")))
    assert list(found) == [("transformers", "requires-dist")]
    found = [o.reason for o in signals.evaluate(entry(transformers="4.52.4", torch="2.0.1", accelerate="0.25.0"))
             if o.ok is False]
    assert any("torch>=2.1 for its [torch] extra" in r for r in found)
    assert any("accelerate>=0.26.0 for its [deepspeed] extra" in r for r in found)


def test_extras_the_stack_does_not_use_and_markers_that_do_not_apply_are_ignored(data):
    data["transformers"] = {"4.56.2": row(requires_dist=['datasets>=2.15.0; extra == "dev"',
                                                         'torch>=9; python_version < "3.9"',
                                                         'accelerate>=9; sys_platform == "win32"'])}
    data["datasets"] = {"2.10.0": row()}
    data["accelerate"] = {"1.0.0": row()}
    assert failed(signals.evaluate(entry(transformers="4.56.2", datasets="2.10.0", accelerate="1.0.0"))) == {}


def test_a_requirement_on_an_unpinned_package_is_not_judged(data):
    data["transformers"] = {"4.44.2": row(requires_dist=["tokenizers<0.20,>=0.19"])}
    assert failed(signals.evaluate(entry(transformers="4.44.2"))) == {}


def test_lower_bounds():
    assert str(signals.lower_bounds(signals.SpecifierSet("<2,>=1.1"))) == ">=1.1"
    assert str(signals.lower_bounds(signals.SpecifierSet("~=1.2.3"))) == ">=1.2.3"
    assert str(signals.lower_bounds(signals.SpecifierSet("<3"))) == ""


# --- not judged, summaries ------------------------------------------------------------------------------------


def test_a_version_absent_from_the_data_is_not_judged_not_rejected(data):
    data["peft"] = {"0.12.0": row()}
    found = [o for o in signals.evaluate(entry(peft="0.13.0", datasets="2.10.0")) if o.ok is None]
    assert {o.field for o in found} == {"peft", "datasets"}
    assert all("refresh-compat --signals" in o.reason for o in found)


def test_one_passing_summary_per_package_and_none_for_a_failing_one(data):
    data["peft"] = {"0.12.0": row(requires_dist=["torch>=1.13.0"])}
    data["accelerate"] = {"0.20.0": row(yanked=True)}
    found = signals.evaluate(entry(peft="0.12.0", accelerate="0.20.0"))
    passing = [o for o in found if o.ok]
    assert [o.field for o in passing] == ["torch", "peft"]
    assert all(o.rule == "pypi-signals" and o.kind == "signals" for o in passing)
    assert "its requirements on torch met" in passing[1].reason
    assert [(o.field, o.rule) for o in found if o.ok is False] == [("accelerate", "pypi-yanked")]


# --- derivation: the pure parts, and the file readers on files made here -------------------------------------


def test_wheel_tags_keep_linux_cpython_and_pure_wheels_with_pep600_names():
    files = [{"filename": n} for n in (
        "tokenizers-0.13.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "tokenizers-0.13.3-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        "tokenizers-0.13.3-cp311-cp311-win_amd64.whl", "tokenizers-0.13.3-cp311-cp311-macosx_12_0_arm64.whl",
        "tokenizers-0.13.3-cp311-cp311-musllinux_1_1_x86_64.whl", "tokenizers-0.13.3-cp311-cp311-manylinux_2_17_s390x.whl",
        "tokenizers-0.13.3-pp39-pypy39_pp73-manylinux_2_17_x86_64.whl", "tokenizers-0.13.3.tar.gz",
        "peft-0.12.0-py3-none-any.whl")]
    assert pypi_signals.wheel_tags(files) == ["cp311-cp311-manylinux_2_17_aarch64", "cp311-cp311-manylinux_2_17_x86_64",
                                              "py3-none-any"]


def test_a_release_is_yanked_when_every_file_is():
    assert pypi_signals.yank([{"yanked": True, "yanked_reason": "broken"}, {"yanked": True}]) == (True, "broken")
    assert pypi_signals.yank([{"yanked": True, "yanked_reason": "x"}, {"yanked": False}]) == (False, None)


def test_requires_txt_sections_become_markers():
    text = "torch\nhjson\n\n[all]\ntransformers>=4.32.1\n\n[:python_version < \"3.8\"]\nimportlib\n\n[dev:sys_platform == \"linux\"]\naccelerate\n"
    assert pypi_signals.requires_txt(text) == [
        "torch", "hjson", 'transformers>=4.32.1; extra == "all"', 'importlib; (python_version < "3.8")',
        'accelerate; (sys_platform == "linux") and extra == "dev"']


def test_stack_requirements_keep_the_stack_with_markers():
    lines = ["filelock", "huggingface_hub<1.0,>=0.23.2", 'accelerate>=0.26.0; extra == "torch"', "numpy>=1.17",
             "nvidia-ml-py", "Torch (>=1.10)"]
    assert pypi_signals.stack_requirements(lines) == lines[1:3] + lines[4:]


METADATA = "Metadata-Version: 2.1\nName: x\nRequires-Python: >=3.9.0\nRequires-Dist: torch>=2.0\nRequires-Dist: numpy\n\nbody"


def test_core_metadata_from_a_wheel_without_pep658(monkeypatch, tmp_path):
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("x/__init__.py", "")
        z.writestr("x-1.0.dist-info/METADATA", METADATA)

    def no_pep658(_name, _file):
        raise OSError("HTTP 404")

    monkeypatch.setattr(pypi_signals.pypi, "wheel_metadata", no_pep658)
    monkeypatch.setattr(pypi_signals.pypi, "fetch_file", lambda _name, _file: wheel)
    files = [{"filename": wheel.name, "size": 10, "digests": {"sha256": "a" * 64}, "packagetype": "bdist_wheel"},
             {"filename": "x-1.0.tar.gz", "size": 5, "digests": {"sha256": "b" * 64}, "packagetype": "sdist"}]
    got, reused = pypi_signals.derive_release("x", files)
    assert not reused and got == {"yanked": False, "yanked_reason": None, "wheel_tags": ["py3-none-any"], "sdist": True,
                                  "requires_python": ">=3.9.0", "requires_dist": ["torch>=2.0"],
                                  "metadata": {"file": wheel.name, "sha256": "a" * 64, "part": "METADATA"}}
    # The committed row for the same file is reused: no request at all.
    monkeypatch.setattr(pypi_signals.pypi, "fetch_file", None)
    assert pypi_signals.derive_release("x", files, previous=got) == (got, True)


def test_core_metadata_from_an_sdist_reads_requires_txt(monkeypatch, tmp_path):
    sdist = tmp_path / "deepspeed-0.15.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        for name, text in (("deepspeed-0.15.1/PKG-INFO", "Metadata-Version: 2.1\nName: deepspeed\n"),
                           ("deepspeed-0.15.1/deepspeed.egg-info/PKG-INFO", "Metadata-Version: 2.1\n"),
                           ("deepspeed-0.15.1/deepspeed.egg-info/requires.txt", "torch\nhjson\n[inf]\ntransformers\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))
    monkeypatch.setattr(pypi_signals.pypi, "fetch_file", lambda _name, _file: sdist)
    files = [{"filename": sdist.name, "size": 1, "digests": {"sha256": "c" * 64}, "packagetype": "sdist"}]
    got, _ = pypi_signals.derive_release("deepspeed", files)
    assert got["requires_dist"] == ["torch", 'transformers; extra == "inf"'] and got["wheel_tags"] == []
    assert got["metadata"]["part"] == "PKG-INFO+requires.txt" and got["requires_python"] is None


def test_final_releases_from_the_floor():
    releases = {"0.9.0": [{}], "1.0.0": [{}], "1.1.0rc1": [{}], "1.1.0.dev0": [{}], "1.0.1.post1": [{}],
                "1.2.0": [], "nonsense!": [{}], "0.10.0": [{}]}
    assert pypi_signals.final_releases(releases, "0.10") == ["0.10.0", "1.0.0", "1.0.1.post1"]


# --- the committed data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(pypi_signals.FLOORS))
def test_committed_data_is_what_the_writer_writes(name):
    path = pypi_signals.folder() / f"{name}.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert path.read_text(encoding="utf-8") == pypi_signals.render(doc), "hand-edited: run refresh-compat --signals"
    assert doc["generated_by"] == pypi_signals.GENERATED_BY and doc["package"] == name
    assert doc["releases"], name
    for version, r in doc["releases"].items():
        assert r["metadata"] and r["metadata"]["part"], f"{name} {version}: no core metadata read"


@pytest.mark.parametrize("e", matrix.load().entries, ids=lambda e: e.tag)
def test_every_matrix_entry_passes_and_is_fully_judged(e):
    found = signals.evaluate(e)
    assert not [o.reason for o in found if o.ok is not True], e.tag
    assert {o.field for o in found} == {p for p, v in e.pins.items() if v}


@pytest.mark.parametrize("case", CORPUS["good"], ids=[c["id"] for c in CORPUS["good"]])
def test_every_shipped_combination_passes(case):
    bad = [f"[{o.rule}] {o.reason}" for o in signals.evaluate(complete(case)) if o.ok is False]
    assert not bad, f"{case['id']} ({case['source']}) wrongly rejected: " + "; ".join(bad)


def test_the_committed_data_catches_the_held_out_classes():
    base = entry(python="3.12", torch="2.6.0")
    # tokenizers 0.13.3 ships wheels up to cp311: on 3.12 pip builds it from source, which needs Rust.
    why = failed(signals.evaluate(dataclasses.replace(base, pins={**base.pins, "tokenizers": "0.13.3"})))
    assert "Rust toolchain" in why["tokenizers", "wheel-tags"]
    # transformers 4.57.0 was yanked ("Error in the setup causing installation issues").
    why = failed(signals.evaluate(dataclasses.replace(base, pins={**base.pins, "transformers": "4.57.0"})))
    assert "Error in the setup" in why["transformers", "pypi-yanked"]


def test_write_touches_only_what_changed(tmp_path):
    docs = {"peft": {"generated_by": pypi_signals.GENERATED_BY, "package": "peft", "releases": {"0.12.0": row()}}}
    assert pypi_signals.stale(docs, tmp_path) == ["peft"]
    assert pypi_signals.write(docs, tmp_path) == ["peft"]
    assert pypi_signals.stale(docs, tmp_path) == [] and pypi_signals.write(docs, tmp_path) == []
    assert json.loads((tmp_path / "peft.json").read_text()) == docs["peft"]


def test_refresh_refuses_a_package_outside_the_stack():
    from builder.errors import UserError

    with pytest.raises(UserError, match="numpy"):
        pypi_signals.refresh(["numpy"])
