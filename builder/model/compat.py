"""Apply the compatibility rules in data/compat.yaml to matrix entries (step 2 of the pipeline).

The knowledge lives in the YAML; this module only knows the *kinds* of rule. `check` returns every
violation (rule id, reason, source); `derive` returns the facts other steps need (minimum driver,
cxx11 ABI, flash-attn wheel URL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.errors import CompatError
from builder.model.matrix import Entry

PYPI_HOSTS = ("pypi.org", "pypi.python.org", "files.pythonhosted.org")


@dataclass(frozen=True)
class Violation:
    rule: str
    field: str
    reason: str
    source: str

    def render(self, entry: Entry) -> str:
        return (f"{entry.source}:{entry.line(self.field)}: entry '{entry.tag}', field '{self.field}': "
                f"[{self.rule}] {self.reason} (source: {self.source})")


@lru_cache(maxsize=1)
def rules() -> dict:
    text = resources.files("builder").joinpath("data/compat.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def minor(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


def _torch_facts(entry: Entry) -> dict | None:
    return rules()["torch"].get(minor(entry.torch))


def uses_pypi(entry: Entry) -> bool:
    return any(host in entry.index_url for host in PYPI_HOSTS)


def check(entry: Entry) -> list[Violation]:
    """Every rule the entry breaks; empty when it is a supported combination."""
    found: list[Violation] = []
    torch = _torch_facts(entry)
    if torch is None:
        known = ", ".join(rules()["torch"])
        return [Violation("torch-known", "torch", f"torch {minor(entry.torch)} is not in the compatibility data "
                          f"(known: {known}); add it to builder/data/compat.yaml with its source", "compat.yaml")]
    src = torch["source"]
    if entry.cuda not in rules()["cuda"]:
        found.append(Violation("cuda-known", "cuda", f"CUDA {entry.cuda} is not in the compatibility data "
                               f"(known: {', '.join(rules()['cuda'])})", "compat.yaml"))
    if entry.cuda not in torch["cuda_builds"]:
        found.append(Violation("torch-cuda", "cuda", f"torch {minor(entry.torch)} has no CUDA {entry.cuda} build "
                               f"(builds: {', '.join(torch['cuda_builds'])})", src))
    elif uses_pypi(entry) and entry.cuda != torch["pypi_cuda"]:
        tag = "cu" + entry.cuda.replace(".", "")
        found.append(Violation("torch-index", "index_url", f"PyPI serves torch {minor(entry.torch)} only as a CUDA "
                               f"{torch['pypi_cuda']} build; for CUDA {entry.cuda} set index_url to "
                               f"https://download.pytorch.org/whl/{tag}", src))
    if Version(entry.python) not in SpecifierSet(torch["python"]):
        found.append(Violation("torch-python", "python", f"torch {minor(entry.torch)} supports Python "
                               f"{torch['python']}, not {entry.python}", src))
    found += _check_base(entry, torch)
    found += _check_flash_attn(entry, torch)
    found += _check_package_minimums(entry)
    return found


def _check_base(entry: Entry, torch: dict) -> list[Violation]:
    found = []
    tag = entry.base_name.split(":", 1)[1] if ":" in entry.base_name.rsplit("/", 1)[-1] else ""
    os_rule = next((r for r in rules()["base_os"] if r["match"] in tag), None)
    if os_rule is None:
        known = ", ".join(r["match"] for r in rules()["base_os"])
        found.append(Violation("base-os", "base", f"cannot tell the OS of base '{entry.base_name}' (its tag must "
                               f"name one of: {known})", "compat.yaml base_os"))
    elif os_rule["python"] != entry.python:
        found.append(Violation("base-python", "python", f"{os_rule['os']} ships Python {os_rule['python']}, and "
                               f"the image uses the base's own Python; set python: \"{os_rule['python']}\" or "
                               "choose another base", os_rule["source"]))
    cuda_rule = rules()["base_cuda"]
    m = re.match(cuda_rule["pattern"], entry.base_name)
    if m:
        if m.group("cuda") != entry.cuda:
            found.append(Violation("base-cuda", "base", f"base carries CUDA {m.group('cuda')} but torch is the "
                                   f"CUDA {entry.cuda} build; mixed CUDA libraries fail at load time "
                                   "(libcudnn.so.8 class): use a CUDA "
                                   f"{entry.cuda} base or a plain OS base", cuda_rule["source"]))
        cudnn = m.group("cudnn")
        if cudnn is not None and cudnn and int(cudnn) != torch["cudnn"]:
            found.append(Violation("base-cudnn", "base", f"base carries cuDNN {cudnn} but torch "
                                   f"{minor(entry.torch)} loads cuDNN {torch['cudnn']}", cuda_rule["source"]))
    return found


def _check_flash_attn(entry: Entry, torch: dict) -> list[Violation]:
    version = entry.pins.get("flash-attn")
    if version is None:
        return []
    data = rules()["flash_attn"]["releases"].get(version)
    if data is None:
        return [Violation("flash-attn-known", "flash-attn", f"flash-attn {version} is not in the compatibility data "
                          f"(known: {', '.join(rules()['flash_attn']['releases'])})", "compat.yaml flash_attn")]
    found = []
    why = "without a prebuilt wheel it builds from source for hours"
    if minor(entry.torch) not in data["torch"]:
        found.append(Violation("flash-attn-torch", "flash-attn", f"flash-attn {version} has no prebuilt wheel for "
                               f"torch {minor(entry.torch)} (wheels: {', '.join(data['torch'])}); {why}",
                               data["source"]))
    if entry.python not in data["python"]:
        found.append(Violation("flash-attn-python", "flash-attn", f"flash-attn {version} has no wheel for Python "
                               f"{entry.python}; {why}", data["source"]))
    if str(Version(entry.cuda).major) not in data["cuda_tag"]:
        found.append(Violation("flash-attn-cuda", "flash-attn", f"flash-attn {version} has no wheel for CUDA "
                               f"{Version(entry.cuda).major}.x", data["source"]))
    return found


def _check_package_minimums(entry: Entry) -> list[Violation]:
    found = []
    for rule in rules()["packages"]:
        pinned = entry.pins.get(rule["package"])
        if pinned is None or Version(pinned) not in SpecifierSet(rule["versions"]):
            continue
        if Version(entry.torch) not in SpecifierSet(rule["torch"]):
            found.append(Violation(f"{rule['package']}-torch", rule["package"], f"{rule['package']} {pinned} needs "
                                   f"torch {rule['torch']}, the entry has {entry.torch}", rule["source"]))
        if Version(entry.python) not in SpecifierSet(rule["python"]):
            found.append(Violation(f"{rule['package']}-python", rule["package"], f"{rule['package']} {pinned} needs "
                                   f"Python {rule['python']}, the entry has {entry.python}", rule["source"]))
    return found


def require(entries) -> None:
    """Raise one CompatError listing every violation of the given entries."""
    lines = [v.render(e) for e in entries for v in check(e)]
    if lines:
        raise CompatError("\n".join(lines), "change the entry or, if the rule is wrong, fix compat.yaml with a source")


def derive(entry: Entry) -> dict:
    """Facts that follow from the rules: what later steps (render, labels, smoke) need."""
    torch = _torch_facts(entry)
    cuda = rules()["cuda"][entry.cuda]
    facts = {
        "min_driver": cuda["min_driver"],
        "toolkit_driver": cuda["toolkit_driver"],
        "cxx11abi": torch["cxx11abi"],
        "cudnn_major": torch["cudnn"],
        "flash_attn_wheel": None,
    }
    version = entry.pins.get("flash-attn")
    if version:
        fa = rules()["flash_attn"]
        data = fa["releases"][version]
        facts["flash_attn_wheel"] = fa["url"].format(
            version=version, cuda_tag=data["cuda_tag"][str(Version(entry.cuda).major)], torch=minor(entry.torch),
            abi="TRUE" if torch["cxx11abi"] else "FALSE", py=entry.python.replace(".", ""))
    return facts
