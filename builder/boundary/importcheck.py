"""The import check (`resolve --import-check`): one entry's packages in a throwaway venv, the training surface
imported in it on the CPU, before any image is built.

What is installed is what the image gets: the tag's locks when they are current (torch.lock + requirements.lock,
`--require-hashes`; then DeepSpeed's sdist from deepspeed.lock, built with no ops against them), else the
resolution `resolve` just made (no hashes: the locks are stale or missing, and the log says so). Everything comes
from uv's shared cache (`uv cache dir`: $UV_CACHE_DIR, else ~/.cache/uv): torch's CUDA wheels and the nvidia-*
libraries are ~4.8 GB, downloaded once; after that the venv (4.9 GB, 24,000 files) is hardlinked from the cache in
seconds and adds ~2 MB of disk. Measured 2026-12-07 for cu130-torch2.13-bookworm on the 2-core machine, quiet: cold
cache 104 s in all (install 57 s: the download 42 s, DeepSpeed's wheel 15 s; imports 31 s), warm 46 s (install 4 s,
imports 31 s); with the machine busy the imports took 85 s. The venv lives under BUILDER_IMPORT_CHECK_DIR (else the
temp dir) and is removed afterwards. builder/data/import-check.py runs in it with CUDA_VISIBLE_DEVICES="",
DS_ACCELERATOR=cpu, DS_BUILD_OPS=0, Hugging Face offline and a HOME of its own; `verdict` turns a failed step into a
CompatError that names both packages.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from builder import log
from builder.boundary import process, uv
from builder.errors import CompatError, EnvironmentProblem, StepFailed
from builder.model.compat import uses_pypi
from builder.model.lockfile import DEEPSPEED_LOCK, LOCK, TORCH_LOCK
from builder.model.matrix import Entry

SCRIPT = Path(__file__).resolve().parent.parent / "data" / "import-check.py"
DIR_ENV = "BUILDER_IMPORT_CHECK_DIR"
VENV_TIMEOUT_S = 120
INSTALL_TIMEOUT_S = 1800  # a cold cache downloads several GB
RUN_TIMEOUT_S = 900  # the imports: 31 s on 2 quiet cores, 85 s on 2 busy ones (measured)
# Free space the venv needs where it is made: a hardlinked venv (same filesystem as uv's cache) is a few MB of
# links and bytecode; a copied one is the whole set (4.7 GB for cu130-torch2.13, measured). A cold cache also grows
# by about that much where it lives: uv reports a full disk there itself.
NEED_LINKED = 1 << 30
NEED_COPIED = 8 << 30
DEEPSPEED = "deepspeed"


@dataclass(frozen=True)
class Report:
    steps: tuple[dict, ...]  # the script's JSON lines, in order
    origin: str  # what was installed, for the log and the summary
    seconds: dict  # packages (torch.lock + requirements.lock), install (with DeepSpeed), imports
    venv_bytes: int  # the venv's size, files hardlinked from the cache included
    new_bytes: int  # what the venv added on disk (files not shared with the cache)
    cache: str

    @property
    def failed(self) -> list[dict]:
        return [s for s in self.steps if s.get("ok") is False]

    def summary(self) -> str:
        passed = sum(1 for s in self.steps if s.get("ok"))
        return (f"{passed} import steps ok; install {self.seconds['install']:.0f}s, imports "
                f"{self.seconds['imports']:.0f}s; from {self.origin}")


# --- the interpreter ---------------------------------------------------------------------------------------


def find_python(version: str) -> str:
    """An interpreter of `version` on this machine: uv's discovery (PATH, its own installs), then pyenv's
    versions (their shims answer only for the global version); none is exit 3 with what to install."""
    env = dict(os.environ, UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never")
    proc = process.run([uv.binary(), "python", "find", "--system", "--no-project", version], timeout=60, env=env)
    found = proc.stdout.strip()
    if proc.returncode == 0 and found and os.path.isfile(found):
        return found
    for candidate in pyenv_pythons(version):
        if os.access(candidate, os.X_OK):
            return candidate
    # A fresh machine whose OS ships another Python (Ubuntu 24.04's 3.12 for a 3.11 entry): uv's own managed
    # CPython, where its download host is reachable (it is not on this project's CI machines, which carry pyenv's).
    installed = process.run([uv.binary(), "python", "install", version], timeout=600,
                            env=dict(env, UV_PYTHON_DOWNLOADS="manual"))
    if installed.returncode == 0:
        proc = process.run([uv.binary(), "python", "find", "--no-project", version], timeout=60, env=env)
        if proc.returncode == 0 and os.path.isfile(proc.stdout.strip()):
            return proc.stdout.strip()
    raise EnvironmentProblem(f"no Python {version} on this machine (the entry's Python: the import check makes its "
                             "venv with it)", f"install it: apt-get install python{version}-venv, `uv python install "
                             f"{version}`, or `pyenv install {version}`")


def pyenv_pythons(version: str) -> list[str]:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))
    # The newest patch release first: 3.11.10 after 3.11.9 (numeric, not text order).
    return sorted(found, key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parents[1].name)], reverse=True)


# --- the venv ------------------------------------------------------------------------------------------------


def where() -> Path:
    base = os.environ.get(DIR_ENV) or tempfile.gettempdir()
    if not os.path.isdir(base):
        raise EnvironmentProblem(f"{DIR_ENV}={base} is not a directory", "point it at a directory on a disk with room")
    return Path(base)


def cache_dir(env: dict) -> str:
    proc = process.run([uv.binary(), "cache", "dir"], timeout=60, env=env, echo=False)
    return proc.stdout.strip() if proc.returncode == 0 else "(uv's default cache)"


def link_mode(base: Path, cache: str) -> str:
    """hardlink where the venv and uv's cache share a filesystem (uv's own default there), else copy (which uv
    falls back to anyway, with a warning per run)."""
    existing = Path(cache)
    while not existing.exists() and existing != existing.parent:  # no cache yet: uv makes it there on first use
        existing = existing.parent
    try:
        return "hardlink" if os.stat(base).st_dev == os.stat(existing).st_dev else "copy"
    except OSError:
        return "copy"


def require_room(base: Path, mode: str) -> None:
    need = NEED_LINKED if mode == "hardlink" else NEED_COPIED
    free = shutil.disk_usage(base).free
    if free < need:
        raise EnvironmentProblem(f"{free / 1e9:.1f} GB free under {base}; the import check's venv needs about "
                                 f"{need / 1e9:.0f} GB there ({mode} from uv's cache)",
                                 f"set {DIR_ENV} to a directory on a disk with room (on uv's cache's disk it is "
                                 "hardlinked: a few MB)")


def install_env(mode: str) -> dict:
    # DS_BUILD_OPS=0 and the CPU accelerator: DeepSpeed's sdist becomes a wheel of Python files, no compiler used.
    return dict(os.environ, UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never", UV_LINK_MODE=mode, DS_BUILD_OPS="0",
                DS_ACCELERATOR="cpu")


def index_args(entry: Entry) -> list[str]:
    args = ["--index-url", entry.index_url]
    if not uses_pypi(entry):  # the same index choice as the resolution (boundary/uv.py)
        args += ["--index-strategy", "unsafe-best-match", "--extra-index-url", "https://pypi.org/simple"]
    return args


def requirement_files(entry: Entry, lock_dir: Path | None, resolved: dict | None, tmp: Path
                      ) -> tuple[list[Path], Path | None, bool, str]:
    """(files installed first, DeepSpeed's file, hashed?, what they are): the locks, or the resolution written out.
    DeepSpeed is an sdist built without isolation, so it comes second, once torch and setuptools are in."""
    if lock_dir is not None:
        ds = lock_dir / DEEPSPEED_LOCK
        return ([lock_dir / TORCH_LOCK, lock_dir / LOCK], ds if ds.is_file() else None, True,
                f"{lock_dir}/ ({TORCH_LOCK}, {LOCK}, {DEEPSPEED_LOCK}; hash-checked)")
    first, ds = tmp / "resolved.txt", tmp / "deepspeed.txt"
    first.write_text("".join(f"{n}=={v}\n" for n, v in sorted(resolved.items()) if n != DEEPSPEED))
    ds.write_text(f"{DEEPSPEED}=={resolved[DEEPSPEED]}\n" if DEEPSPEED in resolved else "")
    return ([first], ds if DEEPSPEED in resolved else None, False,
            f"the resolution of {entry.tag} ({len(resolved)} packages; no hashes: the tag's locks are not current)")


def make_venv(python: str, venv: Path, env: dict) -> None:
    proc = process.run([uv.binary(), "venv", "--quiet", "--no-project", "--python", python, str(venv)],
                       timeout=VENV_TIMEOUT_S, env=env)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"cannot make a venv with {python}: {_last(proc.stderr)}",
                                 "is that interpreter complete (its venv module)?")


def install(entry: Entry, venv: Path, files: list[Path], hashed: bool, env: dict, build_isolation: bool = True
            ) -> None:
    """`uv pip install --no-deps -r FILE…` into the venv: offline first, from uv's cache alone, then online for
    what the cache lacks. Offline, a warm cache needs no network at all, and DeepSpeed's wheel is kept: uv files the
    wheel it built under a revision of the sdist's download, and PyPI's answers reach this project's machines through
    a proxy that drops their cache headers, so any online uv run that reads the sdist (the entry's `uv pip compile`,
    an online install) downloads it again under a new revision and builds the wheel again (31 s, measured)."""
    argv = [uv.binary(), "pip", "install", "--python", str(venv / "bin" / "python"), "--no-deps", "--no-progress",
            *(["--require-hashes"] if hashed else []), *([] if build_isolation else ["--no-build-isolation"])]
    for f in files:
        argv += ["-r", str(f)]
    if process.run([*argv, "--offline"], timeout=INSTALL_TIMEOUT_S, env=env).returncode == 0:
        return
    try:  # not all in the cache yet (the first run): fetch it, with uv's progress shown
        proc = process.run([*argv, *index_args(entry)], timeout=INSTALL_TIMEOUT_S, env=env, stream=True)
    except process.TimedOut:
        raise EnvironmentProblem(f"{entry.tag}: installing into the import check's venv took over "
                                 f"{INSTALL_TIMEOUT_S // 60} minutes", "is the index reachable?") from None
    if proc.returncode == 0:
        return
    text = proc.stdout
    if "No space left on device" in text:
        raise EnvironmentProblem(f"{entry.tag}: the disk filled up while installing the import check's venv",
                                 f"free space where uv's cache is, or set {DIR_ENV} to a larger disk")
    if uv._is_network(text):
        raise EnvironmentProblem(f"{entry.tag}: cannot reach {entry.index_url}: {_last(text)}",
                                 "check the network/proxy (SSL_CERT_FILE for an intercepting proxy)")
    raise StepFailed(f"{entry.tag}: installing into the import check's venv failed: {_last(text)}",
                     "the lines above are uv's")


def disk_use(venv: Path) -> tuple[int, int]:
    """(bytes of every file in the venv, bytes of those not hardlinked to uv's cache)."""
    total = new = 0
    for dirpath, _dirs, names in os.walk(venv):
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_size
            new += st.st_size if st.st_nlink == 1 else 0
    return total, new


# --- the imports -------------------------------------------------------------------------------------------


def script_env(venv: Path, home: Path) -> dict:
    """A clean environment: no stray PYTHONPATH or tokens from the caller, no GPU, no network for Hugging Face, no
    bytecode written into a venv that is removed next."""
    return {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
            "TMPDIR": str(home), "LANG": "C.UTF-8", "VIRTUAL_ENV": str(venv), "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": "",
            "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(home / "hf"), "TOKENIZERS_PARALLELISM": "false"}


def run_script(entry: Entry, venv: Path, home: Path) -> list[dict]:
    out = home / "import-check.jsonl"
    pins = json.dumps({k: v for k, v in entry.pins.items() if v})
    argv = [str(venv / "bin" / "python"), str(SCRIPT), "--out", str(out), "--pins", pins]
    proc = process.run(argv, timeout=RUN_TIMEOUT_S, env=script_env(venv, home), cwd=home, stream=True)
    steps = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.is_file() else []
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not any(s.get("ok") is False for s in steps)):
        last = steps[-1]["step"] if steps else "the start"
        raise StepFailed(f"{entry.tag}: the import check stopped (exit {proc.returncode}) after {last}: "
                         f"{_last(proc.stdout)}", "the lines above are its output")
    return steps


def check(entry: Entry, lock_dir: Path | None, resolved: dict | None) -> Report:
    """Install the entry's packages (the locks in `lock_dir`, else `resolved`) into a new venv and run the imports;
    a failed step raises (`verdict`)."""
    base = where()
    env = dict(os.environ, UV_NO_CONFIG="1")
    cache = cache_dir(env)
    mode = link_mode(base, cache)
    require_room(base, mode)
    seconds = {}
    with log.step(f"import check: Python {entry.python}") as note:
        python = find_python(entry.python)
        note["result"] = python
    tmp = Path(tempfile.mkdtemp(prefix=f"import-check-{entry.tag}-", dir=base))
    try:
        venv, home = tmp / "venv", tmp / "home"
        home.mkdir()
        files, ds, hashed, origin = requirement_files(entry, lock_dir, resolved, tmp)
        with log.step(f"import check: install {origin} ({mode} from uv's cache {cache})") as note:
            started = time.monotonic()
            make_venv(python, venv, install_env(mode))
            install(entry, venv, files, hashed, install_env(mode))
            seconds["packages"] = time.monotonic() - started
            # DeepSpeed: an sdist built without isolation, against the torch and setuptools just installed. uv keys
            # the wheel on the sdist alone, so an entry with another torch reuses it: with no ops built, the one
            # difference is the torch_info it records for ds_report (seen: 2.13 in a torch 2.6 venv), used by no import.
            if ds is not None:
                install(entry, venv, [ds], hashed, install_env(mode), build_isolation=False)
            seconds["install"] = time.monotonic() - started
            venv_bytes, new_bytes = disk_use(venv)
            note["result"] = (f"{venv_bytes / 1e9:.1f} GB venv, {new_bytes / 1e6:.0f} MB of it not from the cache; "
                              f"packages {seconds['packages']:.1f}s, deepspeed "
                              f"{seconds['install'] - seconds['packages']:.1f}s")
        with log.step(f"import check: the training surface on {entry.tag}") as note:
            started = time.monotonic()
            steps = run_script(entry, venv, home)
            seconds["imports"] = time.monotonic() - started
            report = Report(tuple(steps), origin, seconds, venv_bytes, new_bytes, cache)
            verdict(entry, report)  # inside the step: a failed import marks it ✕
            ran = [s for s in steps if s.get("ok") is not None]
            note["result"] = f"{sum(1 for s in ran if s['ok'])} of {len(ran)} steps ok" + (
                f", {len(steps) - len(ran)} skipped" if len(ran) < len(steps) else "")
    finally:
        remove(tmp)
    return report


def remove(tmp: Path) -> None:
    """rm -rf: ~24,000 files, 0.7 s where shutil.rmtree takes 3.5 s (measured); rmtree mops up what it left."""
    started = time.monotonic()
    try:
        process.run(["rm", "-rf", "--one-file-system", str(tmp)], timeout=300, echo=False)
    except EnvironmentProblem:  # no rm, or it hung: Python's own
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    log.info(f"import check: removed {tmp} ({time.monotonic() - started:.1f}s)")


# --- the verdict ---------------------------------------------------------------------------------------------


def verdict(entry: Entry, report: Report) -> None:
    """Raise for the first failed step: a CompatError naming both packages, or StepFailed where none is named."""
    failed = report.failed
    if not failed:
        return
    first = failed[0]
    more = "".join(f"\n  also: {sentence(entry, s)}" for s in failed[1:])
    consumer, provider = first.get("consumer"), first.get("provider")
    if provider is None and consumer is None:
        raise StepFailed(sentence(entry, first) + more, "no installed package is named: the check itself failed "
                         "(the frames above)")
    hint = ("change one of the two pins in matrix.yaml (then `python -m builder lock`), or add a rule to "
            "builder/data/compat.yaml so that validate refuses the pair" if consumer and provider else
            "it fails with the packages it was installed with: change its pin (the frames above show where)")
    raise CompatError(sentence(entry, first) + more, hint)


def sentence(entry: Entry, step: dict) -> str:
    """`cu121-torch2.3: transformers 4.44.2 cannot import is_mlu_available from accelerate 0.28.0 (accelerate.utils):
    ImportError: cannot import name …` — the tag, both packages at their versions, and the error line."""
    consumer, provider = _named(step.get("consumer")), _named(step.get("provider"))
    name, module = step.get("name"), step.get("module")
    error = f"{step.get('error')}: {_brief(step.get('message', ''))}"
    if consumer and provider:
        if step.get("error") in ("ImportError", "ModuleNotFoundError"):
            what = f"{name} from {provider} ({module})" if name else f"{module} from {provider}"
            return f"{entry.tag}: {consumer} cannot import {what}: {error}"
        at = f" at {module}" + (f".{name}" if name else "") if module else ""
        return f"{entry.tag}: {consumer} fails against {provider}{at}: {error}"
    one = provider or consumer
    if one:
        return f"{entry.tag}: {one} fails in `{step['step']}`: {error}"
    return f"{entry.tag}: `{step['step']}` failed: {error}"


def _named(dist: dict | None) -> str | None:
    return f"{dist['name']} {dist['version']}" if dist else None


def _brief(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _last(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in (text or "").splitlines() if line.strip()][-lines:]
    return _brief(" | ".join(kept)) or "(no output)"
