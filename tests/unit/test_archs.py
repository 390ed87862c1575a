"""Kernels that must exist (issue 45): the fatbin reader on binaries built here byte by byte, the coverage rule,
the judge on entries, and the committed data (builder/data/knowledge/archs.yaml) against compat.yaml."""

from __future__ import annotations

import re
import struct
import textwrap
import zipfile
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builder.derive import archs as derive
from builder.model import archs, compat
from builder.model.matrix import PACKAGES, Entry

# --- a synthetic ELF with fat binaries ------------------------------------------------------------------------

SASS, PTX = 2, 1
ZSTD = 0x8000


def fatbin_entry(kind: int, sm: int, flags: int = 0x11, payload: bytes = b"\x7fELF....", header: int = 64) -> bytes:
    """One entry: the 64-byte header cuobjdump reads (+ the extension CUDA 12.8+ writes for sm_100 and newer),
    the payload, padding to 8."""
    padded = payload + b"\0" * (-len(payload) % 8)
    head = struct.pack("<HHIQIIII", kind, 0x101, header, len(padded), len(payload), 0, 0x10008, sm)
    head += struct.pack("<IIQQQ", 0, 0, flags, 0, len(payload))
    return head + b"\0" * (header - 64) + padded


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", derive.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf(sections: dict[str, bytes]) -> bytes:
    """A little-endian ELF64 shared object with the given PROGBITS sections and a section name table."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
    body, headers, offset = b"", [struct.pack("<IIQQQQIIQQ", *[0] * 10)], 64
    for name, data in [*sections.items(), (".shstrtab", names)]:
        body += data + b"\0" * (-len(data) % 8)
        kind = 3 if name == ".shstrtab" else 1
        headers.append(struct.pack("<IIQQQQIIQQ", names.index(name.encode() + b"\0"), kind, 0, 0, offset,
                                   len(data), 0, 0, 8, 0))
        offset = 64 + len(body)
    head = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    head += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, 64 + len(body), 0, 64, 56, 0, 64, len(headers),
                        len(headers) - 1)
    return head + body + b"".join(headers)


FATBIN = (
    container(fatbin_entry(SASS, 80), fatbin_entry(SASS, 90, flags=0x100011),
              fatbin_entry(PTX, 90, flags=0x8011, payload=b"(\xb5/\xfd compressed ptx")) + b"\0" * 8
    + container(fatbin_entry(SASS, 100, flags=0x1208011, header=112), fatbin_entry(SASS, 120, header=96),
                fatbin_entry(7, 75))  # an entry kind that is neither PTX nor SASS: skipped
)


def test_fatbin_entries_of_a_synthetic_elf(tmp_path):
    lib = tmp_path / "libk.so"
    lib.write_bytes(elf({".text": b"\x90" * 24, ".nv_fatbin": FATBIN}))
    assert derive.binary_archs(lib) == {"sass": ["8.0", "9.0a", "10.0f", "12.0"], "ptx": ["9.0"]}


def test_relocatable_fatbin_is_read_and_other_sections_are_not(tmp_path):
    lib = tmp_path / "librdc.so"
    lib.write_bytes(elf({".rodata": container(fatbin_entry(SASS, 50)),  # a fatbin outside the CUDA sections
                         "__nv_relfatbin": container(fatbin_entry(SASS, 86), fatbin_entry(PTX, 86))}))
    assert derive.binary_archs(lib) == {"sass": ["8.6"], "ptx": ["8.6"]}


def test_a_library_without_gpu_code_has_empty_lists(tmp_path):
    lib = tmp_path / "libcpu.so"
    lib.write_bytes(elf({".text": b"\x90" * 16}))
    assert derive.binary_archs(lib) == {"sass": [], "ptx": []}


def test_a_damaged_container_stops_without_an_error():
    damaged = container(fatbin_entry(SASS, 80))[:-20] + struct.pack("<HHI", 2, 0x101, 8)  # header size 8: not real
    assert list(derive.fatbin_entries(damaged)) == [("sass", "8.0")]
    assert list(derive.fatbin_entries(b"no fatbin here")) == []


def test_wheel_archs_streams_the_library_out_of_the_wheel(tmp_path):
    wheel = tmp_path / "torch-2.0.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("torch/version.py", "cuda = '12.1'\n")
        z.writestr("torch/lib/libtorch_cuda_cu.so", elf({".nv_fatbin": container(fatbin_entry(SASS, 70))}))
    assert derive.wheel_archs(wheel) == {"sass": ["7.0"], "ptx": [], "partial": [],
                                         "member": "torch/lib/libtorch_cuda_cu.so"}
    assert derive._wheel_cuda(wheel) == "12.1"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("torch/lib/libtorch_cpu.so", b"")
    with pytest.raises(ValueError, match="libtorch_cuda.so"):
        derive.wheel_archs(wheel)


def test_linux_wheel_prefers_cp311_and_the_highest_build():
    files = [{"filename": f} for f in ("torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                                       "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl",
                                       "torch-2.10.0-cp312-cp312-manylinux_2_28_x86_64.whl",
                                       "torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl",
                                       "torch-2.10.0-cp313-cp313t-manylinux_2_28_x86_64.whl",
                                       "torch-2.10.0-cp311-none-macosx_11_0_arm64.whl")]
    assert derive.linux_wheel(files)["filename"] == "torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert derive.linux_wheel(files[2:3])["filename"].startswith("torch-2.10.0-cp312")
    assert derive.newest_finals({"2.0.0": [1], "2.0.1": [1], "2.1.0rc1": [1], "2.1.0": [], "1.13.1": [1],
                                 "2.10.0": [1]}, "2.0") == {"2.0": "2.0.1", "2.10": "2.10.0"}


# --- build scripts and flash-attn sources ----------------------------------------------------------------------

BUILD_CUDA = textwrap.dedent("""\
    TORCH_CUDA_ARCH_LIST="5.0;6.0;7.0"
    case ${CUDA_VERSION} in
        12.8)
            TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST//5.0;/};7.5;9.0;10.0;12.0+PTX"
            ;;
        12.4)
            if [[ "$GPU_ARCH_TYPE" = "cuda-aarch64" ]]; then
                TORCH_CUDA_ARCH_LIST="9.0"
            else
                TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST};9.0+PTX"  # a comment
            fi
            ;;
        12.6) TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST};8.0" ;;
        11.[67])
            TORCH_CUDA_ARCH_LIST="3.7;${TORCH_CUDA_ARCH_LIST}"
            ;;
        *)
            exit 1
            ;;
    esac
    if [[ -n "$OVERRIDE_TORCH_CUDA_ARCH_LIST" ]]; then
        TORCH_CUDA_ARCH_LIST="$OVERRIDE_TORCH_CUDA_ARCH_LIST"
    fi
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}
    """)


@pytest.mark.parametrize("cuda, listed", [("12.8", "6.0;7.0;7.5;9.0;10.0;12.0+PTX"), ("12.4", "5.0;6.0;7.0;9.0+PTX"),
                                          ("12.6", "5.0;6.0;7.0;8.0"), ("11.7", "3.7;5.0;6.0;7.0")])
def test_build_script_arch_list(cuda, listed):
    assert derive.script_arch_list(BUILD_CUDA, cuda) == listed


def test_build_script_without_the_cuda_is_an_error():
    with pytest.raises(ValueError, match="no case for CUDA 13.0"):
        derive.script_arch_list(BUILD_CUDA, "13.0")
    assert derive._script_cudas(BUILD_CUDA) == ["12.4", "12.6", "12.8"]
    assert derive.arch_list_to_archs("5.0;9.0;12.0+PTX") == {"sass": ["5.0", "9.0", "12.0"], "ptx": ["12.0"]}


def test_a_binary_and_its_build_script_compared():
    script = derive.arch_list_to_archs("8.0;9.0")
    assert derive.disagrees({"sass": ["8.0", "8.9", "9.0", "9.0a"], "ptx": [], "partial": ["8.9", "9.0a"]},
                            script) is None  # per-file kernels
    assert derive.partial(Counter({("sass", "8.0"): 100, ("sass", "9.0a"): 3, ("ptx", "9.0"): 100})) == ["9.0a"]
    assert "ptx ['9.0']" in derive.disagrees({"sass": ["8.0", "9.0"], "ptx": []}, derive.arch_list_to_archs(
        "8.0;9.0+PTX"))


SETUP_PY = textwrap.dedent("""\
    import os
    def cuda_archs():
        return os.getenv("FLASH_ATTN_CUDA_ARCHS", "80;90;100").split(";")
    if not SKIP_CUDA_BUILD and not IS_ROCM:
        cc_flag = []
        # cc_flag.append("arch=compute_75,code=sm_75")
        if "80" in cuda_archs():
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_80,code=sm_80")
        if bare_metal_version >= Version("11.8") and "90" in cuda_archs():
            cc_flag += ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"]
        if bare_metal_version >= Version("12.8") and "100" in cuda_archs():
            cc_flag.append("arch=compute_100,code=sm_100")
        if bare_metal_version >= Version("12.8") and "120" in cuda_archs():
            cc_flag.append("arch=compute_120,code=sm_120")
    """)
FLASH_API_OLD = textwrap.dedent("""\
    bool is_sm8x = dprops->major == 8 && dprops->minor >= 0;
    bool is_sm90 = dprops->major == 9 && dprops->minor == 0;
    TORCH_CHECK(is_sm90 || is_sm8x, "FlashAttention only supports Ampere GPUs or newer.");
    """)
FLASH_API_NEW = textwrap.dedent("""\
    auto [cc_major, cc_minor] = get_compute_capability(get_current_device());
    bool is_sm8x_min = cc_major >= 8;
    TORCH_CHECK(is_sm8x_min, "FlashAttention only supports Ampere GPUs or newer.");
    """)


def test_flash_attn_setup_py_read_without_running_it():
    row = derive.flash_attn_archs(SETUP_PY, FLASH_API_OLD, {"11": "11.8.0", "12": "12.9.1"})
    assert (row["sass"], row["ptx"]) == (["8.0", "9.0", "10.0"], ["9.0"])  # 120 is not in the default
    assert row["by_cuda"] == {"11": {"sass": ["8.0", "9.0"], "ptx": ["9.0"]}}
    assert row["runs_on"] == ["8.x", "9.0"] and row["min_capability"] == "8.0"
    assert [(g["arch"], g["min_nvcc"], g["selected"]) for g in row["gencode"]] == [
        ("8.0", None, True), ("9.0", "11.8", True), ("10.0", "12.8", True), ("12.0", "12.8", False)]
    unknown = derive.flash_attn_archs(SETUP_PY, FLASH_API_NEW)  # toolkits unread: every selected flag counts
    assert unknown["sass"] == ["8.0", "9.0", "10.0"] and unknown["runs_on"] == [">=8.0"] and "by_cuda" not in unknown


def test_flash_attn_check_that_cannot_be_read_is_an_error():
    with pytest.raises(ValueError, match="cannot read"):
        derive.flash_attn_runs_on('bool ok = props.major > 7;\nTORCH_CHECK(ok, "FlashAttention only supports '
                                  'Ampere GPUs or newer.");')
    with pytest.raises(ValueError, match="has no check"):
        derive.flash_attn_runs_on("")


def test_publish_yml_toolkits():
    text = textwrap.dedent("""\
        jobs:
          build_wheels:
            strategy:
              matrix:
                cuda-version: ['11.8.0', '12.1.0', '12.2.2', 'cpu']
                include:
                  - cuda-version: '116'
        """)
    assert derive.publish_nvcc(text) == {"11": "11.8.0", "12": "12.2.2"}


def test_rendered_yaml_round_trips():
    data = {"torch": {"2.7": {"12.6": {"sass": ["8.0", "9.0a"], "ptx": [], "source": "binary"}}}, "flash_attn": {}}
    text = derive.render(data)
    assert text.startswith("# GENERATED by `python -m builder refresh-compat --archs`")
    assert "sass: ['8.0', 9.0a]" in text or "sass: ['8.0', '9.0a']" in text
    import yaml

    assert yaml.safe_load(text) == data


# --- the coverage rule -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch, cap, ok", [
    ({"sass": ["8.0"]}, "8.6", True), ({"sass": ["8.6"]}, "8.0", False), ({"sass": ["8.0"]}, "9.0", False),
    ({"sass": ["9.0"], "ptx": ["9.0"]}, "12.0", True), ({"ptx": ["9.0"]}, "8.9", False),
    ({"sass": ["9.0a"]}, "9.0", True), ({"sass": ["10.0a"]}, "10.3", False), ({"ptx": ["9.0a"]}, "10.0", False),
    ({"sass": ["10.0f"]}, "10.3", True), ({"ptx": ["12.0f"]}, "12.1", True), ({"ptx": ["10.0f"]}, "12.0", False),
    ({"sass": [], "ptx": []}, "8.0", False)])
def test_covers(arch, cap, ok):
    assert archs.covers(arch, cap) is ok


CAPS = st.builds(lambda a, b: f"{a}.{b}", st.integers(3, 13), st.integers(0, 9))


@given(CAPS, CAPS)
def test_covers_is_the_cuda_compatibility_rule(built, gpu):
    b, g = archs._cap(built), archs._cap(gpu)
    assert archs.covers({"sass": [built]}, gpu) == (b[0] == g[0] and b[1] <= g[1])
    assert archs.covers({"ptx": [built]}, gpu) == (b <= g)
    assert archs.covers({"sass": [built + "a"]}, gpu) == (b == g)
    # More code never covers less, and PTX covers whatever the same SASS covers.
    assert archs.covers({"sass": [built], "ptx": [built]}, gpu) >= archs.covers({"sass": [built]}, gpu)


@pytest.mark.parametrize("guard, cap, ok", [(["8.x", "9.0"], "8.9", True), (["8.x", "9.0"], "10.0", False),
                                            (["8.x", "9.0"], "7.5", False), ([">=8.0"], "12.0", True),
                                            ([">=8.0"], "7.0", False)])
def test_flash_attn_runs_on(guard, cap, ok):
    assert archs.runs_on(guard, cap) is ok


# --- the judge on entries ----------------------------------------------------------------------------------------


def entry(torch: str, cuda: str, gpus=None, **pins) -> Entry:
    """An Entry as test_compat_corpus.complete builds one: only what the arch rules read matters."""
    values = {p: None for p in PACKAGES}
    values.update(torch=torch, **{k.replace("_", "-"): v for k, v in pins.items()})
    return Entry(tag="t", image="corpus/train", base="debian:bookworm-slim", python="3.12", cuda=cuda,
                 pins=values, index_url="https://pypi.org/simple", runner=("corpus",), gpus=gpus)


def outcomes(e: Entry, gpus, explicit=True) -> dict:
    return {(o.rule, gpu): o for o, gpu in zip(archs.evaluate(e, gpus, explicit),
                                               [g for g in gpus for _ in range(1 + bool(e.pins.get("flash-attn")))])}


def test_a_cu126_build_has_no_kernels_for_an_rtx_5090():
    e = entry("2.7.1", "12.6", gpus=("RTX5090", "H100"))
    found = outcomes(e, e.gpus)
    bad, good = found[("torch-archs", "RTX5090")], found[("torch-archs", "H100")]
    assert bad.ok is False and bad.field == "gpus" and archs.NO_KERNEL in bad.reason and "12.0" in bad.reason
    assert re.search(r"sha256 [0-9a-f]{64}", bad.source) and "torch-2.7.1-" in bad.source
    assert good.ok is True


def test_a_build_that_dropped_sm70_rejects_a_v100():
    row = archs.torch_archs("2.11.0", "13.0")  # CUDA 13 cannot compile sm_70 at all
    assert row and not archs.covers(row, "7.0")
    found = archs.evaluate(entry("2.11.0", "13.0"), ("V100",), explicit=False)
    assert [(o.rule, o.ok, o.field) for o in found] == [("torch-archs", False, "cuda")]


@pytest.mark.parametrize("gpu", ["T4", "V100"])
def test_flash_attn_below_its_minimum_capability(gpu):
    e = entry("2.7.1", "12.6", gpus=(gpu,), flash_attn="2.8.3")
    fa = outcomes(e, e.gpus)[("flash-attn-archs", gpu)]
    assert fa.ok is False and fa.field == "flash-attn" and archs.FA_REFUSES in fa.reason
    assert "flash_attn-2.8.3.tar.gz" in fa.source


def test_an_old_flash_attn_refuses_blackwell():
    e = entry("2.5.1", "12.4", gpus=("B200",), flash_attn="2.5.8")
    assert outcomes(e, e.gpus)[("flash-attn-archs", "B200")].ok is False


def test_a_data_gap_is_not_judged(monkeypatch):
    monkeypatch.setattr(archs, "data", lambda: {})
    found = archs.evaluate(entry("2.7.1", "12.6", flash_attn="2.8.3"), ("H100",), explicit=True)
    assert [(o.rule, o.ok) for o in found] == [("torch-archs", None), ("flash-attn-archs", None)]
    assert all("refresh-compat --archs" in o.reason for o in found)
    assert archs.default_gpus(entry("2.7.1", "12.6")) == tuple(compat.rules()["toolchain"]["claims"]["12"])


def test_unknown_gpus_are_left_to_the_gpu_known_rule():
    assert archs.evaluate(entry("2.7.1", "12.6"), ("NoSuchGPU",), explicit=True) == []


def test_default_gpus_are_what_the_builds_run_on():
    claims = compat.rules()["toolchain"]["claims"]
    plain = archs.default_gpus(entry("2.7.1", "12.6"))
    assert set(plain) <= set(claims["12"]) and "H100" in plain
    with_fa = archs.default_gpus(entry("2.7.1", "12.6", flash_attn="2.8.3"))
    assert "V100" not in with_fa and "T4" not in with_fa and "A100" in with_fa
    for e in (entry("2.7.1", "12.6"), entry("2.7.1", "12.6", flash_attn="2.8.3"), entry("2.13.0", "13.0"),
              entry("2.6.0", "12.4", flash_attn="2.7.4.post1")):
        gpus = archs.default_gpus(e)
        assert gpus and all(o.ok is not False for o in archs.evaluate(e, gpus, explicit=False)), e.pins


# --- the committed data -------------------------------------------------------------------------------------------


def test_every_torch_minor_has_its_pypi_build_read_from_the_binary():
    data = archs.data()
    for minor, facts in compat.rules()["torch"].items():
        row = data["torch"].get(minor, {}).get(facts["pypi_cuda"])
        assert row, f"torch {minor}: no row for its PyPI build cu{facts['pypi_cuda']}"
        assert row["source"] == "binary" and row["wheel"].startswith(f"torch-{minor}.") and row["sass"], minor


def test_every_row_carries_its_evidence():
    data = archs.data()
    for minor, builds in data["torch"].items():
        for cuda, row in builds.items():
            assert set(row["sass"]) | set(row["ptx"]), (minor, cuda)
            if row["source"] == "binary":
                assert re.fullmatch(r"[0-9a-f]{64}", row["sha256"]) and row["wheel"].endswith(".whl"), (minor, cuda)
            else:
                assert row["source"] == "build-script" and row["url"].startswith("https://github.com/"), (minor, cuda)
                assert derive.arch_list_to_archs(row["arch_list"]) == {k: row[k] for k in ("sass", "ptx")}
    for version, row in data["flash_attn"].items():
        assert re.fullmatch(r"[0-9a-f]{64}", row["sha256"]) and row["sdist"] == f"flash_attn-{version}.tar.gz"
        assert row["runs_on"] and row["min_capability"] and row["sass"], version


def test_every_flash_attn_release_of_compat_yaml_is_in_the_data():
    known = set(archs.data()["flash_attn"])
    assert set(compat.rules()["flash_attn"]["releases"]) <= known


def test_every_gpu_name_is_safe_and_has_a_capability():
    table = compat.rules()["toolchain"]["gpus"]["capability"]
    for gpu, cap in table.items():
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", gpu) and re.fullmatch(r"\d{1,2}\.\d", cap), gpu
    for major, gpus in compat.rules()["toolchain"]["claims"].items():
        assert set(gpus) <= set(table), major
