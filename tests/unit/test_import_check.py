"""`resolve --import-check`: the failure classification of builder/data/import-check.py (real error messages and
tracebacks), the venv, installs and environment boundary/importcheck.py builds (process.run stubbed), and the
CompatError a failed import becomes. The real venv and imports are tests/integration/test_import_check.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from pathlib import Path

import pytest

from builder import cli
from builder.boundary import importcheck, process
from builder.errors import CompatError, EnvironmentProblem, StepFailed
from builder.model import matrix
from builder.steps import resolve
from tests.conftest import ROOT

SCRIPT = ROOT / "builder" / "data" / "import-check.py"
SITE = "/tmp/import-check-x/venv/lib/python3.11/site-packages"
STDLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
TOPS = {"transformers": "transformers", "accelerate": "accelerate", "peft": "peft", "torch": "torch",
        "deepspeed": "deepspeed", "yaml": "pyyaml"}


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("import_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def owner(where: str):
    """What make_owner() answers in a venv holding TOPS: a file under site-packages, or a module name."""
    if where.startswith(SITE + "/"):
        return TOPS.get(where[len(SITE) + 1:].split("/")[0].split(".")[0])
    return None if "/" in where else TOPS.get(where.split(".")[0])


def at(*files: str) -> list[str]:
    return [f if f.startswith("/") else f"{SITE}/{f}" for f in files]


CALLEES = {"Accelerator": "accelerate", "LoraConfig": "peft", "HfTrainerDeepSpeedConfig": "transformers"}


def callee_owner(qualname: str):
    return CALLEES.get(qualname.split(".")[0])


# --- classification: real messages, real frames ----------------------------------------------------------------


def test_transformers_4_44_importing_a_name_accelerate_0_28_lacks(script):
    # Seen running this check: transformers 4.44.2 + accelerate 0.28.0 (is_mlu_available came in accelerate 0.29).
    message = ("cannot import name 'is_mlu_available' from 'accelerate.utils' "
               f"({SITE}/accelerate/utils/__init__.py)")
    frames = at("/work/main/builder/data/import-check.py", "transformers/utils/import_utils.py",
                f"{STDLIB}/importlib/__init__.py", "transformers/trainer.py")
    found = script.classify("ImportError", message, frames, owner)
    assert (found["consumer"], found["provider"]) == ("transformers", "accelerate")
    assert (found["name"], found["module"]) == ("is_mlu_available", "accelerate.utils")


def test_peft_importing_a_name_transformers_5_removed(script):
    # peft 0.17 + transformers 5 (compat.yaml rule peft-transformers5-hybridcache): the import is peft's, at import.
    message = f"cannot import name 'HybridCache' from 'transformers' ({SITE}/transformers/__init__.py)"
    frames = at("/work/main/builder/data/import-check.py", "peft/__init__.py", "peft/auto.py", "peft/peft_model.py")
    found = script.classify("ImportError", message, frames, owner)
    assert (found["consumer"], found["provider"], found["name"]) == ("peft", "transformers", "HybridCache")


def test_a_circular_import_message_names_the_module_and_its_path(script):
    message = ("cannot import name 'Trainer' from partially initialized module 'transformers' (most likely due to a "
               f"circular import) ({SITE}/transformers/__init__.py)")
    found = script.classify("ImportError", message, at("peft/tuners/lora/model.py"), owner)
    assert (found["consumer"], found["provider"], found["module"]) == ("peft", "transformers", "transformers")


def test_a_module_without_location_is_found_by_its_name(script):
    message = "cannot import name 'clear_device_cache' from 'accelerate.utils.memory' (unknown location)"
    found = script.classify("ImportError", message, at("peft/utils/other.py"), owner)
    assert (found["consumer"], found["provider"]) == ("peft", "accelerate")


def test_a_submodule_torch_dropped(script):
    # DeepSpeed 0.8 on torch 2.0: deepspeed/runtime/utils.py `from torch._six import inf`.
    found = script.classify("ModuleNotFoundError", "No module named 'torch._six'",
                            at("deepspeed/__init__.py", "deepspeed/runtime/engine.py", "deepspeed/runtime/utils.py"),
                            owner)
    assert (found["consumer"], found["provider"], found["module"]) == ("deepspeed", "torch", "torch._six")


def test_a_top_level_module_nothing_installs_is_named_itself(script):
    found = script.classify("ModuleNotFoundError", "No module named 'flash_attn'",
                            at("transformers/modeling_flash_attention_utils.py"), owner)
    assert (found["consumer"], found["provider"]) == ("transformers", "flash-attn")


def test_an_attribute_a_module_lacks(script):
    # DeepSpeed 0.12 on torch 2.0: deepspeed/runtime/compiler.py uses torch.compiler (torch 2.1).
    found = script.classify("AttributeError", "module 'torch' has no attribute 'compiler'",
                            at("deepspeed/__init__.py", "deepspeed/runtime/compiler.py"), owner)
    assert (found["consumer"], found["provider"], found["name"]) == ("deepspeed", "torch", "compiler")


def test_an_unexpected_keyword_names_the_callee_s_package(script):
    # transformers < 4.40 on accelerate 1.0 (compat.yaml rule transformers-accelerate1-dispatch-batches).
    message = "Accelerator.__init__() got an unexpected keyword argument 'dispatch_batches'"
    frames = at("/work/main/builder/data/import-check.py", "transformers/trainer.py")
    found = script.classify("TypeError", message, frames, owner, callee_owner)
    assert (found["consumer"], found["provider"], found["name"]) == ("transformers", "accelerate", "dispatch_batches")


def test_a_keyword_the_caller_passes_inside_its_own_package_still_names_the_caller(script):
    # The provider forwarding **kwargs to itself: the consumer is the innermost frame *outside* the provider.
    message = "LoraConfig.__init__() got an unexpected keyword argument 'use_dora'"
    frames = at("transformers/integrations/peft.py", "peft/config.py", "peft/mapping.py")
    found = script.classify("TypeError", message, frames, owner, callee_owner)
    assert (found["consumer"], found["provider"]) == ("transformers", "peft")


def test_an_attribute_an_object_lacks_names_its_class_s_package(script):
    message = "'HfTrainerDeepSpeedConfig' object has no attribute 'is_zero3'"
    found = script.classify("AttributeError", message, at("accelerate/utils/dataclasses.py"), owner, callee_owner)
    assert (found["consumer"], found["provider"]) == ("accelerate", "transformers")


def test_transformers_own_version_gate_names_the_package_it_requires(script):
    message = ("Using the `Trainer` with `PyTorch` requires `accelerate>=0.26.0`: Please run `pip install "
               "transformers[torch]` or `pip install 'accelerate>=0.26.0'`")
    found = script.classify("ImportError", message, at("transformers/training_args.py"), owner)
    assert (found["consumer"], found["provider"]) == ("transformers", "accelerate")


def test_an_unrecognised_error_takes_the_raiser_as_provider_and_the_next_package_out_as_consumer(script):
    frames = at("/work/main/builder/data/import-check.py", "deepspeed/comm/torch.py",
                f"{STDLIB}/functools.py", "torch/distributed/distributed_c10d.py")
    found = script.classify("RuntimeError", "Default process group has not been initialized", frames, owner)
    assert (found["consumer"], found["provider"]) == ("deepspeed", "torch")


def test_an_error_inside_one_package_names_only_that_package(script):
    found = script.classify("ValueError", "bad config", at("/work/main/builder/data/import-check.py",
                                                          "deepspeed/runtime/config.py"), owner)
    assert (found["consumer"], found["provider"]) == (None, "deepspeed")


def test_the_root_of_transformers_lazy_module_chain_is_the_import_error(script):
    try:
        try:
            raise ImportError("cannot import name 'is_mlu_available' from 'accelerate.utils'")
        except ImportError as e:
            raise RuntimeError("Failed to import transformers.trainer because of the following error") from e
    except RuntimeError as outer:
        assert type(script.root_cause(outer)) is ImportError
        assert script.root_cause(ValueError("x")).args == ("x",)


def test_a_live_failure_maps_real_files_and_callees_to_distributions(script):
    """In this interpreter: the path in the message and a callee found among loaded modules (pyyaml is installed)."""
    import yaml  # noqa: F401  (loaded, as a venv's packages are when they fail)

    live = script.make_owner()
    assert live(yaml.__file__) == "pyyaml" and live("yaml.constructor") == "pyyaml" and live(os.__file__) is None
    try:
        from yaml import no_such_name  # noqa: F401
    except ImportError as exc:
        result = script.failure("from yaml import no_such_name", exc, 0.1, live)
    assert result["provider"] == {"name": "pyyaml", "version": importlib.metadata.version("pyyaml")}
    assert result["consumer"] is None and result["name"] == "no_such_name" and result["frames"]
    try:
        yaml.safe_load("a: 1", no_such_keyword=1)
    except TypeError as exc:
        result = script.failure("safe_load", exc, 0.1, live)
    assert result["provider"]["name"] == "pyyaml" and result["name"] == "no_such_keyword"


def test_the_script_imports_nothing_of_builder():
    tree = ast.parse(SCRIPT.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {n for n in names if n.split(".")[0] in ("builder", "smoke", "tests")}


# --- the boundary: argv, environment, what is installed ----------------------------------------------------


@pytest.fixture
def entry():
    return matrix.load(ROOT / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]


class FakeProcesses:
    """process.run stubbed: records each call; the script's run writes `steps` as its JSON lines."""

    def __init__(self, steps=(), script_rc=None, offline_rc=0, install_rc=0, install_out=""):
        self.calls, self.steps, self.offline_rc = [], list(steps), offline_rc
        self.install_rc, self.install_out = install_rc, install_out
        self.script_rc = script_rc if script_rc is not None else int(any(s.get("ok") is False for s in self.steps))

    def __call__(self, argv, *, timeout, env=None, cwd=None, stream=False, echo=True, **_kw):
        argv = [str(a) for a in argv]
        self.calls.append({"argv": argv, "env": env, "timeout": timeout, "cwd": cwd})
        if argv[1:3] == ["cache", "dir"]:
            return process.Result(0, "/nonexistent/uv-cache\n", "", "")
        if argv[-1].endswith("import-check.py") or "--out" in argv:
            out = Path(argv[argv.index("--out") + 1])
            out.write_text("".join(json.dumps(s) + "\n" for s in self.steps))
            return process.Result(self.script_rc, "✓ import torch\n", "", "")
        if "--offline" in argv:
            rc = self.offline_rc if "--no-build-isolation" in argv else self.install_rc
            return process.Result(rc, "", "error: not in the cache", "")
        if argv[1:3] == ["pip", "install"]:
            return process.Result(self.install_rc, self.install_out, "", "")
        return process.Result(0, "", "", "")

    def named(self, *words):
        return [c for c in self.calls if all(w in c["argv"] for w in words)]


OK_STEPS = [{"step": "import torch", "ok": True, "seconds": 1.0, "detail": "torch 2.13.0"},
            {"step": "import flash_attn", "ok": None, "skipped": "needs a GPU driver"}]


@pytest.fixture
def checkdir(tmp_path, monkeypatch):
    where = tmp_path / "checks"
    where.mkdir()
    monkeypatch.setenv(importcheck.DIR_ENV, str(where))
    monkeypatch.setattr(importcheck.uv, "binary", lambda: "/venv/bin/uv")
    monkeypatch.setattr(importcheck, "find_python", lambda version: f"/usr/bin/python{version}")
    return where


def test_current_locks_are_installed_hash_checked_then_deepspeed_built_against_them(entry, checkdir, monkeypatch):
    fake = FakeProcesses(OK_STEPS)
    monkeypatch.setattr(process, "run", fake)
    report = importcheck.check(entry, ROOT / "locks" / entry.tag, None)
    venv_call = fake.named("venv")[0]["argv"]
    assert venv_call[:2] == ["/venv/bin/uv", "venv"] and venv_call[-3:-1] == ["--python", "/usr/bin/python3.11"]
    venv = Path(venv_call[-1])
    assert venv.parent.parent == checkdir
    first = fake.named("pip", "install", "--require-hashes")[0]["argv"]
    assert "--no-deps" in first and "--offline" in first and "--no-build-isolation" not in first
    assert [first[i + 1] for i, a in enumerate(first) if a == "-r"] == [
        str(ROOT / "locks" / entry.tag / "torch.lock"), str(ROOT / "locks" / entry.tag / "requirements.lock")]
    assert first[first.index("--python") + 1] == str(venv / "bin" / "python")
    ds = fake.named("--offline", "--no-build-isolation")[0]
    assert ds["argv"][ds["argv"].index("-r") + 1].endswith("deepspeed.lock")
    assert ds["env"]["DS_BUILD_OPS"] == "0" and ds["env"]["DS_ACCELERATOR"] == "cpu"
    assert len(fake.named("pip", "install")) == 2  # all from the cache: no online install
    assert report.origin.endswith("hash-checked)") and report.failed == []
    assert not any(checkdir.iterdir()), "the venv is removed afterwards"


def test_the_script_runs_on_the_cpu_offline_in_a_clean_environment(entry, checkdir, monkeypatch):
    fake = FakeProcesses(OK_STEPS)
    monkeypatch.setattr(process, "run", fake)
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    importcheck.check(entry, ROOT / "locks" / entry.tag, None)
    call = fake.named("--out")[0]
    argv, env = call["argv"], call["env"]
    assert argv[0].endswith("/venv/bin/python") and argv[1] == str(SCRIPT)
    assert json.loads(argv[argv.index("--pins") + 1])["transformers"] == entry.pins["transformers"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["DS_ACCELERATOR"] == "cpu" and env["DS_BUILD_OPS"] == "0"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    assert Path(env["HOME"]).parent.parent == checkdir and call["cwd"] == Path(env["HOME"])
    assert env["PATH"].startswith(argv[0].rsplit("/", 1)[0] + os.pathsep)
    assert "PYTHONPATH" not in env and "HF_TOKEN" not in env
    assert call["timeout"] == importcheck.RUN_TIMEOUT_S


def test_stale_locks_install_the_resolution_without_hashes(entry, checkdir, monkeypatch):
    fake = FakeProcesses(OK_STEPS, offline_rc=2)  # DeepSpeed's wheel not cached yet: built online
    written = {}
    monkeypatch.setattr(process, "run", fake)
    original = importcheck.requirement_files

    def spy(*args):
        files, ds, hashed, origin = original(*args)
        written.update(first=files[0].read_text(), ds=ds.read_text())
        return files, ds, hashed, origin

    monkeypatch.setattr(importcheck, "requirement_files", spy)
    report = importcheck.check(entry, None, {"torch": "2.13.0", "deepspeed": "0.19.8", "setuptools": "80.0"})
    assert written == {"first": "setuptools==80.0\ntorch==2.13.0\n", "ds": "deepspeed==0.19.8\n"}
    installs = fake.named("pip", "install")
    assert not any("--require-hashes" in c["argv"] for c in installs)
    online = [c["argv"] for c in installs if "--no-build-isolation" in c["argv"] and "--offline" not in c["argv"]]
    assert len(online) == 1 and "--index-url" in online[0]
    assert "no hashes" in report.origin


def test_the_venv_is_hardlinked_from_the_cache_on_its_filesystem_else_copied(tmp_path):
    cache = tmp_path / "not-yet" / "uv"  # uv makes it on first use: its filesystem is its parent's
    assert importcheck.link_mode(tmp_path, str(cache)) == "hardlink"


def test_too_little_room_is_exit_3_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(importcheck.shutil, "disk_usage", lambda _p: type("U", (), {"free": 2 << 30})())
    importcheck.require_room(tmp_path, "hardlink")
    with pytest.raises(EnvironmentProblem) as caught:
        importcheck.require_room(tmp_path, "copy")
    assert caught.value.exit_code == 3 and importcheck.DIR_ENV in caught.value.hint


def test_a_full_disk_or_an_unreachable_index_while_installing_is_exit_3(entry, checkdir, monkeypatch):
    for out, words in (("error: No space left on device (os error 28)", "disk filled up"),
                       ("error: Failed to fetch: https://pypi.org/simple/torch/", "cannot reach")):
        monkeypatch.setattr(process, "run", FakeProcesses(OK_STEPS, install_rc=2, install_out=out))
        with pytest.raises(EnvironmentProblem) as caught:
            importcheck.check(entry, ROOT / "locks" / entry.tag, None)
        assert caught.value.exit_code == 3 and words in caught.value.message
    assert not any(checkdir.iterdir())


def test_a_script_that_dies_without_a_finding_is_a_failed_step(entry, checkdir, monkeypatch):
    monkeypatch.setattr(process, "run", FakeProcesses(OK_STEPS[:1], script_rc=139))
    with pytest.raises(StepFailed) as caught:
        importcheck.check(entry, ROOT / "locks" / entry.tag, None)
    assert "stopped (exit 139) after import torch" in caught.value.message


def test_python_from_uv_else_pyenv_s_newest_patch_else_exit_3(tmp_path, monkeypatch):
    monkeypatch.setattr(importcheck.uv, "binary", lambda: "/venv/bin/uv")
    monkeypatch.setattr(process, "run", lambda argv, **kw: process.Result(2, "", "error: no interpreter", ""))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    for version in ("3.10.9", "3.10.13", "3.11.7"):
        exe = tmp_path / "versions" / version / "bin" / f"python{version.rsplit('.', 1)[0]}"
        exe.parent.mkdir(parents=True)
        exe.write_text("")
        exe.chmod(0o755)
    assert importcheck.find_python("3.10") == str(tmp_path / "versions/3.10.13/bin/python3.10")
    with pytest.raises(EnvironmentProblem) as caught:
        importcheck.find_python("3.12")
    assert caught.value.exit_code == 3 and caught.value.message.startswith("no Python 3.12 on this machine")
    assert "uv python install 3.12" in caught.value.hint


# --- the verdict ----------------------------------------------------------------------------------------------


FAILED = {"step": "from transformers import Trainer, TrainingArguments", "ok": False, "error": "ImportError",
          "message": "cannot import name 'is_mlu_available' from 'accelerate.utils' (accelerate/utils/__init__.py)",
          "consumer": {"name": "transformers", "version": "4.44.2"},
          "provider": {"name": "accelerate", "version": "0.28.0"}, "name": "is_mlu_available",
          "module": "accelerate.utils", "frames": ["transformers/trainer.py:221 in <module>"]}


def report(*steps):
    return importcheck.Report(tuple(steps), "locks", {"install": 1.0, "imports": 2.0}, 0, 0, "/cache")


def test_a_failed_import_is_exit_2_naming_the_tag_both_packages_and_the_error(entry):
    with pytest.raises(CompatError) as caught:
        importcheck.verdict(entry, report(OK_STEPS[0], FAILED))
    assert caught.value.exit_code == 2
    assert caught.value.message == (
        "cu130-torch2.13-bookworm: transformers 4.44.2 cannot import is_mlu_available from accelerate 0.28.0 "
        "(accelerate.utils): ImportError: cannot import name 'is_mlu_available' from 'accelerate.utils' "
        "(accelerate/utils/__init__.py)")
    assert caught.value.hint.startswith("change one of the two pins")


def test_other_failures_are_named_too_and_listed_after_the_first(entry):
    typed = dict(FAILED, step="Trainer", error="TypeError", name="dispatch_batches", module="Accelerator.__init__",
                 message="Accelerator.__init__() got an unexpected keyword argument 'dispatch_batches'")
    alone = dict(FAILED, step="import deepspeed", error="ValueError", message="bad", consumer=None, name=None,
                 provider={"name": "deepspeed", "version": "0.19.8"})
    with pytest.raises(CompatError) as caught:
        importcheck.verdict(entry, report(typed, alone))
    first, also = caught.value.message.split("\n")
    assert first == ("cu130-torch2.13-bookworm: transformers 4.44.2 fails against accelerate 0.28.0 at "
                     "Accelerator.__init__.dispatch_batches: TypeError: Accelerator.__init__() got an unexpected "
                     "keyword argument 'dispatch_batches'")
    assert also == "  also: cu130-torch2.13-bookworm: deepspeed 0.19.8 fails in `import deepspeed`: ValueError: bad"


def test_a_failure_naming_no_package_is_a_failed_step_not_a_pin_problem(entry):
    nobody = dict(FAILED, consumer=None, provider=None)
    with pytest.raises(StepFailed) as caught:
        importcheck.verdict(entry, report(nobody))
    assert caught.value.exit_code == 1
    importcheck.verdict(entry, report(*OK_STEPS))  # passes: nothing raised


# --- the step and the Makefile ----------------------------------------------------------------------------------


def test_resolve_import_check_through_the_cli_is_exit_2_on_a_failed_import(project, monkeypatch, capsys):
    seen = []

    def check(entry, lock_dir, resolved):
        seen.append((entry.tag, lock_dir, resolved))
        importcheck.verdict(entry, report(FAILED))

    monkeypatch.setattr(importcheck, "check", check)
    monkeypatch.setattr(resolve, "resolve", lambda entry: {"torch": "2.13.0"})
    monkeypatch.setattr(resolve.uv, "binary", lambda: "/venv/bin/uv")
    assert cli.main(["resolve", "--import-check", "cu130-torch2.13-bookworm"]) == 2
    assert seen == [("cu130-torch2.13-bookworm", None, {"torch": "2.13.0"})]  # no locks in the project: resolved
    err = capsys.readouterr().err
    assert "error: cu130-torch2.13-bookworm: transformers 4.44.2 cannot import is_mlu_available" in err
    assert "hint: change one of the two pins" in err


def test_current_locks_are_checked_without_resolving_again(monkeypatch, entry):
    seen = []
    monkeypatch.setattr(resolve, "resolve", lambda e: pytest.fail("resolved again"))
    monkeypatch.setattr(resolve.lockfile, "python_problems", lambda e, d: [])
    monkeypatch.setattr(importcheck, "check", lambda e, d, r: seen.append((d, r)) or report(OK_STEPS[0]))
    done = resolve.run(entry, resolve.Options(import_check=True))
    assert seen == [(Path("locks") / entry.tag, None)] and done.result == "imports ok"


def test_make_build_runs_the_import_check_of_the_tag_it_builds_first():
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\nbuild: ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert recipe[0].strip() == "$(PY) -m builder resolve --import-check $(or $(TAG),$(DEFAULT_TAG))"
    assert recipe[1].strip().startswith("$(PY) -m builder build $(or $(TAG),$(DEFAULT_TAG))")


def test_the_script_writes_one_json_line_per_step_and_exits_1_on_a_failure(script, tmp_path, monkeypatch, capsys):
    def fails():
        from yaml import no_such_name  # noqa: F401

    monkeypatch.setattr(script, "STEPS", (("import torch", lambda: "torch 2.13.0", None),
                                          ("from yaml import no_such_name", fails, None),
                                          ("import datasets", lambda: "not pinned: not run", "datasets")))
    out = tmp_path / "steps.jsonl"
    assert script.main(["--out", str(out), "--pins", '{"flash-attn": "2.8.3"}']) == 1
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(s["step"], s["ok"]) for s in steps] == [("import torch", True), ("from yaml import no_such_name", False),
                                                     ("import flash_attn", None)]
    assert steps[1]["provider"]["name"] == "pyyaml" and steps[1]["error"] == "ImportError"
    shown = capsys.readouterr().out
    assert "✓ import torch" in shown and "✕ from yaml import no_such_name" in shown and "skipped (needs a GPU" in shown
    with pytest.raises(SystemExit):
        script.main(["--pins", "{}"])
