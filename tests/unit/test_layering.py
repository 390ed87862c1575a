"""Imports point one way: CLI → steps → model/boundary; smoke/ stands alone (it runs inside images).

The few step → step edges are listed with their reason; a new one fails here until it is argued for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Edges between step modules that are part of the design, each with why.
ALLOWED_STEP_EDGES = {
    ("build", "diff"): "a build over its size budget names the packages that grew, as builder diff shows them",
    ("build", "preflight"): "before BuildKit: committed files complete, every source reachable or mirrored",
    ("publish", "audit"): "publish --max-severity runs the same vulnerability audit before any push",
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", modules("builder"), ids=rel)
def test_nothing_below_the_cli_imports_it(path):
    if rel(path) in ("builder/cli.py", "builder/__main__.py"):
        return
    assert not {i for i in imports_of(path) if i == "builder.cli" or i.startswith("builder.cli.")}, \
        f"{rel(path)} imports the CLI: pass what it needs as options instead"


@pytest.mark.parametrize("path", modules("builder"), ids=rel)
def test_argparse_stops_at_the_cli(path):
    if rel(path) == "builder/cli.py":
        return
    assert "argparse" not in imports_of(path), f"{rel(path)} imports argparse: take a frozen Options dataclass"


@pytest.mark.parametrize("path", modules("builder/model"), ids=rel)
def test_model_is_pure(path):
    bad = {i for i in imports_of(path) if i.startswith(("builder.steps", "builder.boundary", "builder.runner",
                                                           "builder.reports", "docker", "subprocess"))}
    assert not bad, f"{rel(path)} (the pure model) imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules("builder/derive"), ids=rel)
def test_derive_reads_artifacts_below_the_steps(path):
    # Where knowledge comes from (pip-audit's `service/`): it may fetch through the boundary and produce the
    # model's data, but no step and no runner sits below it, and the judge (model/) never imports it.
    bad = {i for i in imports_of(path) if i.startswith(("builder.steps", "builder.runner", "builder.reports"))}
    assert not bad, f"{rel(path)} (a knowledge source) imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules("builder/model"), ids=rel)
def test_the_judge_does_not_derive(path):
    bad = {i for i in imports_of(path) if i.startswith("builder.derive")}
    assert not bad, f"{rel(path)} (the pure model) imports {sorted(bad)}: judge from the committed data"


@pytest.mark.parametrize("path", modules("builder/boundary"), ids=rel)
def test_boundary_does_not_know_the_steps(path):
    bad = {i for i in imports_of(path) if i.startswith(("builder.steps.", "builder.runner", "builder.reports"))}
    assert not bad, f"{rel(path)} (the Docker/registry boundary) imports {sorted(bad)}"


# Only builder/boundary/ starts processes or talks over the network, through its one runner (process.py) and
# its clients (web, registry, engine): masking, time limits and the unit-test guard each live in one place.
# urllib.parse is text only (quote, urljoin) and stays allowed. builder/data/ holds scripts run inside images.
BOUNDARY_ONLY = ("subprocess", "socket", "requests", "docker", "multiprocessing", "pty", "urllib.request",
                 "urllib.error", "http.client", "http.server", "asyncio.subprocess")
OS_PROCESS_CALLS = ("system", "popen", "fork", "forkpty", "exec", "spawn", "posix_spawn")
OUTSIDE_BOUNDARY = [p for p in modules("builder") if not rel(p).startswith(("builder/boundary/", "builder/data/"))]


@pytest.mark.parametrize("path", OUTSIDE_BOUNDARY, ids=rel)
def test_only_the_boundary_imports_process_and_network_modules(path):
    bad = {i for i in imports_of(path) if i in ("urllib", "http") or any(
        i == name or i.startswith(name + ".") for name in BOUNDARY_ONLY)}
    assert not bad, f"{rel(path)} imports {sorted(bad)}: run commands through builder.boundary.process and HTTP " \
                    "through builder.boundary.web (or another boundary module)"


@pytest.mark.parametrize("path", OUTSIDE_BOUNDARY, ids=rel)
def test_only_the_boundary_starts_programs_through_os(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr.startswith(OS_PROCESS_CALLS)}
    assert not calls, f"{rel(path)} starts programs with os.{sorted(calls)}: use builder.boundary.process.run"


def test_the_boundary_check_sees_every_spelling_of_an_import(tmp_path):
    """The checks above would pass vacuously if `imports_of` missed a spelling: each of these must be caught."""
    sample = tmp_path / "sample.py"
    sample.write_text("import subprocess as sp\nfrom urllib import request\nimport http.client\n"
                      "def f():\n    import requests\n    from docker import errors\n")
    found = imports_of(sample)
    assert {"subprocess", "urllib.request", "http.client", "requests", "docker"} <= found


def test_only_one_place_in_builder_starts_a_process():
    """Inside the boundary too: one Popen (process.py), every other module goes through it."""
    starters = [rel(p) for p in modules("builder") if "Popen(" in p.read_text() or "subprocess.run(" in p.read_text()]
    assert starters == ["builder/boundary/process.py"]


@pytest.mark.parametrize("path", modules("builder/steps"), ids=rel)
def test_steps_do_not_reach_into_each_other(path):
    me = path.stem
    others = {i.split(".")[2] for i in imports_of(path) if i.startswith("builder.steps.") and len(i.split(".")) > 2}
    others -= {me, "Done"}
    unexplained = {o for o in others if (me, o) not in ALLOWED_STEP_EDGES}
    assert not unexplained, f"{rel(path)} imports step module(s) {sorted(unexplained)}: share through builder/model or "\
                            "builder/boundary, or read the artifact that step wrote"


@pytest.mark.parametrize("path", modules("smoke"), ids=rel)
def test_smoke_imports_nothing_of_builder(path):
    bad = {i for i in imports_of(path) if i == "builder" or i.startswith("builder.")}
    assert not bad, f"{rel(path)} runs inside images, where builder/ is not: it imports {sorted(bad)}"


def test_every_registered_step_has_the_shape():
    import dataclasses
    import importlib

    from builder import flags
    from builder.steps import VERBS

    assert len({verb.name for verb in VERBS}) == len({verb.module for verb in VERBS}) == len(VERBS)
    for verb in VERBS:
        module = importlib.import_module(f"builder.steps.{verb.module}")
        assert dataclasses.is_dataclass(module.Options) and module.Options.__dataclass_params__.frozen, verb.name
        # What the CLI cannot fill from a flag must have a default, or the verb could never be built.
        flagged = {field for field, _ in flags.declared(module.Options)}
        for f in dataclasses.fields(module.Options):
            nested = isinstance(f.metadata.get("builder.flag"), type)
            assert f.name in flagged or nested or f.default is not dataclasses.MISSING, f"{verb.name}: {f.name}"
        for attr in ("prepare", "run") if verb.per_tag else ("main",):
            assert callable(getattr(module, attr, None)), f"{verb.module} lacks {attr}"
