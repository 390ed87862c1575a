"""Compatibility rules reject broken combinations with the rule, the reason and its source."""

from __future__ import annotations

import dataclasses

import pytest

from builder.model import compat, matrix
from tests.conftest import ROOT, VALID_MATRIX, run_cli


def entry_with(project, old: str, new: str, tag: str = "cu121-torch2.3") -> matrix.Entry:
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace(old, new, 1))
    return matrix.load(project / "matrix.yaml").by_tag()[tag]


def rules_of(entry) -> dict[str, compat.Violation]:
    return {v.rule: v for v in compat.check(entry)}


def test_valid_entries_break_no_rule(project):
    for e in matrix.load(project / "matrix.yaml").entries:
        assert compat.check(e) == []


def test_every_rule_names_a_source():
    data = compat.rules()
    for section in ("torch", "cuda"):
        for key, facts in data[section].items():
            assert facts.get("source"), f"{section}.{key} has no source"
    for release, facts in data["flash_attn"]["releases"].items():
        assert facts.get("source"), release
        assert all(x.get("source") for x in facts.get("extra", [])), release
    assert all(r.get("source") for r in data["packages"] + data["base_os"] + data["rules"])


def test_compat_data_is_complete_and_well_formed():
    from packaging.specifiers import SpecifierSet

    data = compat.rules()
    for minor, facts in data["torch"].items():
        assert {"cuda_builds", "pypi_cuda", "python", "cxx11abi", "cudnn"} <= set(facts), minor
        assert facts["pypi_cuda"] in facts["cuda_builds"], minor
        assert set(facts.get("cxx11abi_builds", {})) <= set(facts["cuda_builds"]), minor
        assert all(b in data["cuda"] for b in facts["cuda_builds"]), f"torch {minor}: a build without driver data"
    for version, release in data["flash_attn"]["releases"].items():
        assert {"python", "cuda_tag", "torch"} <= set(release), version
        for minor, builds in release["torch"].items():
            if minor in data["torch"]:
                assert set(builds) <= set(data["torch"][minor]["cuda_builds"]), (version, minor)
    facts = {"python", "cuda", *matrix.PACKAGES}
    ids = [r["id"] for r in data["rules"]]
    assert len(ids) == len(set(ids))
    for rule in compat.constraint_rules():
        assert rule["kind"] in ("requires", "forbids"), rule["id"]
        for key, spec in {**rule["when"], **rule.get("then", {})}.items():
            assert key in facts, (rule["id"], key)
            assert spec == "*" or SpecifierSet(spec), (rule["id"], spec)
        assert rule["field"] in facts and rule["reason"] and rule["source"], rule["id"]


@pytest.mark.parametrize("old, new, rule, words", [
    ('cuda: "12.1"', 'cuda: "12.4"', "torch-cuda", "has no CUDA 12.4 build"),
    ("12.1.1-runtime-ubuntu22.04", "11.8.0-devel-ubuntu22.04", "base-cuda-compiler", "mismatches the version"),
    ("flash-attn: 2.6.3", "flash-attn: 2.8.3", "flash-attn-torch", "no prebuilt wheel for torch 2.3"),
    ("transformers: 4.44.2", "transformers: 5.24.0", "transformers-torch", "needs torch >=2.4"),
])
def test_rule_violations(project, old, new, rule, words):
    found = rules_of(entry_with(project, old, new))
    assert rule in found, found
    assert words in found[rule].reason
    assert found[rule].source


@pytest.mark.parametrize("base", [
    "12.4.1-runtime-ubuntu22.04",  # newer CUDA runtime in the base than torch's cu121 wheels
    "12.1.1-cudnn9-runtime-ubuntu22.04",  # cuDNN 9 in the base, torch 2.3 loads its own cuDNN 8
    "12.4.1-cudnn-devel-ubuntu22.04",  # nvcc 12.4 with torch cu121: same major, cpp_extension only warns
])
def test_base_cuda_libraries_do_not_conflict_with_torch_wheels(project, base):
    # torch's pip wheels load their own nvidia-* libraries; transformers' CI and axolotl ship such bases.
    found = rules_of(entry_with(project, "12.1.1-runtime-ubuntu22.04", base))
    assert found == {}, found


def test_python_outside_torch_range(project):
    e = entry_with(project, 'python: "3.11"', 'python: "3.9"', tag="cu130-torch2.13-bookworm")
    found = rules_of(e)
    assert "torch-python" in found and "3.9" in found["torch-python"].reason


def test_pypi_serves_one_cuda_build(project):
    # torch 2.4 has a CUDA 12.4 build, but PyPI serves only cu121: the entry must name PyTorch's index.
    text = VALID_MATRIX.replace("torch: 2.3.1", "torch: 2.4.1").replace('cuda: "12.1"', 'cuda: "12.4"', 1)
    text = text.replace("12.1.1-runtime", "12.4.1-runtime").replace("flash-attn: 2.6.3", "flash-attn: 2.6.3")
    (project / "matrix.yaml").write_text(text)
    found = rules_of(matrix.load(project / "matrix.yaml").by_tag()["cu121-torch2.3"])
    assert "torch-index" in found
    assert "https://download.pytorch.org/whl/cu124" in found["torch-index"].reason


def test_derived_facts(project):
    m = matrix.load(project / "matrix.yaml").by_tag()
    old = compat.derive(m["cu121-torch2.3"])
    assert old["min_driver"] == "525.60.13" and old["cxx11abi"] is False
    assert old["flash_attn_wheel"].endswith(
        "v2.6.3/flash_attn-2.6.3+cu123torch2.3cxx11abiFALSE-cp310-cp310-linux_x86_64.whl")
    new = compat.derive(m["cu130-torch2.13-bookworm"])
    assert new["min_driver"] == "580.65.06" and new["cxx11abi"] is True and new["flash_attn_wheel"] is None


def test_violation_message_has_file_line_rule_and_source(project):
    e = entry_with(project, 'cuda: "12.1"', 'cuda: "12.4"')
    text = compat.check(e)[0].render(e)
    assert text.startswith(f"{project / 'matrix.yaml'}:9: entry 'cu121-torch2.3', field 'cuda': [torch-cuda]")
    assert "(source: https://" in text


# --- toolchain: DeepSpeed ops, nvcc, GPU archs -------------------------------------------------------------

BOOKWORM = "cu130-torch2.13-bookworm"


@pytest.mark.parametrize("old, new, tag, rule, words", [
    ("    runner: [ubuntu-latest]", '    cuda_archs: "8.0;9.0"\n    runner: [ubuntu-latest]', BOOKWORM, "gpu-archs",
     "B200 (compute capability 10.0) has no code in the ops' arch list"),
    ("    runner: [ubuntu-latest]", '    cuda_archs: "7.0;9.0+PTX"\n    runner: [ubuntu-latest]', BOOKWORM,
     "cuda-archs-nvcc", "nvcc 13.0 cannot compile sm_70"),
    ("    runner: [ubuntu-latest]", "    gpus: [H100, Z9000]\n    runner: [ubuntu-latest]", BOOKWORM, "gpu-known",
     "GPU 'Z9000' is not in compat.yaml"),
    ("    runner: [ubuntu-latest]", "    gpus: [H100, P100]\n    runner: [ubuntu-latest]", BOOKWORM, "torch-archs",
     "no kernels for P100 (compute capability 6.0)"),
])
def test_toolchain_rules(project, old, new, tag, rule, words):
    e = entry_with(project, old, new, tag)
    found = [v for v in compat.check(e) if v.rule == rule]
    assert found, compat.check(e)
    assert any(words in v.reason for v in found), found
    assert all(v.source for v in found)


def test_newer_deepspeed_needs_no_nvcc(project):
    assert compat.check(matrix.load(project / "matrix.yaml").by_tag()[BOOKWORM]) == []


@pytest.mark.parametrize("arch_list, capability, runs", [
    ("8.0;9.0", "8.9", True),      # sm_80 SASS runs on sm_89 (same major, newer minor)
    ("8.6;9.0", "8.0", False),     # but not on an older minor
    ("8.0;9.0+PTX", "12.0", True),  # PTX JIT on anything newer
    ("8.0;9.0", "12.0", False),    # no PTX: no code for Blackwell
    ("7.5;8.0+PTX", "7.0", False),  # PTX does not run on older GPUs
])
def test_arch_coverage(arch_list, capability, runs):
    assert compat.arch_runs_on(arch_list, capability) is runs


def test_toolchain_per_cuda_line(project):
    entries = matrix.load(project / "matrix.yaml").by_tag()
    cuda13 = compat.toolchain(entries[BOOKWORM])
    assert cuda13["nvcc"]["kind"] == "pypi" and cuda13["cuda_home"].endswith("python3.11/site-packages/nvidia/cu13")
    assert cuda13["arch_list"].endswith("+PTX") and cuda13["container_env"]["driver_capabilities"] == "compute,utility"
    cuda12 = compat.toolchain(entries["cu121-torch2.3"])
    assert cuda12["nvcc"]["kind"] == "image" and cuda12["nvcc"]["image"] == "nvidia/cuda:12.1.1-devel-ubuntu22.04"
    assert cuda12["container_env"] is None  # nvidia/cuda sets NVIDIA_* itself
    assert {o["name"] for o in cuda13["ops"]} >= {"fused_adam", "cpu_adam"}


def test_toolchain_rules_name_sources():
    t = compat.rules()["toolchain"]
    assert all(o["source"] for o in t["ops"]) and all(n["source"] for n in t["nvcc"])
    assert all(a["source"] for a in t["cuda_archs"].values())
    assert t["gpus"]["source"] and t["deepspeed_needs_nvcc"]["source"] and t["cpu_target"]["source"]


def test_debian_nvcc_is_build_only(project):
    text = VALID_MATRIX.replace("""    runner: [ubuntu-latest]
    ci: true
    default: true
""", """    runner: [ubuntu-latest]
    ci: true
    default: true
  - tag: cu124-torch2.6-trixie
    base: debian:trixie-slim@sha256:a29215f6a35e51e22adffa17f89e9d2ef06214e64a2bad10d765c46aea49f11f
    python: "3.13"
    cuda: "12.4"
    torch: 2.6.0
    transformers: 5.24.0
    deepspeed: 0.19.8
    peft: 0.21.2
    accelerate: 1.16.0
    nvidia-ml-py: 13.615.71
    nvcc: true
""")
    (project / "matrix.yaml").write_text(text)
    e = matrix.load(project / "matrix.yaml").by_tag()["cu124-torch2.6-trixie"]
    assert compat.toolchain(e)["host_cxx"] == "g++-13"  # nvcc 12.4 accepts GCC <= 13; trixie's default is 14
    assert compat.check(e) == []  # the combination works: validate accepts it
    found = [v for v in compat.recipe_limits(e) if v.rule == "nvcc-in-image"]
    assert found and "libcuda1" in found[0].reason


def test_cuda12_4_on_bookworm_gets_trixie_debs_unpacked_with_g_plus_plus_12():
    """Python 3.11 + CUDA 12.4 on Debian 12: an nvcc source (trixie's .debs, unpacked), built with bookworm's g++-12;
    build-only, so an entry that wants nvcc in the image is stopped with the reason."""
    e = matrix.load(ROOT / "matrix.yaml").by_tag()["cu124-torch2.6-bookworm"]
    assert compat.check(e) == [] and compat.recipe_limits(e) == []
    tc = compat.toolchain(e)
    assert tc["nvcc"]["kind"] == "debian-unpacked" and tc["nvcc"]["suite"] == "trixie"
    assert tc["host_cxx"] == "g++-12" and tc["cuda_home"] == "/usr" and tc["nvcc_in_image"] is False
    assert "libcuda1" not in tc["nvcc"]["packages"]
    derived = {what: value for what, value, _, _ in compat.derivations(e)}
    assert derived["ops toolchain"].startswith("nvcc from Debian trixie .debs unpacked, not installed")
    wants_nvcc = dataclasses.replace(e, nvcc=True)
    found = [v for v in compat.recipe_limits(wants_nvcc) if v.rule == "nvcc-in-image"]
    assert found and "build-only" in found[0].reason


# --- two judgements: does it work (validate, exit 2) vs can the recipe build it here (build, exit 3) ---------


def test_deepspeed_before_0_19_8_gets_nvcc_derived_not_demanded(project, capsys):
    e = entry_with(project, "    nvcc: true\n", "")
    assert not e.nvcc and compat.check(e) == [] and compat.recipe_limits(e) == []
    assert compat.toolchain(e)["nvcc_in_image"] is True
    derived = {what: (value, why) for what, value, why, _ in compat.derivations(e)}
    assert derived["nvcc in image"][0] == "yes" and "0.15.1 < 0.19.8" in derived["nvcc in image"][1]
    assert derived["arch list"][0] == "7.0;8.0;9.0+PTX"
    assert run_cli("validate", "cu121-torch2.3") == 0
    assert run_cli("validate", "--explain", "cu121-torch2.3") == 0
    out = capsys.readouterr().out
    assert "derived by the recipe" in out and "0.15.1 < 0.19.8 fails `import deepspeed`" in out


def test_newer_deepspeed_derives_no_nvcc(project):
    e = matrix.load(project / "matrix.yaml").by_tag()[BOOKWORM]
    assert compat.toolchain(e)["nvcc_in_image"] is False
    assert dict((w, v) for w, v, _, _ in compat.derivations(e))["nvcc in image"] == "no"


def test_a_flash_attn_release_without_wheel_data_is_a_recipe_limit_not_a_rejection(project):
    # Whether 2.4.2 has wheels is not in compat.yaml: validate cannot say the stack is broken, but the recipe
    # cannot name the wheel to install, so render/lock/build stop (exit 3) and say how to add it.
    e = entry_with(project, "flash-attn: 2.6.3", "flash-attn: 2.4.2")
    assert "flash-attn-known" not in rules_of(e)
    (limit,) = [v for v in compat.recipe_limits(e) if v.rule == "flash-attn-known"]
    assert "not in the wheel data" in limit.reason and "refresh-compat" in limit.reason


def test_recipe_limit_is_accepted_by_validate_and_stops_render_with_exit_3(project, capsys):
    # Python 3.12 on an Ubuntu 22.04 base works (with another Python), but this recipe uses the base's python3.
    entry_with(project, 'python: "3.10"', 'python: "3.12"')
    e = matrix.load(project / "matrix.yaml").by_tag()["cu121-torch2.3"]
    assert compat.check(e) == []
    assert [v.rule for v in compat.recipe_limits(e)] == ["base-python"]
    assert run_cli("validate", "cu121-torch2.3") == 0
    assert run_cli("compat", "cu121-torch2.3") == 0
    assert "build stops with exit 3" in capsys.readouterr().out
    assert run_cli("render", "cu121-torch2.3") == 3
    assert "[base-python]" in capsys.readouterr().err


def test_cuda12_ops_on_bookworm_without_nvcc_source_is_a_build_time_limit(project, capsys):
    # DeepSpeed 0.15 on CUDA 12.1 over debian:bookworm-slim: a working stack (pip wheels bring CUDA), but no
    # nvcc source for CUDA 12.1 on Debian 12 is reachable here.
    old = "nvidia/cuda:12.1.1-runtime-ubuntu22.04@sha256:8bbc6e304b193e84327fa30d93eea70ec0213b808239a46602a919a479a73b12"
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace(old, "debian:bookworm-slim@sha256:" + "3" * 64).replace(
        'python: "3.10"', 'python: "3.11"', 1))
    e = matrix.load(project / "matrix.yaml").by_tag()["cu121-torch2.3"]
    assert compat.check(e) == []
    assert "nvcc-source" in {v.rule for v in compat.recipe_limits(e)}
    assert run_cli("validate", "cu121-torch2.3") == 0
    assert run_cli("build", "cu121-torch2.3") == 3
    err = capsys.readouterr().err
    assert "[nvcc-source]" in err and "no nvcc source reachable for CUDA 12.1" in err


def test_cpu_accelerator_ops_are_prebuilt_from_the_checked_deepspeed_on(project):
    """DeepSpeed's CPU-accelerator ops get their own wheel only where the builders were checked (0.19.8 on):
    an older DeepSpeed keeps its JIT path rather than an untested build."""
    entries = matrix.load(project / "matrix.yaml").by_tag()
    cpu = compat.cpu_accelerator(entries[BOOKWORM])
    assert cpu and cpu["source"] and cpu["dir"] == "/opt/deepspeed-cpu"
    assert {o["name"] for o in cpu["ops"]} == {"fused_adam", "cpu_adam", "deepspeed_shm_comm"}
    assert all(o["build_var"].startswith("DS_BUILD_") for o in cpu["ops"])
    dispatched = [o for o in cpu["ops"] if o.get("avx512_dispatched")]
    assert dispatched and all(o["avx512_source"] for o in dispatched)  # accepted AVX-512 code needs its reason
    assert compat.cpu_accelerator(entries["cu121-torch2.3"]) is None  # DeepSpeed 0.15.1
    assert compat.toolchain(entries["cu121-torch2.3"])["cpu_ops_json"] == ""
