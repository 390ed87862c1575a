"""Names that must exist: the AST walk that finds what a package imports from another (and which of those
references its own guards make optional), the static read of what a provider module binds, the index's ranges,
and the judgment on entries. No network: packages are small trees written here; the committed index is read."""

from __future__ import annotations

import io
import json
import tarfile
import textwrap
import zipfile

import pytest

from builder.derive import api, api_index
from builder.model import compat, names
from tests.unit.test_compat_corpus import CORPUS, complete

STACK = {"torch": "torch", "accel": "accel", "consumer": "consumer"}


def tree(root, files: dict[str, str], top: str = "consumer"):
    """A wheel holding `files` (path -> source), read back as the Package the index reads."""
    whl = root / f"{top}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for rel, text in files.items():
            z.writestr(rel, textwrap.dedent(text))
    return api.Package.read(whl, [top])


def uses_of(tmp_path, files, surface=("consumer",)):
    pkg = tree(tmp_path, files)
    return {(u.path, u.phase) for u in api.uses(pkg, "consumer", surface, STACK)}


def test_unguarded_imports_and_attribute_chains_are_uses_with_their_phase(tmp_path):
    found = uses_of(tmp_path, {"consumer/__init__.py": """
        import torch
        import torch.distributed as dist
        from accel.utils import DataLoaderConfiguration, gather
        from accel import Accelerator as A

        @torch.compiler.disable
        def step(x: torch.Tensor = torch.float16):
            dist.all_reduce(x)
            return A(kwargs_handlers=[])
        class Engine(torch.nn.Module):
            dtype = torch.bfloat16
    """})
    assert found >= {("torch", "import"), ("torch.distributed", "import"), ("accel.utils.DataLoaderConfiguration",
                     "import"), ("accel.utils.gather", "import"), ("accel.Accelerator", "import"),
                     ("torch.compiler.disable", "import"), ("torch.Tensor", "import"), ("torch.float16", "import"),
                     ("torch.distributed.all_reduce", "call"), ("torch.nn.Module", "import"),
                     ("torch.bfloat16", "import")}


def test_what_the_code_guards_is_not_a_use(tmp_path):
    found = uses_of(tmp_path, {"consumer/__init__.py": """
        from typing import TYPE_CHECKING
        import torch
        from .utils import is_accel_available, is_torch_greater_or_equal, is_xla_available
        if TYPE_CHECKING:
            from accel import OnlyForTypes
        try:
            from accel.utils import Maybe
        except ImportError:
            Maybe = None
        if is_torch_greater_or_equal("2.1"):
            from torch.nn.attention import sdpa_kernel
        if hasattr(torch, "compiler"):
            torch.compiler.reset()
        if is_xla_available():  # not a package of the stack: that branch never runs here
            from accel.xla import XlaThing
        if is_accel_available():  # a package of the stack: installed, so this is no guard
            from accel import Needed
        else:
            from accel import Fallback
        flag = hasattr(torch, "mps") and torch.mps.is_available()
        if __name__ == "__main__":
            from accel import Script
    """, "consumer/utils.py": "def is_accel_available(): ...\n"})
    paths = {p for p, _ in found}
    assert "accel.Needed" in paths
    assert not paths & {"accel.OnlyForTypes", "accel.utils.Maybe", "torch.nn.attention.sdpa_kernel",
                        "torch.compiler.reset", "accel.xla.XlaThing", "accel.Fallback", "torch.mps.is_available",
                        "accel.Script"}


def test_a_function_the_module_calls_at_import_time_runs_at_import_time(tmp_path):
    # deepspeed.utils.logging: `logger = LoggerFactory.create_logger()` at module level runs a method that uses
    # torch.compiler.is_compiling: `import deepspeed` fails on a torch without it, not some later call.
    found = uses_of(tmp_path, {"consumer/__init__.py": """
        import torch
        class LoggerFactory:
            @staticmethod
            def create_logger():
                return helper()
            def never(self):
                return torch.only_when_called()
        def helper():
            return torch.compiler.is_compiling()
        class Engine:
            def __init__(self):
                self.setup()
            def setup(self):
                torch.cuda.set_device(0)
        logger = LoggerFactory.create_logger()
        DEFAULT = Engine()
        handler = lambda: torch.lazy_thing()
    """})
    assert {("torch.compiler.is_compiling", "import"), ("torch.cuda.set_device", "import"),
            ("torch.only_when_called", "call"), ("torch.lazy_thing", "call")} <= found


def test_the_walk_follows_the_package_s_own_imports_at_import_time_only(tmp_path):
    found = uses_of(tmp_path, {
        "consumer/__init__.py": "from .trainer import Trainer\n",
        "consumer/trainer.py": "from .integrations import ds\nimport accel\ndef later():\n    from . import lazy\n",
        "consumer/integrations/__init__.py": "",
        "consumer/integrations/ds.py": "from accel.utils import DeepSpeedPlugin\n",
        "consumer/lazy.py": "from accel import NeverLoadedAtImport\n",
        "consumer/unrelated.py": "from accel import NotOnTheSurface\n",
    })
    paths = {p for p, _ in found}
    assert {"accel", "accel.utils.DeepSpeedPlugin"} <= paths
    assert "accel.NeverLoadedAtImport" not in paths and "accel.NotOnTheSurface" not in paths


def test_exports_follow_star_imports_and_all_and_see_submodules(tmp_path):
    pkg = tree(tmp_path, {
        "accel/__init__.py": "from .state import *\nfrom .utils import gather as g\nVERSION = 1\n",
        "accel/state.py": "__all__ = ['PartialState']\nclass PartialState: ...\nclass Hidden: ...\n",
        "accel/utils/__init__.py": "from .ops import *\n",
        "accel/utils/ops.py": "def gather(): ...\ndef _private(): ...\n",
        "accel/lazy.py": "def __getattr__(name): ...\n",
    }, top="accel")
    cache = {}
    assert api.resolve(pkg, "accel.PartialState", cache) is None
    assert api.resolve(pkg, "accel.Hidden", cache) == "accel has no name Hidden"  # not in state's __all__
    assert api.resolve(pkg, "accel.g", cache) is None and api.resolve(pkg, "accel.utils.gather", cache) is None
    assert api.resolve(pkg, "accel.utils._private", cache) == "accel.utils has no name _private"
    assert api.resolve(pkg, "accel.utils.ops", cache) is None  # a submodule: importable by name
    assert api.resolve(pkg, "accel.state.PartialState.deep.attr", cache) is None  # judged to module + 1 only
    assert api.resolve(pkg, "accel.lazy.anything", cache).startswith("open: accel.lazy")
    assert api.resolve(pkg, "accel.nomodule.x", cache) == "accel has no name nomodule"


def test_a_wheel_and_an_sdist_read_to_the_same_modules(tmp_path):
    files = {"accel/__init__.py": "X = 1\n", "accel/_C.pyi": "def op(): ...\n", "accel/fast.abi3.so": "",
             "../evil.py": "bad\n", "/abs.py": "bad\n"}
    whl = tmp_path / "accel-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in {**files, "accel-1.0.dist-info/METADATA": "Name: accel\n"}.items():
            z.writestr(name, text)
    sdist = tmp_path / "accel-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        for name, text in {**{f"accel-1.0/src/{k}": v for k, v in files.items() if not k.startswith(("..", "/"))},
                           "accel-1.0/setup.py": "setup()\n"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))
    for artifact in (whl, sdist):
        pkg = api.Package.read(artifact, ["accel"])
        assert set(pkg.files) == {"accel", "accel._C", "accel.fast"}, artifact.name
        assert pkg.source("accel") == (".py", "X = 1\n") and pkg.source("accel._C")[0] == ".pyi"
        assert pkg.source("accel.fast") is None  # compiled, no stub: its names cannot be read


def test_ranges_are_positions_in_the_indexed_releases():
    order = ["0.9.0", "1.0.0", "1.0.1", "1.2.0", "2.0.0"]
    text = names.ranges({"1.0.0", "1.0.1", "2.0.0"}, order)
    assert text == "1.0.0..1.0.1 2.0.0"
    assert names.expand(text, order) == {"1.0.0", "1.0.1", "2.0.0"}
    position = {v: i for i, v in enumerate(order)}
    assert names.within("1.0.1", text, position) and not names.within("1.2.0", text, position)
    assert not names.within("1.0.5", text, position)  # between the bounds, but never indexed: not claimed


def fake_index(monkeypatch, docs):
    for doc in docs.values():
        doc["_order"] = {v: i for i, v in enumerate(doc["releases"])}
    monkeypatch.setattr(names, "index", lambda: docs)


def doc(name, releases, uses=(), interest=None):
    return {"package": name, "releases": {v: {"file": f"{name}-{v}.whl", "sha256": "0" * 64} for v in releases},
            "uses": list(uses), "interest": interest or {}}


def entry_with(**pins):
    return complete({"id": "t", "source": "https://github.com/x/y", "python": "3.11", "cuda": "12.4", **pins})


def test_a_name_the_provider_lacks_rejects_and_says_where_and_why(monkeypatch):
    fake_index(monkeypatch, {
        "transformers": doc("transformers", ["4.46.3"], [
            {"provider": "accelerate", "path": "accelerate.utils.load_fsdp_model", "in": "transformers.trainer",
             "phase": "import", "releases": "4.46.3"}]),
        "accelerate": doc("accelerate", ["0.20.3", "0.26.0"], interest={
            "accelerate.utils.load_fsdp_model": {"absent": "0.20.3", "why": "accelerate.utils has no name load_fsdp_model"}}),
    })
    bad = {o.rule: o for o in names.evaluate(entry_with(transformers="4.46.3", accelerate="0.20.3"))}
    assert bad["names-transformers-accelerate"].ok is False
    reason = bad["names-transformers-accelerate"].reason
    assert "transformers.trainer" in reason and "load_fsdp_model" in reason and "ImportError" in reason
    assert "transformers-4.46.3.whl" in bad["names-transformers-accelerate"].source
    good = {o.rule: o for o in names.evaluate(entry_with(transformers="4.46.3", accelerate="0.26.0"))}
    assert good["names-transformers-accelerate"].ok is True
    unknown = {o.rule: o for o in names.evaluate(entry_with(transformers="4.46.3", accelerate="0.21.0"))}
    assert unknown["names-transformers-accelerate"].ok is None and "not in the names index" in \
        unknown["names-transformers-accelerate"].reason


def test_a_module_that_makes_names_at_run_time_is_not_judged(monkeypatch):
    fake_index(monkeypatch, {
        "deepspeed": doc("deepspeed", ["0.15.0"], [{"provider": "torch", "path": "torch.foo", "in": "deepspeed",
                                                  "phase": "import", "releases": "0.15.0"}]),
        "torch": doc("torch", ["2.1.2"], interest={"torch.foo": {"open": "2.1.2", "why_open": "__getattr__"}}),
    })
    (only,) = names.evaluate(entry_with(deepspeed="0.15.0", torch="2.1.2"))
    assert only.ok is True and "not judged" in only.reason


def test_a_name_no_indexed_release_has_is_not_judged_at_any_phase(monkeypatch):
    # torch.cuda.FloatTensor is made by torch._C at import (the static read sees no such name in any release); a
    # consumer release cannot have shipped failing against every provider release, so this is no version mismatch.
    fake_index(monkeypatch, {
        "deepspeed": doc("deepspeed", ["0.15.0"], [
            {"provider": "torch", "path": "torch.cuda.FloatTensor", "in": "deepspeed.runtime.utils", "phase": "import",
             "releases": "0.15.0"},
            {"provider": "torch", "path": "torch.compiler.is_compiling", "in": "deepspeed.utils.logging",
             "phase": "import", "releases": "0.15.0"}]),
        "torch": doc("torch", ["2.1.2", "2.3.1"], interest={
            "torch.cuda.FloatTensor": {"absent": "2.1.2..2.3.1", "why": "torch.cuda has no name FloatTensor"},
            "torch.compiler.is_compiling": {"absent": "2.1.2", "why": "torch.compiler has no name is_compiling"}}),
    })
    (newer,) = names.evaluate(entry_with(deepspeed="0.15.0", torch="2.3.1"))
    assert newer.ok is True and "1 not judged" in newer.reason and "no indexed release of torch" in newer.reason
    (older,) = names.evaluate(entry_with(deepspeed="0.15.0", torch="2.1.2"))
    # The name some releases have still rejects; the one none has is not what it names.
    assert older.ok is False and "is_compiling" in older.reason and "FloatTensor" not in older.reason


def test_the_index_round_trips_through_its_files(tmp_path, monkeypatch):
    idx = api_index.Index()
    idx.releases["peft"] = {"0.13.0": {"file": "peft-0.13.0.whl", "sha256": "a" * 64},
                            "0.14.0": {"file": "peft-0.14.0.whl", "sha256": "b" * 64}}
    idx.releases["transformers"] = {"4.42.0": {"file": "t.whl", "sha256": "c" * 64},
                                    "4.43.0": {"file": "t2.whl", "sha256": "d" * 64}}
    idx.uses["peft"] = {"0.13.0": set(), "0.14.0": {("transformers", "transformers.EncoderDecoderCache",
                                                     "peft.peft_model", "import")}}
    idx.uses["transformers"] = {"4.42.0": set(), "4.43.0": set()}
    idx.status["transformers"]["transformers.EncoderDecoderCache"] = {
        "4.42.0": "transformers has no name EncoderDecoderCache", "4.43.0": None}
    idx.write(tmp_path)
    again = api_index.Index.load(tmp_path)
    assert again.documents() == idx.documents()
    data = json.loads((tmp_path / "transformers.json").read_text())
    assert data["interest"]["transformers.EncoderDecoderCache"]["absent"] == "4.42.0"
    monkeypatch.setattr(names, "index", lambda: {d["package"]: {**d, "_order": {v: i for i, v in
                        enumerate(d["releases"])}} for d in (json.loads(p.read_text()) for p in tmp_path.glob("*.json"))})
    (bad,) = names.evaluate(entry_with(peft="0.14.0", transformers="4.42.0"))
    assert bad.ok is False and "EncoderDecoderCache" in bad.reason


# --- the committed index ------------------------------------------------------------------------------------


def committed():
    data = names.index()
    if not data:
        pytest.skip("no names index committed")
    return data


def test_the_committed_index_is_complete_and_consistent():
    data = committed()
    for name, doc_ in data.items():
        order = list(doc_["releases"])
        assert order, name
        for rel in doc_["releases"].values():
            assert len(rel["sha256"]) == 64 and rel["file"]
        for row in doc_["uses"]:
            provider = data.get(row["provider"])
            assert provider is not None, f"{name} uses {row['provider']}, which is not indexed"
            assert row["path"] in provider["interest"], f"{row['path']} used by {name} was never checked"
            assert names.expand(row["releases"], order)


@pytest.mark.parametrize("case", CORPUS["good"], ids=[c["id"] for c in CORPUS["good"]])
def test_shipped_stacks_import_what_they_need(case):
    committed()
    found = [o for o in names.evaluate(complete(case)) if o.ok is False]
    assert not found, "; ".join(o.reason for o in found)


def test_the_judge_is_part_of_compat():
    committed()
    entry = entry_with(transformers="4.46.3", accelerate="1.0.0", peft="0.13.2", deepspeed="0.15.4")
    rules = {o.rule for o in compat.evaluate(entry, recipe=False)}
    assert "names-transformers-accelerate" in rules and "names-peft-transformers" in rules
