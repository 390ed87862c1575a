"""Pure-logic tests of the in-image smoke gate (smoke/): stdlib only, no torch needed."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from smoke import env as smoke_env  # noqa: E402
from smoke import facts as F  # noqa: E402
from smoke import nccl, report, signatures  # noqa: E402


def test_smoke_modules_import_no_framework_at_module_level():
    """The gate must import (and report) even when torch itself is broken: torch, deepspeed, transformers and
    peft are imported inside functions only. (A fresh interpreter's sys.modules: tests/integration/.)"""
    import ast

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frameworks = {"torch", "deepspeed", "transformers", "peft"}
    for name in sorted(os.listdir(os.path.join(root, "smoke"))):
        if not name.endswith(".py") or name == "installed.py":  # its own program: torch last, on purpose
            continue
        tree = ast.parse(open(os.path.join(root, "smoke", name), encoding="utf-8").read())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        top += [n for block in tree.body if isinstance(block, (ast.Try, ast.If)) for n in ast.walk(block)
                if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & frameworks, f"smoke/{name} imports {sorted(names & frameworks)} at module level"


# --------------------------------------------------------------------------- signatures

@pytest.mark.parametrize("text,sid", [
    ("ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory",
     "cudnn_missing"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).", "driver_too_old"),
    ("CUDA driver version is insufficient for CUDA runtime version", "driver_too_old"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "no_kernel_image"),
    ("cudaGetDeviceCount(): Error 802: system not yet initialized", "fabric_manager"),
    ("Error 803: system has unsupported display driver / cuda driver combination", "driver_mismatch"),
    ("RuntimeError: Ninja is required to load C++ extensions", "ninja_missing"),
    ("OSError: CUDA_HOME does not exist, unable to compile CUDA op(s)", "cuda_home_missing"),
    ("Installed CUDA version 12.4 does not match the version torch was compiled with 13.0",
     "cuda_version_mismatch"),
    ("ImportError: /opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: "
     "undefined symbol: ncclCommResume", "undefined_symbol"),
    ("/bin/sh: 1: c++: not found", "compiler_missing"),
    ("OSError: libcuda.so.1: cannot open shared object file", "libcuda_missing"),
    ("terminate called without an active exception", "exit_abort"),
])
def test_signature_recognised(text, sid):
    found = signatures.diagnose("Traceback (most recent call last):\n  ...\n" + text + "\nmore\n")
    ids = [d["id"] for d in found]
    assert sid in ids
    hit = [d for d in found if d["id"] == sid][0]
    assert hit["evidence"] == text.strip()  # the whole raw line is kept as evidence


def test_signature_no_false_positives():
    assert signatures.diagnose("") == []
    assert signatures.diagnose("all good\nloss 5.5 -> 5.3\n/bin/sh: 1: nvcc: not found") == []


def test_explain_lines_name_the_signature():
    lines = signatures.explain("undefined symbol: _ZN3c104cuda9SetDeviceEi")
    assert len(lines) == 1 and lines[0].startswith("undefined_symbol:")
    assert "_ZN3c104cuda9SetDeviceEi" in lines[0]


# --------------------------------------------------------------------------- busbw / nccl log

def test_busbw_formula_matches_nccl_tests():
    # 1 GB in 10 ms = 100 GB/s algbw; 8 ranks -> busbw = 100 * 2*7/8 = 175
    assert nccl.algbw_gbps(1e9, 0.01) == pytest.approx(100.0)
    assert nccl.busbw_gbps(1e9, 0.01, 8) == pytest.approx(175.0)
    assert nccl.busbw_gbps(1e9, 0.01, 2) == pytest.approx(100.0)
    assert nccl.busbw_gbps(1e9, 0.01, 1) == 0.0


def test_expected_sum_exact():
    assert nccl.expected_sum(1) == 1
    assert nccl.expected_sum(8) == 36


SAMPLE_LOG = """
node:123:123 [0] NCCL INFO NCCL version 2.27.7+cuda13.0
node:123:140 [0] NCCL INFO Using network Socket
node:123:140 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
node:123:140 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC
node:124:141 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct
node:123:140 [0] NCCL INFO ncclCommInitRankConfig comm 0x5 rank 0 nranks 2 - Init COMPLETE
node:124:141 [1] NCCL INFO ncclCommInitRankConfig comm 0x6 rank 1 nranks 2 - Init COMPLETE
"""


def test_parse_transports_p2p_and_shm_is_not_tcp_fallback():
    tp = nccl.parse_transports(SAMPLE_LOG)
    assert tp["transports"] == {"P2P/IPC": 2, "SHM": 1}
    assert tp["network"] == "Socket"  # loaded, but no channel uses it
    assert tp["version"] == "2.27.7+cuda13.0"
    assert tp["init_complete"] == 2
    assert tp["tcp_fallback"] is False


def test_parse_transports_flags_socket_channels():
    log = ("x [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n"
           "x [0] NCCL INFO Channel 01/0 : 2[2] -> 0[0] [receive] via NET/IB/0/GDRDMA\n")
    tp = nccl.parse_transports(log)
    assert tp["transports"] == {"NET/Socket": 1, "NET/IB": 1}
    assert tp["tcp_fallback"] is True


def test_busbw_floor_env_and_table():
    assert nccl.floor_for("NVIDIA H100 80GB HBM3", 8, env={}) == (220.0, "table (H100.*(HBM3|SXM) x8)")
    assert nccl.floor_for("NVIDIA H100 80GB HBM3", 2, env={})[0] is None  # table is for 8 GPUs
    assert nccl.floor_for("NVIDIA H100 PCIe", 8, env={})[0] is None
    assert nccl.floor_for("anything", 2, env={"SMOKE_MIN_BUSBW_GBPS": "12.5"}) == (12.5, "SMOKE_MIN_BUSBW_GBPS")


# --------------------------------------------------------------------------- pins / versions

PINS = {"torch": "2.13.0", "transformers": "5.24.0", "deepspeed": "0.19.8",
        "nvidia-ml-py": "13.615.71", "flash-attn": None}


def test_pins_all_match_including_local_label():
    inst = {"torch": "2.13.0+cu130", "transformers": "5.24.0", "deepspeed": "0.19.8",
            "nvidia-ml-py": "13.615.71", "flash-attn": None}
    assert all(ok for _, ok, _ in F.compare_pins(PINS, inst))


def test_pins_mismatch_missing_and_unexpected():
    inst = {"torch": "2.12.1", "transformers": None, "deepspeed": "0.19.8",
            "nvidia-ml-py": "13.615.71", "flash-attn": "2.8.3"}
    res = {n: (ok, d) for n, ok, d in F.compare_pins(PINS, inst)}
    assert res["torch"] == (False, "installed 2.12.1 != pinned 2.13.0")
    assert res["transformers"][0] is False and "not installed" in res["transformers"][1]
    assert res["flash-attn"][0] is False and "2.8.3" in res["flash-attn"][1]
    assert res["deepspeed"][0] is True


def test_null_torch_pin_is_an_error():
    assert F.compare_pins({"torch": None}, {"torch": None})[0][1] is False


def test_versions_and_driver_compare():
    assert F.norm_version("2.13.0+cpu") == F.norm_version("2.13") == "2.13"
    assert F.driver_ok("580.65.06", "580.65.06")
    assert F.driver_ok("580.82.07", "580.65.06")
    assert not F.driver_ok("570.124.06", "580.65.06")
    assert not F.driver_ok("580.9", "580.65.06")  # numeric, not string, compare
    assert F.cuda_major_minor("13.0.3") == "13.0" and F.cuda_major_minor(None) is None
    assert F.canon_name("NVIDIA_ML_PY") == "nvidia-ml-py"


def test_arch_supported():
    archs = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert F.arch_supported((9, 0), archs) == (True, "exact sm_90")
    assert F.arch_supported((8, 9), archs) == (True, "binary-compatible sm_80")
    assert F.arch_supported((12, 0), archs)[0]
    assert F.arch_supported((7, 0), archs)[0] is False
    assert F.arch_supported((10, 3), ["sm_100a"])[0] is False  # 'a' SASS runs only on exactly sm_100
    assert F.arch_supported((10, 3), ["sm_90", "compute_90"]) == (True, "PTX JIT from compute_90")
    assert F.parse_arch("sm_100a") == ("sm", 10, 0, "a")


# --------------------------------------------------------------------------- shm / env helpers

def test_shm_threshold():
    assert not F.shm_ok(64 * 2 ** 20, 1024)  # Docker's default 64 MB
    assert F.shm_ok(1024 * 2 ** 20, 1024)
    assert F.shm_ok(8 * 2 ** 30, 1024)


def test_shm_check_fails_with_fix_hint(monkeypatch):
    monkeypatch.setattr(smoke_env, "shm_size", lambda path="/dev/shm": 64 * 2 ** 20)
    monkeypatch.setenv("SMOKE_MIN_SHM_MB", "1024")
    res = report.Result("env", "cpu")
    assert smoke_env.check_shm(res) is False
    assert any("--shm-size=8g" in d and "--ipc=host" in d for d in res.diagnosis)


def test_module_owners_and_torch_dirs(tmp_path):
    pd = {"pynvml": ["nvidia-ml-py", "nvidia-ml-py", "pynvml"], "torch": ["torch"]}
    assert smoke_env.module_owners("pynvml", pd) == ["nvidia-ml-py", "pynvml"]
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "torch").mkdir()
        (tmp_path / d / "torch" / "__init__.py").write_text("")
    paths = [str(tmp_path / "a"), str(tmp_path / "c"), str(tmp_path / "b"), str(tmp_path / "a")]
    assert len(smoke_env.torch_dirs_on_path(paths)) == 2


# --------------------------------------------------------------------------- report

def test_result_passed_and_json(tmp_path):
    r = report.Result("train", "cpu")
    r.add("a", True)
    r.add("skipped", None, "no GPU")
    assert r.passed
    r.add("b", False, "broken")
    d = r.finish().to_dict()
    assert d["passed"] is False and d["summary"].startswith("1 failed: b")
    path = report.write_json(str(tmp_path), "train", d)
    assert json.load(open(path))["items"][2] == {"name": "b", "ok": False, "detail": "broken"}
    assert not report.Result("x", "cpu").passed  # nothing ran is not a pass


def test_ops_arch_coverage_matches_cuda_rules():
    from smoke import ops

    archs = sorted(ops.parse_arch_list("8.0;9.0;10.0;12.0+PTX"))
    assert ("ptx", "12.0") in archs and ("sm", "12.0") in archs and ("ptx", "9.0") not in archs
    assert ops.runs_on(archs, "8.9") == "sm_80"          # same major, newer minor: SASS runs
    assert ops.runs_on(archs, "7.5") is None              # older than anything built
    assert ops.runs_on(archs, "12.1") == "sm_120"
    assert ops.runs_on([("sm", "8.0"), ("ptx", "9.0")], "10.0") == "compute_90 (PTX JIT)"


def test_ops_fatbin_of_a_library_without_gpu_code_is_empty():
    from smoke import ops

    assert ops.fatbin_archs(sys.executable) == []  # an ELF without .nv_fatbin


def test_ops_reads_deepspeeds_op_table_as_ds_report_prints_it():
    from smoke import ops

    text = ("--------------------------------------------------\n"
            "op name ................ installed .. compatible\n"
            "\x1b[92mfused_adam\x1b[0m ............. \x1b[92m[YES]\x1b[0m ...... \x1b[92m[OKAY]\x1b[0m\n"
            "async_io ............... [NO] ....... [NO]\n")
    assert ops.parse_ds_report(text) == {"fused_adam": "YES/OKAY", "async_io": "NO/NO"}
