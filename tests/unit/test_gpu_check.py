"""scripts/gpu-check's pure parts: what it carries to the GPU machine, how it checks it, the facts it writes.

The whole script runs only where torch is (the GPU machine, or the default image: scripts/gpu-check-rehearse,
about 7 minutes on the 2-core CI machine, too long for CI); these pin what the GPU minutes depend on.
"""

import importlib.machinery
import importlib.util
import json
import re

import pytest

from smoke import facts as smoke_facts
from tests.conftest import ROOT

TAG = "cu130-torch2.13-bookworm"


def _load():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(ROOT / "scripts" / "gpu-check"))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gc = _load()


def lock(name):
    return gc.parse_lock((ROOT / "locks" / TAG / name).read_text())


def test_parse_lock_reads_every_entry_and_hash_of_the_real_locks():
    ops = lock("ops.lock")
    assert ops["pydantic-core"]["version"] and len(ops["pydantic-core"]["hashes"]) > 10
    assert all(len(h) == 64 for e in ops.values() for h in e["hashes"])
    (ds,) = lock("deepspeed.lock").values()
    assert ds["name"] == "deepspeed" and len(ds["hashes"]) == 1


def test_parse_lock_refuses_an_entry_without_hash():
    with pytest.raises(ValueError, match="hjson==3.1.0 has no --hash"):
        gc.parse_lock("hjson==3.1.0\n")


def test_requirements_text_round_trips_through_parse_lock():
    ops = lock("ops.lock")
    assert gc.parse_lock(gc.requirements_text(ops)) == ops


def test_carried_set_is_deepspeeds_dependencies_less_what_the_gpu_machines_stack_requires():
    ops = lock("ops.lock")
    carried = gc.carried_entries(ops)
    assert set(carried) == set(ops) - {"numpy", "packaging", "psutil", "tqdm"}
    assert {"ninja", "py-cpuinfo", "pydantic", "pydantic-core", "hjson", "msgpack"} <= set(carried)


def test_pip_platform_args_ask_for_binary_wheels_of_that_python_on_any_manylinux_floor():
    args = gc.pip_platform_args("3.12")
    assert args[:1] == ["--only-binary=:all:"]
    assert args[args.index("--abi") + 1] == "cp312"
    platforms = {args[i + 1] for i, a in enumerate(args) if a == "--platform"}
    assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= platforms
    assert "manylinux_2_31_x86_64" not in platforms


@pytest.mark.parametrize("bad", ["3", "3.12.1", "py312", ""])
def test_pip_platform_args_reject_a_python_that_is_not_major_minor(bad):
    with pytest.raises(gc.Failed) as exc:
        gc.pip_platform_args(bad)
    assert exc.value.code == 2 and "MAJOR.MINOR" in str(exc.value)


def test_arch_list_is_each_present_capability_once():
    assert gc.arch_list([(9, 0)]) == "9.0"
    assert gc.arch_list([(9, 0), (9, 0), (8, 0)]) == "8.0;9.0"


def test_carried_size_leaves_out_the_rehearsals_nvcc(tmp_path):
    (tmp_path / "deepspeed-0.19.8.tar.gz").write_bytes(b"x" * 1000)
    (tmp_path / "nvcc").mkdir()
    (tmp_path / "nvcc" / "nvidia_cuda_nvcc.whl").write_bytes(b"x" * 5000)
    assert gc.carried_bytes(tmp_path) == 1000


def test_size_problem_names_the_device_limit():
    assert gc.size_problem(5 * 2 ** 20) is None
    msg = gc.size_problem(50 * 2 ** 20)
    assert "50.0 MiB > 48 MiB" in msg and "64 MiB" in msg


@pytest.mark.parametrize("filename, want", [
    ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", ("pydantic-core", "2.50.5")),
    ("deepspeed-0.19.8.tar.gz", ("deepspeed", "0.19.8")),
    ("py_cpuinfo-9.0.0-py3-none-any.whl", ("py-cpuinfo", "9.0.0")),
])
def test_dist_of_file(filename, want):
    assert gc.dist_of_file(filename) == want


def test_match_files_accepts_a_locked_hash_and_refuses_another():
    entries = {"hjson": {"name": "hjson", "version": "3.1.0", "hashes": ["a" * 64]}}
    assert gc.match_files({"hjson-3.1.0-py3-none-any.whl": "a" * 64, "other-1.0.tar.gz": "c" * 64}, entries) \
        == {"hjson-3.1.0-py3-none-any.whl": entries["hjson"]}
    with pytest.raises(gc.Failed) as exc:
        gc.match_files({"hjson-3.1.0-py3-none-any.whl": "b" * 64}, entries)
    assert exc.value.code == 2 and "--prepare" in str(exc.value)


def test_phase_timeout_never_runs_past_the_whole_run_deadline():
    assert gc.remaining_timeout("build", deadline=1000.0, now=0.0) == gc.PHASE_CAP["build"]
    assert gc.remaining_timeout("build", deadline=1000.0, now=950.0) == 50.0
    assert gc.remaining_timeout("build", deadline=1000.0, now=1200.0) == 1.0


def test_the_gpu_run_fits_the_issues_eight_minutes():
    assert gc.BUDGET["gpu"] < 8 * 60


def machine_probe():
    return {"python": "3.12.3", "torch_cuda": "13.0", "gpus": [["NVIDIA H200", [9, 0]]],
            "versions": {"torch": "2.11.0+cu130", "transformers": "4.57.1", "peft": "0.17.1",
                         "accelerate": "1.11.0", "nvidia-ml-py": "13.580.82", "flash-attn": None,
                         "deepspeed": None}}


def test_derived_facts_judge_the_machine_not_the_tag():
    tag = json.loads((ROOT / "dockerfiles" / TAG / "image.json").read_text())
    probe = machine_probe()
    facts = gc.derive_facts(tag, probe, "9.0", [("NVIDIA H200", "9.0")], "0.19.8")
    installed = dict(probe["versions"], deepspeed="0.19.8")  # what the run installs from the sdist
    assert all(ok for _, ok, _ in smoke_facts.compare_pins(facts["pins"], installed))
    assert facts["python"] == "3.12" and facts["pins"]["flash-attn"] is None
    # The CUDA line and driver floor stay the tag's: the run verifies that line's DeepSpeed on this machine.
    assert facts["cuda"] == tag["cuda"] and facts["min_driver"] == tag["min_driver"]
    assert facts["ops"]["arch_list"] == "9.0" and facts["gpu_capability"] == {"NVIDIA H200": "9.0"}
    assert facts["ops"]["modules"] == tag["ops"]["modules"]


def test_ops_spec_lists_the_tags_ops_for_smoke_ops_verify():
    tag = json.loads((ROOT / "dockerfiles" / TAG / "image.json").read_text())
    assert gc.ops_spec(tag) == [
        {"name": "fused_adam", "module": "deepspeed.ops.adam.fused_adam_op", "cuda": True},
        {"name": "cpu_adam", "module": "deepspeed.ops.adam.cpu_adam_op", "cuda": False}]


def test_build_env_is_the_ops_stages_for_this_gpu():
    env = gc.build_env({"PATH": "/usr/bin"}, "9.0", "/usr/local/cuda", "/w/bin/cc", 16, "/w/site")
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0" and env["DS_ACCELERATOR"] == "cuda"
    assert env["NVCC_APPEND_FLAGS"] == "--threads 0" and env["CC"] == env["CXX"] == "/w/bin/cc"
    assert env["PATH"].split(":")[:2] == ["/w/site/bin", "/usr/local/cuda/bin"]
    assert env["PYTHONPATH"].split(":")[0] == "/w/site"


def test_build_env_sets_what_the_rendered_ops_stage_sets():
    """The settings that shape the build (not this GPU's arch, paths or core count) are the ops stage's own."""
    dockerfile = (ROOT / "dockerfiles" / TAG / "Dockerfile").read_text()
    stage = dockerfile[dockerfile.index(" AS ops\n"):]
    lines = iter(stage[stage.index("\nENV ") + 5:].splitlines())
    block = [next(lines)]
    while block[-1].endswith("\\"):  # the whole ENV instruction: every continued line, whatever comes last
        block.append(next(lines))
    stage_env = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', "\n".join(block)))
    env = gc.build_env({"PATH": "/usr/bin"}, "9.0", "/usr/local/cuda", "/w/bin/cc", 16, "/w/site")
    for name in ("DS_ACCELERATOR", "LDFLAGS", "DS_ENABLE_NINJA", "NVCC_APPEND_FLAGS", "TORCH_NO_COMPILER_WRAPPER"):
        assert env[name] == stage_env[name].strip('"'), name
    assert set(stage_env) - set(env) == set()


def test_out_defaults_to_the_device_machines_OUT(monkeypatch):
    monkeypatch.setenv("OUT", "/tmp/out")
    assert gc.parse_args([]).out == "/tmp/out"
    monkeypatch.delenv("OUT")
    with pytest.raises(SystemExit) as exc:
        gc.parse_args([])
    assert exc.value.code == 2


def test_cpu_arch_must_be_a_capability(capsys):
    with pytest.raises(SystemExit):
        gc.parse_args(["--cpu", "--arch", "sm90", "--out", "/tmp/x"])
    assert "--arch 'sm90'" in capsys.readouterr().err


def test_a_run_without_the_carried_folder_says_how_to_make_it_and_writes_the_verdict(tmp_path):
    out = tmp_path / "out"
    code = gc.main(["--out", str(out), "--wheels", str(tmp_path / "absent")])
    assert code == 2
    verdict = json.loads((out / "gpu-check.json").read_text())
    assert verdict["passed"] is False and verdict["exit"] == 2
    first = verdict["phases"][0]
    assert first["name"] == "preflight" and "--prepare" in first["detail"]
    assert [p["ok"] for p in verdict["phases"][1:]] == [None] * 5
    assert "preflight" in (out / "gpu-check.log").read_text()


def test_summary_table_lists_phases_then_smokes_checks():
    phases = [{"name": "build", "ok": True, "seconds": 61.0, "detail": "wheel"}]
    smoke = {"checks": [{"name": "train", "passed": False, "seconds": 30.0, "summary": "loss nan"}]}
    text = gc.table(gc.summary_rows(phases, smoke))
    assert "build" in text and "\u2713" in text and "smoke train" in text and "\u2715" in text


def test_a_cut_smoke_run_still_reports_the_checks_that_finished(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"name": "env", "passed": True, "seconds": 2.0, "summary": "ok"}))
    (tmp_path / "ops.json").write_text(json.dumps({"name": "ops", "passed": False, "seconds": 7.0, "summary": "x"}))
    got = gc.partial_smoke(str(tmp_path))
    assert got["passed"] is False and [c["name"] for c in got["checks"]] == ["env", "ops"]
    assert got["not_run"] == ["compile", "train", "nccl"]


def test_the_script_knows_smokes_checks():
    from smoke import CHECKS
    assert gc.SMOKE_CHECKS == CHECKS
