"""Tests that need a real child process (moved from tests/unit/, whose tests may not start one): the
`python -m builder` entry point itself, scripts that run inside images (smoke/installed.py, compile-new.py), a
second process holding a tag, a fresh interpreter's imports, and the reference tools (hadolint, dpkg).
Cheap: no Docker engine and no network; they run with the rest of tests/integration/ in `make test`."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from builder import reports
from tests.conftest import ROOT, hadolint, run_cli
from tests.unit.test_diff import DEB_PAIRS

# --- the entry point -----------------------------------------------------------------------------------


def test_help_lists_the_verbs():
    out = subprocess.run([sys.executable, "-m", "builder", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    for verb in ("validate", "list", "matrix", "resolve", "lock", "render", "build", "smoke"):
        assert verb in out.stdout


def test_subprocess_exit_code_and_no_traceback(project):
    (project / "matrix.yaml").write_text("entries: [1\n")
    proc = subprocess.run([sys.executable, "-m", "builder", "validate"], capture_output=True, text=True, cwd=project,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: matrix.yaml:") and "Traceback" not in proc.stderr


def test_no_engine_is_exit_3_with_how_to_start(tmp_path):
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/nothing.sock")
    proc = subprocess.run([sys.executable, "-m", "builder", "build", "cu130-torch2.13-bookworm"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "no Docker engine answers" in proc.stderr and "dockerd" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_build_without_tags_is_a_user_error():
    proc = subprocess.run([sys.executable, "-m", "builder", "build"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "pass --all" in proc.stderr


def test_real_repository_check_from_a_subprocess():
    """What `make lint` and CI run, on the checkout itself."""
    proc = subprocess.run([sys.executable, "-m", "builder", "lock", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- a second process, a fresh interpreter, scripts that run inside images ---------------------------


CHILD = """
import signal, sys, time
from builder import cli
from builder.boundary import process
signal.signal(signal.SIGTERM, cli._terminate)  # as `python -m builder` installs it
process.run([sys.executable, "-c", "import time; time.sleep(120)", sys.argv[1]], timeout=200, stream=True)
"""


@pytest.mark.parametrize("sig,raised", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "Terminated")],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_on_the_echoed_command_line_leaves_no_child_behind(sig, raised):
    """A user who presses Ctrl-C the moment `+ docker build …` is printed, or a runner that cancels the job then
    (SIGTERM), must not leave the command running unowned: an orphaned `docker build` finishes and moves the tag.
    Twenty tries at that instant, each followed by a look for the child."""
    from tests.integration.images import default_sigint

    for attempt in range(20):
        marker = f"orphan-check-{os.getpid()}-{sig}-{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", CHILD, marker], cwd=ROOT, stderr=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True, preexec_fn=default_sigint)
        line = proc.stderr.readline()
        assert line.startswith("+ ") and marker in line, line
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (-signal.SIGINT, 1, 130), err[-1500:]
        assert raised in err, err[-1500:]
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        assert left == [], f"try {attempt}: the command outlived the Ctrl-C (pids {left})"


def test_one_process_per_tag(project, capsys):
    """A second run on a tag that another process is working on stops with exit 3 and names the holder;
    when the holder dies, even by kill -9, the tag is free again."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom builder import fsutil\n"
         "with fsutil.tag_lock('cu130-torch2.13-bookworm', 'build'):\n    print('held', flush=True)\n"
         "    time.sleep(60)\n"], cwd=project, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_cli("lock", "cu130-torch2.13-bookworm") == 3
        err = capsys.readouterr().err
        assert f"`build` (pid {holder.pid}) is working on this tag right now" in err
        # `lock --check` only reads the committed locks: it runs beside the build instead of waiting for it.
        run_cli("lock", "--check", "cu130-torch2.13-bookworm")
        assert "is working on this tag" not in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    from builder import fsutil
    with fsutil.tag_lock("cu130-torch2.13-bookworm", "lock"):  # free again: no EnvironmentProblem
        pass


def test_smoke_modules_do_not_import_torch():
    # The gate must import (and report) even when torch itself is broken: torch, deepspeed
    # and transformers are imported inside functions only.
    code = ("import sys, smoke.cli, smoke.env, smoke.train, smoke.nccl, smoke.launch\n"
            "bad = [m for m in ('torch', 'deepspeed', 'transformers', 'peft') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_inventory_script_output_matches_the_schema():
    """smoke/installed.py is what `build` runs in every image; run it here for real (no torch here: the
    schema must still hold, with torch_error saying why)."""
    proc = subprocess.run([sys.executable, str(ROOT / "smoke/installed.py")], capture_output=True, text=True,
                          timeout=120)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("INSTALLED-JSON "))
    data = json.loads(line.removeprefix("INSTALLED-JSON "))
    assert reports.problems("installed", data, smoke=True) == []


def test_compile_new_compiles_the_recorded_files_of_new_and_upgraded_packages(tmp_path):
    """An upgraded package keeps its directory (setuptools over the venv's own): its files must be compiled too,
    hash-checked, replacing a timestamped .pyc an import wrote meanwhile; packages that did not change are left."""
    import importlib.util
    import struct

    site = tmp_path / "site"
    for dist, module in (("old-1.0", "old"), ("up-1.0", "up")):
        (site / module).mkdir(parents=True)
        (site / module / "__init__.py").write_text("X = 1\n")
        (site / f"{dist}.dist-info").mkdir()
        (site / f"{dist}.dist-info" / "RECORD").write_text(f"{module}/__init__.py,,\n")
    (tmp_path / "before").write_text("\n".join(sorted(p.name for p in site.iterdir())) + "\n")
    (site / "up-1.0.dist-info").rename(site / "up-2.0.dist-info")  # the step upgraded `up`
    (site / "up" / "__init__.py").write_text("X = 2\n")
    stale = site / "up" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    stale.parent.mkdir()
    stale.write_bytes(importlib.util.MAGIC_NUMBER + b"\0" * 12)  # timestamp-based, as an import writes it
    script = ROOT / "builder" / "data" / "compile-new.py"
    subprocess.run([sys.executable, "-S", str(script), str(site), str(tmp_path / "before")], check=True)
    assert struct.unpack("<I", stale.read_bytes()[4:8])[0] == 3, "checked-hash .pyc, forced over the stale one"
    assert not (site / "old" / "__pycache__").exists(), "an unchanged package is not touched"


def test_compile_new_takes_bytecode_from_its_cache_only_for_the_same_source_at_the_same_path(tmp_path):
    """A pin change reinstalls every pin: the files that did not change get the bytes a compile writes, from the
    cache; a changed file, or a cache entry that does not match its source, is compiled."""
    import importlib.util

    script = ROOT / "builder" / "data" / "compile-new.py"
    cache, site = tmp_path / "cache", tmp_path / "site"

    def install(version: str, text: str) -> tuple[str, dict]:
        """The site as a pin step leaves it: `pkg` at `version`, its files' bytecode compiled with the cache."""
        shutil.rmtree(site, ignore_errors=True)
        (site / "pkg").mkdir(parents=True)
        (site / "pkg" / "same.py").write_text("def f():\n    return {'a': 1, 'b': (2, 3)}\n")
        (site / "pkg" / "changed.py").write_text(text)
        (site / f"pkg-{version}.dist-info").mkdir()
        # gone.py: a RECORDed file that is not there is skipped, with the cache as without it (compileall's way)
        (site / f"pkg-{version}.dist-info" / "RECORD").write_text("pkg/same.py,,\npkg/changed.py,,\npkg/gone.py,,\n")
        (tmp_path / "before").write_text("")
        out = subprocess.run([sys.executable, "-S", str(script), str(site), str(tmp_path / "before"), str(cache)],
                             check=True, capture_output=True, text=True).stdout
        pycs = {name: (pyc.read_bytes(), pyc.stat().st_mode)
                for name in ("same", "changed")
                for pyc in [Path(importlib.util.cache_from_source(str(site / "pkg" / f"{name}.py")))]}
        return out, pycs

    first_out, first = install("1.0", "X = 1\n")
    assert "3 of 3 files compiled (hash-checked), 0 of them from the cache" in first_out
    second_out, second = install("2.0", "X = 2\n")
    assert "1 of them from the cache" in second_out
    assert second["same"] == first["same"], "a cached .pyc: the same bytes and mode as the compile wrote"
    assert second["changed"] != first["changed"]
    fresh = tmp_path / "fresh.pyc"
    py_compile.compile(str(site / "pkg" / "changed.py"), cfile=str(fresh), dfile=str(site / "pkg" / "changed.py"),
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert second["changed"][0] == fresh.read_bytes()
    for entry in cache.rglob("*.pyc"):  # an entry that is not this source's bytecode is never used
        entry.write_bytes(entry.read_bytes()[:8] + b"\0" * 8 + b"garbage")
    third_out, third = install("3.0", "X = 2\n")
    assert "0 of them from the cache" in third_out and third == second


def test_compile_new_warms_the_cache_from_a_prefix_with_the_bytes_a_compile_at_the_final_path_writes(tmp_path):
    """The pins stage installs under a prefix and compiles each file into the cache as if at its venv path; the
    python stage, which copies the files there, then takes every .pyc from the cache: the bytes py_compile writes
    at that path (real stdlib modules, so constants, nested code and line tables are all in them)."""
    import importlib.util
    import json

    script = ROOT / "builder" / "data" / "compile-new.py"
    cache, prefix, venv = tmp_path / "cache", tmp_path / "pins" / "site", tmp_path / "venv" / "site"
    sources = {"pkg/decoder.py": Path(json.decoder.__file__).read_text(),
               "pkg/encoder.py": Path(json.encoder.__file__).read_text(),
               "pkg/broken.py": "def f(:\n"}  # does not compile: source-only, as pip leaves it
    for site in (prefix, venv):
        for name, text in sources.items():
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_text(text)
        (site / "pkg-1.0.dist-info").mkdir()
        (site / "pkg-1.0.dist-info" / "RECORD").write_text("".join(f"{n},,\n" for n in sources) + "../../bin/x.py,,\n")

    def run(*args: Path | str) -> str:
        return subprocess.run([sys.executable, "-S", str(script), *map(str, args)], check=True, capture_output=True,
                              text=True).stdout

    assert f"2 of 3 files in the cache for {venv}, 0 of them there already" in run("--warm", prefix, venv, cache)
    assert "2 of 3 files in the cache for " in (again := run("--warm", prefix, venv, cache))
    assert "2 of them there already" in again
    assert not list(prefix.rglob("*.pyc")), "nothing is compiled beside the prefix's files"
    (tmp_path / "before").write_text("")
    assert "2 of 3 files compiled (hash-checked), 2 of them from the cache" in run(venv, tmp_path / "before", cache)
    pycs = {name: Path(importlib.util.cache_from_source(str(venv / name))) for name in sources}
    from_cache = {name: pyc.read_bytes() for name, pyc in pycs.items() if pyc.exists()}
    assert sorted(from_cache) == ["pkg/decoder.py", "pkg/encoder.py"]
    # The reference: what the step writes with no cache, compile-new.py's own compile at the venv path. Not a compile
    # in this test's process: marshal flags an object that something else holds (FLAG_REF), and pytest has json
    # imported, so the same source gives other bytes here than in a fresh interpreter.
    for pyc in from_cache:
        pycs[pyc].unlink()
    assert "2 of 3 files compiled (hash-checked)" in run(venv, tmp_path / "before")
    assert {name: pycs[name].read_bytes() for name in from_cache} == from_cache


# --- reference tools ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", sorted((ROOT / "dockerfiles").glob("*/Dockerfile")), ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile):
    # Ignored, each with its reason in the template: DL3008 (apt versions come from apt.lock, which
    # hadolint cannot see) and SC2046 (word splitting of that package list is intended).
    proc = subprocess.run([hadolint(), "--failure-threshold", "warning", str(dockerfile)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_actually_catches_problems(tmp_path):
    bad = tmp_path / "Dockerfile"
    shutil.copy(ROOT / "dockerfiles/cu130-torch2.13-bookworm/Dockerfile", bad)
    bad.write_text(bad.read_text() + "RUN apt-get install curl\n")
    proc = subprocess.run([hadolint(), "--failure-threshold", "warning", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3015" in proc.stdout


@pytest.mark.skipif(not shutil.which("dpkg"), reason="dpkg (the reference implementation) is not installed")
@pytest.mark.parametrize("a,b,expected", DEB_PAIRS)
def test_debian_version_order_agrees_with_dpkg(a, b, expected):
    op = {-1: "lt", 0: "eq", 1: "gt"}[expected]
    assert subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0
