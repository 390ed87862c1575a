"""`lock --check` on a copy of the real repository: every lock (Python, apt, flash-attn) must be present,
pinned and current against matrix.yaml, or the entry must declare a visible exception. Exit 1 names tag and file.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from builder import fsutil
from builder.errors import StepFailed, UserError
from builder.model import compat, lockfile, matrix
from builder.steps import lock
from tests.conftest import ROOT, run_cli

CI_TAG = "cu130-torch2.13-bookworm"
FA_TAG = "cu128-torch2.8"          # flash-attn with a sourced hash
EXC_TAG = "cu121-torch2.3"         # declared exceptions: apt (base not runnable) and flash-attn (no sourced hash)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """The real matrix and committed dockerfiles/ and locks/, copied; cwd is the copy."""
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(ROOT / "dockerfiles", tmp_path / "dockerfiles")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check(capsys, *tags: str) -> tuple[int, str]:
    code = run_cli("lock", "--check", *tags)
    return code, capsys.readouterr().err


def test_the_real_repository_passes_and_lists_its_exceptions(repo, capsys):
    code, err = check(capsys)
    assert code == 0
    assert f"{EXC_TAG}: lock exception: apt.lock: nvidia/cuda bases cannot be pulled" in err
    assert f"{CI_TAG}: lock exception" not in err


@pytest.mark.parametrize("tag,name", [(CI_TAG, "apt.lock"), (CI_TAG, "requirements.lock"), (CI_TAG, "torch.lock"),
                                      (FA_TAG, "flash-attn.lock"), (EXC_TAG, "flash-attn.lock"),
                                      (EXC_TAG, "apt.lock")])
def test_a_deleted_lock_fails_naming_tag_and_file(repo, capsys, tag, name):
    (repo / "locks" / tag / name).unlink()
    code, err = check(capsys)
    assert code == 1
    assert f"error: {tag}: locks/{tag}/{name} is missing" in err


def test_an_unpinned_apt_lock_fails(repo, capsys):
    path = repo / "locks" / CI_TAG / "apt.lock"
    path.write_text(path.read_text().replace("g++=4:12.2.0-3\n", "g++\n"))
    code, err = check(capsys, CI_TAG)
    assert code == 1
    assert f"{CI_TAG}: locks/{CI_TAG}/apt.lock has unpinned packages: g++" in err


def test_an_apt_lock_without_snapshot_fails(repo, capsys):
    path = repo / "locks" / CI_TAG / "apt.lock"
    path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                            if not line.startswith("# snapshot:")))
    code, err = check(capsys, CI_TAG)
    assert code == 1 and f"locks/{CI_TAG}/apt.lock records no archive snapshot" in err


def test_an_unhashed_flash_attn_lock_fails(repo, capsys):
    path = repo / "locks" / FA_TAG / "flash-attn.lock"
    path.write_text("".join(line.replace(" \\", "") for line in path.read_text().splitlines(keepends=True)
                            if "--hash=" not in line))
    code, err = check(capsys, FA_TAG)
    assert code == 1
    assert f"{FA_TAG}: locks/{FA_TAG}/flash-attn.lock is unpinned" in err


def test_an_unhashed_python_lock_fails(repo, capsys):
    path = repo / "locks" / CI_TAG / "requirements.lock"
    lines = path.read_text().splitlines(keepends=True)
    first = lines.index("peft==0.21.2 \\\n")
    last = first + 1
    while lines[last].startswith("    --hash="):
        last += 1
    path.write_text("".join(lines[:first] + ["peft==0.21.2\n"] + lines[last:]))
    code, err = check(capsys, CI_TAG)
    assert code == 1 and f"locks/{CI_TAG}/requirements.lock is unpinned: peft has no hash" in err


def test_a_pin_changed_in_the_matrix_makes_the_python_lock_stale(repo, capsys):
    text = (repo / "matrix.yaml").read_text()
    tail = text[text.index(f"- tag: {CI_TAG}"):]
    (repo / "matrix.yaml").write_text(text.replace(tail, tail.replace("peft: 0.21.2", "peft: 0.21.1")))
    code, err = check(capsys, CI_TAG)
    assert code == 1
    assert f"locks/{CI_TAG}/requirements.lock is stale: it has peft==0.21.2, the matrix 0.21.1" in err


def test_a_base_changed_in_the_matrix_makes_apt_lock_stale(repo, capsys):
    text = (repo / "matrix.yaml").read_text()
    (repo / "matrix.yaml").write_text(text.replace("3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251",
                                                   "0" * 64))
    code, err = check(capsys, CI_TAG)
    assert code == 1 and f"locks/{CI_TAG}/apt.lock is stale: it was made for another base" in err


def test_a_flash_attn_version_change_makes_its_lock_stale(repo, capsys):
    text = (repo / "matrix.yaml").read_text()
    tail = text[text.index(f"- tag: {FA_TAG}"):]
    (repo / "matrix.yaml").write_text(text.replace(tail, tail.replace("flash-attn: 2.8.3\n",
                                                                      "flash-attn: 2.8.3.post1\n", 1)))
    code, err = check(capsys, FA_TAG)
    assert code == 1
    assert f"locks/{FA_TAG}/flash-attn.lock is stale: it does not pin https://github.com/Dao-AILab/" \
           "flash-attention/releases/download/v2.8.3.post1/" in err


def test_removing_an_exception_makes_the_unpinned_lock_fail(repo, capsys):
    text = (repo / "matrix.yaml").read_text()
    start = text.index(f"- tag: {EXC_TAG}")
    begin = text.index("    lock_exceptions:", start)
    (repo / "matrix.yaml").write_text(text[:begin] + text[text.index("\n\n", begin) + 1:])
    code, err = check(capsys, EXC_TAG)
    assert code == 1
    assert f"{EXC_TAG}: locks/{EXC_TAG}/apt.lock has unpinned packages" in err
    assert f"{EXC_TAG}: locks/{EXC_TAG}/flash-attn.lock is unpinned" in err


def test_an_exception_for_a_complete_lock_is_itself_stale(repo, capsys):
    text = (repo / "matrix.yaml").read_text()
    tail = text[text.index(f"- tag: {CI_TAG}"):]
    extra = tail.replace("    ci: true\n", '    ci: true\n    lock_exceptions: {apt.lock: "not needed"}\n')
    (repo / "matrix.yaml").write_text(text.replace(tail, extra))
    code, err = check(capsys, CI_TAG)
    assert code == 1 and f"locks/{CI_TAG}/apt.lock is pinned: remove its lock_exceptions entry" in err


def test_exceptions_are_data_for_the_catalog():
    entries = matrix.load(ROOT / "matrix.yaml").by_tag()
    assert lockfile.exceptions(entries[CI_TAG]) == []
    assert [line.split(":", 1)[0] for line in lockfile.exceptions(entries[EXC_TAG])] == ["apt.lock", "flash-attn.lock"]


def test_an_exception_must_name_an_exceptable_lock(repo, capsys):
    text = (repo / "matrix.yaml").read_text()
    (repo / "matrix.yaml").write_text(text.replace('      apt.lock: "nvidia', '      torch.lock: "nvidia', 1))
    code, err = check(capsys)
    assert code == 2
    assert "field 'lock_exceptions': 'torch.lock' cannot be excepted" in err


# --- `lock` for flash-attn: the recorded, sourced hash, re-derived where GitHub answers ---------------------

def _unreachable(url):
    raise OSError("Name or service not known")


def test_lock_keeps_the_sourced_hash_where_github_is_unreachable(tmp_path):
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[FA_TAG]
    assert lock._lock_flash_attn(entry, tmp_path, fetch=_unreachable) == "locked"
    text = (tmp_path / lock.FLASH_LOCK).read_text()
    assert text == (ROOT / "locks" / FA_TAG / lock.FLASH_LOCK).read_text()
    assert text.count("# sha256 source: ") >= 2


def test_lock_fails_when_github_serves_other_bytes_naming_both_hashes(tmp_path):
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[FA_TAG]
    with pytest.raises(StepFailed) as exc:
        lock._lock_flash_attn(entry, tmp_path, fetch=lambda url: "ab" * 32)
    assert f"downloaded {'ab' * 32}, recorded f25da18657a87fc8" in exc.value.message
    assert not (tmp_path / lock.FLASH_LOCK).exists()


def test_lock_adds_its_own_derivation_to_the_sources_when_they_agree(tmp_path):
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[FA_TAG]
    recorded = lock.recorded_wheels()
    url = next(u for u in recorded if "2.8.3+cu12torch2.8" in u)
    lock._lock_flash_attn(entry, tmp_path, fetch=lambda u: recorded[url]["sha256"])
    assert "re-derived by `builder lock` from GitHub" in (tmp_path / lock.FLASH_LOCK).read_text()


def test_lock_without_a_sourced_hash_needs_a_declared_exception(tmp_path):
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[EXC_TAG]
    assert lock._lock_flash_attn(entry, tmp_path, fetch=_unreachable) == "exception"
    text = (tmp_path / lock.FLASH_LOCK).read_text()
    assert "# EXCEPTION: no two public sources" in text and "--hash" not in text
    bare = dataclasses.replace(entry, lock_exceptions={})
    with pytest.raises(UserError) as exc:
        lock._lock_flash_attn(bare, tmp_path, fetch=_unreachable)
    assert "no sourced sha256 for https://github.com/Dao-AILab/" in exc.value.message


def test_every_recorded_hash_has_at_least_two_sources():
    for url, record in lock.recorded_wheels().items():
        assert len(record["sha256"]) == 64 and int(record["sha256"], 16) >= 0, url
        assert len(record["sources"]) >= 2, url


def test_a_flash_attn_exception_only_where_the_wheel_has_no_sourced_hash():
    """Every matrix entry with flash-attn either locks a recorded (>= 2 sources) wheel or declares why not."""
    recorded = lock.recorded_wheels()
    for entry in matrix.load(ROOT / "matrix.yaml").entries:
        if not entry.pins.get("flash-attn"):
            continue
        url = compat.derive(entry)["flash_attn_wheel"]
        assert (url in recorded) != (lock.FLASH_LOCK in entry.lock_exceptions), (entry.tag, url)


TRIXIE_TAG = "cu124-torch2.6-trixie"  # nvcc from Debian's archive: ops-apt.lock
DEBS_TAG = "cu124-torch2.6-bookworm"  # nvcc from Debian 13's .debs, unpacked on Debian 12: ops-deb.lock


@pytest.mark.parametrize("tag,name", [(CI_TAG, "nvcc.lock"), (TRIXIE_TAG, "ops-apt.lock"), (CI_TAG, "ops.lock"),
                                      (CI_TAG, "deepspeed.lock"), (DEBS_TAG, "ops-deb.lock")])
def test_a_missing_toolchain_lock_fails(repo, capsys, tag, name):
    """Every lock the Dockerfile copies is checked, the ops stage's included (a build would stop at COPY)."""
    (repo / "locks" / tag / name).unlink()
    code, err = check(capsys, tag)
    assert code == 1 and f"error: {tag}: locks/{tag}/{name} is missing" in err


def test_an_nvcc_lock_made_for_another_python_is_stale(repo, capsys):
    path = repo / "locks" / CI_TAG / "nvcc.lock"
    path.write_text(path.read_text().replace(" python=3.11 ", " python=3.12 "))
    code, err = check(capsys, CI_TAG)
    assert code == 1 and f"locks/{CI_TAG}/nvcc.lock is stale: it was not made for cuda-toolkit[nvcc,cccl]==" in err


def test_an_ops_apt_lock_made_for_another_base_is_stale(repo, capsys):
    path = repo / "locks" / TRIXIE_TAG / "ops-apt.lock"
    path.write_text(path.read_text().replace("# base: debian:trixie-slim@", "# base: debian:bookworm-slim@"))
    code, err = check(capsys, TRIXIE_TAG)
    assert code == 1 and f"locks/{TRIXIE_TAG}/ops-apt.lock is stale: it was made for another base" in err


def test_a_toolchain_lock_the_entry_does_not_use_is_stale(repo, capsys):
    shutil.copy(repo / "locks" / CI_TAG / "nvcc.lock", repo / "locks" / TRIXIE_TAG / "nvcc.lock")
    code, err = check(capsys, TRIXIE_TAG)
    assert code == 1 and f"locks/{TRIXIE_TAG}/nvcc.lock is stale: this entry's toolchain does not use it" in err



def test_lock_check_runs_while_a_build_holds_the_tag(repo, capsys):
    """Read-only: `lock --check` takes no tag lock, so a running build of the tag does not stop it; a
    writing step of that tag still does (exit 3, naming the holder)."""
    with fsutil.tag_lock(CI_TAG, "build"):
        code, err = check(capsys, CI_TAG)
        assert code == 0, err
        assert run_cli("lock", "--no-apt", CI_TAG) == 3
        assert "`build` (pid" in capsys.readouterr().err


# --- ops-deb.lock: .debs of another suite, unpacked (toolchain.nvcc kind debian-unpacked) -------------------

def _edit_debs(repo, old: str, new: str) -> None:
    path = repo / "locks" / DEBS_TAG / "ops-deb.lock"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))


def test_the_committed_ops_deb_lock_pins_each_deb_by_pool_path_and_sha256():
    text = (ROOT / "locks" / DEBS_TAG / "ops-deb.lock").read_text()
    rows = [lockfile.DEB_LINE.match(line) for line in text.splitlines() if not line.startswith("#")]
    nvcc = compat.nvcc_source(matrix.load(ROOT / "matrix.yaml").by_tag()[DEBS_TAG])
    assert all(rows) and [r["name"] for r in rows] == nvcc["packages"]
    assert "libcuda1" not in text and "libc6" not in text  # what apt would have pulled in: never unpacked
    assert rows[0]["name"] == "nvidia-cuda-toolkit" and rows[0]["version"].startswith("12.4.131")
    assert "# index: http://deb.debian.org/debian trixie main contrib non-free\n" in text
    assert lockfile.snapshot(text)


@pytest.mark.parametrize("old,new,message", [
    ("d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0", "d846838f",
     "has a malformed line (want NAME VERSION pool/PATH.deb SHA256): nvidia-cuda-dev "),
    ("libnvvm4 12.4.131", "libnvvm5 12.4.131", "is stale: it lacks libnvvm4"),
    ("nvidia-cuda-toolkit 12.4.131~12.4.1-2 ", "nvidia-cuda-toolkit 12.8.93~12.8.1-1 ",
     "is stale: nvidia-cuda-toolkit 12.8.93~12.8.1-1 is not nvcc 12.4.131"),
    (" trixie main contrib non-free", " bookworm main contrib non-free", "is stale: it was not taken from trixie"),
    ("# base: debian:bookworm-slim@", "# base: debian:trixie-slim@", "is stale: it was made for another base"),
])
def test_a_damaged_ops_deb_lock_fails_naming_what(repo, capsys, old, new, message):
    _edit_debs(repo, old, new)
    code, err = check(capsys, DEBS_TAG)
    assert code == 1 and f"error: {DEBS_TAG}: locks/{DEBS_TAG}/ops-deb.lock {message}" in err


def test_an_ops_deb_lock_without_snapshot_fails(repo, capsys):
    path = repo / "locks" / DEBS_TAG / "ops-deb.lock"
    path.write_text("".join(ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith("# snapshot")))
    code, err = check(capsys, DEBS_TAG)
    assert code == 1 and "ops-deb.lock records no archive snapshot" in err


# Recorded `apt-cache show --no-all-versions` output of trixie's index (2026-12-04), trimmed to the fields used.
TRIXIE_SHOW = """Package: libcudart12
Version: 12.4.127~12.4.1-2
Depends: libc6 (>= 2.34)
Filename: pool/non-free/n/nvidia-cuda-toolkit/libcudart12_12.4.127~12.4.1-2_amd64.deb
SHA256: 361b3721cf84bf068e111ff013c819de61cb475268b0d38db99839471f1b4130

Package: nvidia-cuda-toolkit
Version: 12.4.131~12.4.1-2
Filename: pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb
SHA256: cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319
"""


def test_debs_are_read_from_the_index_in_the_rules_order():
    debs = lockfile.parse_debs(TRIXIE_SHOW, ["nvidia-cuda-toolkit", "libcudart12"])
    assert [d.name for d in debs] == ["nvidia-cuda-toolkit", "libcudart12"]
    assert debs[1].line() == ("libcudart12 12.4.127~12.4.1-2 pool/non-free/n/nvidia-cuda-toolkit/"
                              "libcudart12_12.4.127~12.4.1-2_amd64.deb "
                              "361b3721cf84bf068e111ff013c819de61cb475268b0d38db99839471f1b4130\n")
    assert all(lockfile.DEB_LINE.match(d.line().rstrip("\n")) for d in debs)
    with pytest.raises(ValueError, match="no .deb with a sha256 for libnvvm4$"):
        lockfile.parse_debs(TRIXIE_SHOW, ["nvidia-cuda-toolkit", "libnvvm4"])


def _locked_from(monkeypatch, tmp_path, shown: str) -> str:
    """lock's ops-deb step on `shown` (the suite index's answer, recorded: unit tests have no network)."""
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[DEBS_TAG]
    nvcc = dict(compat.nvcc_source(entry), packages=["nvidia-cuda-toolkit", "libcudart12"])
    monkeypatch.setattr(lock.apt, "show_from_suite", lambda *args: shown)
    lock._lock_ops_debs(entry, nvcc, tmp_path, "debian:bookworm-slim")
    return (tmp_path / lockfile.OPS_DEB_LOCK).read_text()


def test_lock_writes_one_line_per_deb_and_keeps_its_snapshot_date_while_nothing_moves(monkeypatch, tmp_path):
    first = _locked_from(monkeypatch, tmp_path, TRIXIE_SHOW)
    assert first.splitlines()[-2].startswith("nvidia-cuda-toolkit 12.4.131~12.4.1-2 pool/non-free/")
    dated = first.replace(lockfile.snapshot(first)["ts"], "20200101T000000Z")
    (tmp_path / lockfile.OPS_DEB_LOCK).write_text(dated)
    assert _locked_from(monkeypatch, tmp_path, TRIXIE_SHOW) == dated  # same .debs: the file is untouched


def test_lock_refuses_a_suite_whose_nvcc_moved_on(monkeypatch, tmp_path):
    moved = TRIXIE_SHOW.replace("Version: 12.4.131~12.4.1-2", "Version: 12.8.93~12.8.1-1")
    with pytest.raises(UserError, match="trixie now has nvidia-cuda-toolkit 12.8.93~12.8.1-1, not 12.4.131"):
        _locked_from(monkeypatch, tmp_path, moved)


def test_an_ops_lock_without_setuptools_is_stale_where_torch_pulls_none(repo, capsys):
    """Python < 3.12: torch pulls no setuptools, and the venv's bundled one cannot bdist_wheel the DeepSpeed ops;
    an ops.lock made before setuptools was added must fail the check, not the build an hour later."""
    tag = "cu124-torch2.6-bookworm"
    assert "setuptools" not in lockfile.parse_blocks((repo / "locks" / tag / "torch.lock").read_text())
    path = repo / "locks" / tag / "ops.lock"
    blocks = lockfile.parse_blocks(path.read_text())
    path.write_text(path.read_text().replace(blocks["setuptools"].text, ""))
    code, err = check(capsys, tag)
    assert code == 1 and "ops.lock is stale: neither it nor torch.lock pins setuptools" in err
