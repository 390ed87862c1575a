"""Apply the compatibility rules in data/compat.yaml to matrix entries (step 2 of the pipeline).

The knowledge lives in the YAML; this module only knows the *kinds* of rule:
- table lookups: torch releases (CUDA builds, Python range, C++ ABI per build), CUDA driver floors;
- the base image: the recipe (which Python the base ships) and the CUDA compiler a devel base carries;
- the flash-attn wheel matrix: is there a prebuilt wheel, and was it compiled against a torch build
  with the same C++ ABI as the entry's;
- `requires` / `forbids` constraints between pinned versions (the `packages:` minimums are the
  `requires` kind written compactly).

Two judgements, kept apart:
- does the combination work? `check` returns those violations; `validate` and `compat TAG` reject
  (exit 2) only for them, each with its source;
- can this project's recipe build it from what this machine reaches? `recipe_limits` returns what stops
  the recipe (no nvcc source for the CUDA line on that base, a base whose python3 is another version,
  a build-only nvcc the image would need): `require(..., recipe=True)` stops render/lock/build with
  exit 3 naming it, while `validate` accepts the combination.
What the recipe needs is derived, never demanded: nvcc in the image for DeepSpeed < 0.19.8, the ops
toolchain, the arch list (`derivations`, shown by `compat TAG`).

`evaluate` returns every rule checked with its outcome and source (for `compat TAG`); `derive` returns
the facts other steps need (driver floors, ABI, wheel URL).
"""

from __future__ import annotations

import re
from functools import lru_cache

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.errors import CompatError, EnvironmentProblem
from builder.model import archs as kernels
from builder.model import bugs, names, signals
from builder.model.matrix import Entry
from builder.model.rulebook import gpu_capability, minor, rules  # noqa: F401 (compat.rules etc. are the API)
from builder.model.verdict import Outcome, Violation

PYPI_HOSTS = ("pypi.org", "pypi.python.org", "files.pythonhosted.org")
# Rules about this project's Dockerfile recipe and the sources it reaches (the image uses the base's own
# python3; the ops stage needs an nvcc source for the CUDA line and base), not about whether the software
# combination works: they stop a build (exit 3), never `validate` (exit 2).
RECIPE_RULES = ("base-os", "base-python", "nvcc-source", "nvcc-in-image", "cuda-archs-known", "flash-attn-known")
# Steps that turn an entry into an image and so need the recipe to cover it (cli.run_step).
RECIPE_STEPS = ("render", "lock", "build", "repro", "smoke")


class RecipeLimit(EnvironmentProblem):
    """The combination works, but this project's recipe cannot build it from the sources it reaches."""


def _torch_facts(entry: Entry) -> dict | None:
    return rules()["torch"].get(minor(entry.torch))


def torch_abi(torch_minor: str, cuda: str) -> bool:
    """The C++11 ABI flag of torch `torch_minor` built for CUDA `cuda` (pip wheels)."""
    facts = rules()["torch"][torch_minor]
    return bool(facts.get("cxx11abi_builds", {}).get(cuda, facts["cxx11abi"]))


def uses_pypi(entry: Entry) -> bool:
    return any(host in entry.index_url for host in PYPI_HOSTS)


def check(entry: Entry, recipe: bool = False, ops: bool = True) -> list[Violation]:
    """Every compatibility rule the entry breaks (the combination does not work); empty when it works.
    recipe=True adds the recipe's limits (what stops a build here, see `recipe_limits`). ops=False: the stack
    never compiles DeepSpeed's CUDA ops (this recipe always prebuilds them; see rules with `needs: ops`)."""
    return [Violation(o.rule, o.field, o.reason, o.source) for o in evaluate(entry, recipe, ops) if o.ok is False
            and (recipe or o.rule not in RECIPE_RULES)]


def recipe_limits(entry: Entry) -> list[Violation]:
    """What stops this project's recipe from building a combination that works: exit 3, not exit 2."""
    return [Violation(o.rule, o.field, o.reason, o.source) for o in evaluate(entry, True) if o.ok is False
            and o.rule in RECIPE_RULES]


def evaluate(entry: Entry, recipe: bool = True, ops: bool = True) -> list[Outcome]:
    """Every rule checked for the entry, in a stable order, with its outcome and source."""
    torch = _torch_facts(entry)
    if torch is None:
        known = ", ".join(rules()["torch"])
        return [Outcome("torch-known", "table", "torch", False, f"torch {minor(entry.torch)} is not in the "
                        f"compatibility data (known: {known}); add it to builder/data/compat.yaml with its source",
                        "compat.yaml")]
    found = _check_torch(entry, torch)
    found += _check_base(entry, recipe)
    found += _check_flash_attn(entry)
    found += [_constraint(entry, rule, ops) for rule in constraint_rules()]
    found += signals.evaluate(entry)
    found += bugs.evaluate(entry, entry.accept_bugs, ops)
    found += _check_toolchain(entry, recipe)
    found += kernels.evaluate(entry, claimed_gpus(entry), explicit=entry.gpus is not None)
    found += names.evaluate(entry)
    return found


def warnings(entry: Entry) -> list[Violation]:
    """What does not reject the entry but a user should know: a crash in a narrow configuration, a known bug the
    entry accepted (`validate` prints them; `compat TAG` lists them with the rest)."""
    return [Violation(o.rule, o.field, o.reason, o.source) for o in evaluate(entry, False) if o.warn]


# --- toolchain: DeepSpeed ops, nvcc, GPU archs ---------------------------------------------------------


def _cap(text: str) -> tuple[int, int]:
    major, minor_ = text.split(".")
    return int(major), int(minor_)


def arch_runs_on(arch_list: str, capability: str) -> bool:
    """Does code built for `arch_list` run on a GPU of `capability`? SASS X.y runs on X.z (z >= y);
    PTX X.y is JIT-compiled by the driver for any newer GPU."""
    want = _cap(capability)
    for token in arch_list.split(";"):
        arch = _cap(token.split("+")[0])
        if arch[0] == want[0] and arch[1] <= want[1]:
            return True
        if token.endswith("+PTX") and arch <= want:
            return True
    return False


def nvcc_source(entry: Entry) -> dict | None:
    """The first toolchain.nvcc rule for the entry's CUDA (major.minor or major) and base; None if none."""
    major = str(Version(entry.cuda).major)
    for rule in rules()["toolchain"]["nvcc"]:
        if rule["cuda"] not in (entry.cuda, major):
            continue
        if "base" in rule and rule["base"] not in entry.base_name:
            continue
        return rule
    return None


def claimed_gpus(entry: Entry) -> tuple[str, ...]:
    """The GPUs the entry names, else the default claims its torch build and flash-attn run on (derived)."""
    if entry.gpus is not None:
        return entry.gpus
    return kernels.default_gpus(entry)


def has_devel_base(entry: Entry) -> bool:
    return "-devel" in entry.base_name  # an nvidia/cuda devel base ships nvcc itself


def deepspeed_needs_nvcc(entry: Entry) -> bool:
    """Does the entry's DeepSpeed need nvcc in the image to import on a GPU host (toolchain.deepspeed_needs_nvcc)?"""
    pinned = entry.pins.get("deepspeed")
    versions = rules()["toolchain"]["deepspeed_needs_nvcc"]["versions"]
    return pinned is not None and Version(pinned) in SpecifierSet(versions)


def nvcc_in_image(entry: Entry) -> bool:
    """nvcc goes into the image when the entry asks for it or its DeepSpeed needs it: derived, not demanded."""
    return entry.nvcc or (deepspeed_needs_nvcc(entry) and not has_devel_base(entry))


def _check_toolchain(entry: Entry, recipe: bool) -> list[Outcome]:
    """DeepSpeed's nvcc need (derived), the GPUs the ops cover; with recipe, the recipe's nvcc source and arch data."""
    t = rules()["toolchain"]
    ds_rule = t["deepspeed_needs_nvcc"]
    pinned = entry.pins.get("deepspeed")
    needs = deepspeed_needs_nvcc(entry)
    found = [Outcome("deepspeed-nvcc", "derived", "deepspeed", True if needs else None,
                     (f"DeepSpeed {pinned} fails at `import deepspeed` on a GPU host without nvcc: "
                      + ("the devel base ships nvcc" if has_devel_base(entry) else "nvcc is put into the image"))
                     if needs else "DeepSpeed >= 0.19.8 (or none) imports without nvcc", ds_rule["source"])]
    source = nvcc_source(entry)
    if recipe:
        found += _check_nvcc_source(entry, source)
    archs = t["cuda_archs"].get(entry.cuda)
    if archs is None:
        return found + ([Outcome("cuda-archs-known", "recipe", "cuda", False, f"no arch data for CUDA {entry.cuda} "
                                 "in compat.yaml toolchain.cuda_archs: the ops' arch list cannot be derived",
                                 "compat.yaml toolchain.cuda_archs")] if recipe else [])
    arch_list = entry.cuda_archs or archs["default"]
    field = "cuda_archs" if entry.cuda_archs else "cuda"
    for token in arch_list.split(";"):
        if token.split("+")[0] not in archs["nvcc"]:
            found.append(Outcome("cuda-archs-nvcc", "toolchain", field, False, f"nvcc {entry.cuda} cannot compile sm_"
                                 f"{token.split('+')[0].replace('.', '')} (it compiles {', '.join(archs['nvcc'])})",
                                 archs["source"]))
    return found + _check_gpus(entry, arch_list, field)


def _check_nvcc_source(entry: Entry, source: dict | None) -> list[Outcome]:
    found = []
    if source is not None and nvcc_in_image(entry) and source.get("in_image") is False:
        why = "the entry sets nvcc: true" if entry.nvcc else f"DeepSpeed {entry.pins['deepspeed']} needs nvcc at import"
        found.append(Outcome("nvcc-in-image", "recipe", "nvcc", False,
                             f"{why}, but the only nvcc source for CUDA {entry.cuda} on this base, {source['kind']} "
                             f"({', '.join(source['packages'])}), is build-only: it drags in libcuda1, which shadows "
                             "the host driver (CUDA error 803); use DeepSpeed >= 0.19.8, an nvidia/cuda base, or "
                             "set nvcc: false", source["source"]))
    found.append(Outcome("nvcc-source", "recipe", "cuda", source is not None,
                         f"nvcc for the ops stage from {source['kind']}" if source else
                         f"no nvcc source reachable for CUDA {entry.cuda} on base '{entry.base_name}' "
                         "(compat.yaml toolchain.nvcc): the DeepSpeed ops cannot be built here",
                         (source or {}).get("source", "compat.yaml")))
    return found


def _check_gpus(entry: Entry, arch_list: str, field: str) -> list[Outcome]:
    t = rules()["toolchain"]
    table = t["gpus"]["capability"]
    found = []
    for gpu in claimed_gpus(entry):
        cap = gpu_capability(gpu)
        if cap is None:
            found.append(Outcome("gpu-known", "toolchain", "gpus", False, f"GPU '{gpu}' is not in compat.yaml "
                                 f"toolchain.gpus (known: {', '.join(table)})", t["gpus"]["source"]))
        else:
            ok = arch_runs_on(arch_list, cap)
            found.append(Outcome("gpu-archs", "toolchain", field, ok, f"{gpu} (compute capability {cap}) "
                                 + (f"runs the ops built for {arch_list}" if ok else f"has no code in the ops' arch "
                                    f"list {arch_list}: add {cap} or a PTX arch <= {cap}, or drop the GPU"),
                                 t["gpus"]["source"]))
    return found


def derivations(entry: Entry) -> list[tuple[str, str, str, str]]:
    """(what, value, why, source) for each thing the recipe derives from the entry instead of demanding it."""
    t = rules()["toolchain"]
    out = []
    needs, source = deepspeed_needs_nvcc(entry), nvcc_source(entry)
    if entry.nvcc:
        why = "the entry sets nvcc: true"
    elif needs and has_devel_base(entry):
        why = f"DeepSpeed {entry.pins['deepspeed']} needs nvcc at import; the devel base ships it"
    elif needs:
        why = f"DeepSpeed {entry.pins['deepspeed']} < 0.19.8 fails `import deepspeed` on a GPU host without nvcc"
    else:
        why = "DeepSpeed >= 0.19.8 imports without nvcc; the ops are prebuilt"
    out.append(("nvcc in image", "yes" if nvcc_in_image(entry) else "no", why,
                t["deepspeed_needs_nvcc"]["source"]))
    if source is None:
        out.append(("ops toolchain", "none reachable", f"no toolchain.nvcc source for CUDA {entry.cuda} on "
                    f"'{entry.base_name}': build stops (exit 3)", "compat.yaml toolchain.nvcc"))
    else:
        packages = ", ".join(source.get("packages", []))
        where = {"pypi": f"PyPI {source.get('requirement', '')}", "debian": f"Debian {packages} ({source.get('base')})",
                 "debian-unpacked": f"Debian {source.get('suite')} .debs unpacked, not installed ({packages})",
                 "image": "NVIDIA's devel image"}[source["kind"]]
        out.append(("ops toolchain", f"nvcc from {where}", f"host compiler {source.get('host_cxx', 'g++')}, "
                    f"CUDA_HOME {source['cuda_home']}", source["source"]))
    claimed = claimed_gpus(entry)
    if entry.gpus is None:
        offered = t["claims"].get(str(Version(entry.cuda).major), ())
        dropped = [g for g in offered if g not in claimed]
        out.append(("claimed GPUs", ", ".join(claimed) or "none", f"the CUDA {Version(entry.cuda).major} line's "
                    "GPUs that torch's build" + (" and flash-attn" if entry.pins.get("flash-attn") else "") +
                    " have code for" + (f" (not {', '.join(dropped)})" if dropped else ""),
                    "data/knowledge/archs.yaml; compat.yaml toolchain.claims"))
    archs = t["cuda_archs"].get(entry.cuda)
    if archs is not None:
        arch_list = entry.cuda_archs or archs["default"]
        why = ("set by the entry" if entry.cuda_archs else
               f"default for CUDA {entry.cuda}: one SASS per GPU generation, PTX for the newest")
        out.append(("arch list", arch_list, f"{why}; covers {', '.join(claimed_gpus(entry)) or 'no claimed GPU'}",
                    archs["source"]))
    return out


def cpu_accelerator(entry: Entry) -> dict | None:
    """DeepSpeed's CPU-accelerator ops the image prebuilds (a second wheel, compat.yaml toolchain.cpu_accelerator),
    or None where the entry's DeepSpeed predates the checked builders (those keep DeepSpeed's JIT path)."""
    cpu = rules()["toolchain"].get("cpu_accelerator")
    pinned = entry.pins.get("deepspeed")
    if not cpu or not pinned or Version(pinned) < Version(cpu["min_deepspeed"]):
        return None
    return cpu


# The CPU-accelerator wheel's compiler: the image's own g++, the one DeepSpeed's JIT would use.
CPU_CXX = "g++"


def shared_ops(ops: list[dict], cpu: dict | None, host_cxx: str) -> list[dict]:
    """The CPU ops both DeepSpeed wheels build alike (the same builder for the CUDA and the CPU accelerator, and the
    same compiler: nvcc's host compiler is CPU_CXX), which the Dockerfile compiles once for both ops stages. Both
    stages then build through ops-common's compiler wrapper, so the compiler must be the same: ninja compares the
    command, which names the wrapper, not the compiler behind it. ninja decides what is reused."""
    if not cpu or host_cxx != CPU_CXX:
        return []
    return [o for o in ops if not o["cuda"]
            and any(c["name"] == o["name"] and c["builder"] == o["builder"] for c in cpu["ops"])]


def toolchain(entry: Entry) -> dict:
    """What the Dockerfile's ops stage needs: ops, arch list, nvcc source, CPU target, container env."""
    import json

    t = rules()["toolchain"]
    nvcc = dict(nvcc_source(entry))
    cuda_home = nvcc["cuda_home"]
    if nvcc["kind"] == "pypi":
        cuda_home = f"/opt/venv/lib/python{entry.python}/site-packages/{cuda_home}"
        size = f"$(( $(du -sb {cuda_home} | cut -f1) - $(cat /opt/ops/cuda-home-bytes) ))"
    elif nvcc["kind"] == "debian":
        size = ("$(dpkg-query -W -f='${Installed-Size}\\n' $(grep -v '^#' /opt/ops/ops-apt.lock | cut -d= -f1) "
                "| awk '{s += $1} END {print s * 1024}')")
    elif nvcc["kind"] == "debian-unpacked":
        size = "$(cat /opt/ops/nvcc-bytes)"  # the unpacked .debs' Installed-Size, summed by the unpack step
    else:
        m = re.match(rules()["base_cuda"]["pattern"], entry.base_name)
        cuda_full = entry.base_name.split(":", 1)[1].split("-", 1)[0]
        nvcc["image"] = entry.base_name.replace(f"-{m.group('flavor')}-", "-devel-") if m else nvcc["image"].format(
            cuda_full=cuda_full, os="")
        size = "$(du -sb /usr/local/cuda | cut -f1)"
    ops = t["ops"]
    on_nvidia_base = entry.base_name.startswith("nvidia/cuda:")
    cpu = cpu_accelerator(entry)
    host_cxx = nvcc.get("host_cxx", "g++")
    return {
        "ops": ops,
        "ops_json": json.dumps([{"name": o["name"], "module": o["module"], "cuda": o["cuda"]} for o in ops],
                               separators=(",", ":")),
        "cpu_accelerator": cpu,
        "cpu_ops_json": json.dumps([{"name": o["name"], "module": o["module"], "cuda": False,
                                     "avx512_dispatched": bool(o.get("avx512_dispatched"))} for o in cpu["ops"]],
                                   separators=(",", ":")) if cpu else "",
        "arch_list": entry.cuda_archs or t["cuda_archs"][entry.cuda]["default"],
        "gpus": list(claimed_gpus(entry)),
        "nvcc": nvcc,
        "cuda_home": cuda_home,
        "host_cxx": host_cxx,
        "cpu_cxx": CPU_CXX,
        "shared_ops": shared_ops(ops, cpu, host_cxx),
        "cpu_target": t["cpu_target"],
        "nvcc_bytes_cmd": size,
        "nvcc_in_image": nvcc_in_image(entry),
        "container_env": None if on_nvidia_base else t["container_env"],
    }


def _check_torch(entry: Entry, torch: dict) -> list[Outcome]:
    src, tm = torch["source"], minor(entry.torch)
    out = [Outcome("torch-known", "table", "torch", True, f"torch {tm} is in the data", src)]
    cuda_known = entry.cuda in rules()["cuda"]
    out.append(Outcome("cuda-known", "table", "cuda", cuda_known,
                       f"CUDA {entry.cuda} is in the data" if cuda_known else
                       f"CUDA {entry.cuda} is not in the compatibility data (known: {', '.join(rules()['cuda'])})",
                       rules()["cuda"].get(entry.cuda, {}).get("source", "compat.yaml")))
    has_build = entry.cuda in torch["cuda_builds"]
    out.append(Outcome("torch-cuda", "table", "cuda", has_build,
                       f"torch {tm} has a CUDA {entry.cuda} build" if has_build else
                       f"torch {tm} has no CUDA {entry.cuda} build (builds: {', '.join(torch['cuda_builds'])})", src))
    if has_build and uses_pypi(entry):
        ok = entry.cuda == torch["pypi_cuda"]
        tag = "cu" + entry.cuda.replace(".", "")
        out.append(Outcome("torch-index", "table", "index_url", ok,
                           f"PyPI serves torch {tm} as the CUDA {entry.cuda} build" if ok else
                           f"PyPI serves torch {tm} only as a CUDA {torch['pypi_cuda']} build; for CUDA "
                           f"{entry.cuda} set index_url to https://download.pytorch.org/whl/{tag}", src))
    else:
        out.append(Outcome("torch-index", "table", "index_url", None, "index is not PyPI" if has_build else
                           "no such build", src))
    ok = Version(entry.python) in SpecifierSet(torch["python"])
    out.append(Outcome("torch-python", "table", "python", ok,
                       f"torch {tm} supports Python {torch['python']}" + ("" if ok else f", not {entry.python}"), src))
    return out


def base_os(entry: Entry) -> dict | None:
    """The base_os rule for the entry's base (OS, Python, apt archive), or None when its tag names no known OS."""
    tag = _base_tag(entry)
    return next((r for r in rules()["base_os"] if r["match"] in tag), None)


def apt_archive(entry: Entry) -> dict | None:
    """The apt archive the base installs from: its live host and its dated snapshot service."""
    rule = base_os(entry)
    return None if rule is None else {"name": rule["archive"], **rules()["apt_archives"][rule["archive"]]}


def _base_tag(entry: Entry) -> str:
    return entry.base_name.split(":", 1)[1] if ":" in entry.base_name.rsplit("/", 1)[-1] else ""


def _check_base(entry: Entry, recipe: bool) -> list[Outcome]:
    found = []
    if recipe:
        os_rule = base_os(entry)
        if os_rule is None:
            known = ", ".join(r["match"] for r in rules()["base_os"])
            found.append(Outcome("base-os", "recipe", "base", False, f"cannot tell the OS of base "
                                 f"'{entry.base_name}' (its tag must name one of: {known})", "compat.yaml base_os"))
        else:
            ok = os_rule["python"] == entry.python
            found.append(Outcome("base-os", "recipe", "base", True, f"base is {os_rule['os']}", os_rule["source"]))
            found.append(Outcome("base-python", "recipe", "python", ok,
                                 f"{os_rule['os']} ships Python {os_rule['python']}" + ("" if ok else
                                 f", and the image uses the base's own Python; set python: \"{os_rule['python']}\" "
                                 "or choose another base"), os_rule["source"]))
    cuda_rule = rules()["base_cuda"]
    m = re.match(cuda_rule["pattern"], entry.base_name)
    if m is None or m.group("flavor") not in cuda_rule["compiler_flavors"]:
        what = "carries no CUDA compiler" if m else "is not an nvidia/cuda image"
        found.append(Outcome("base-cuda-compiler", "base", "base", None, f"base {what}; torch's pip wheels bring "
                             "their own CUDA runtime and cuDNN", cuda_rule["source"]))
        return found
    base_major, torch_major = Version(m.group("cuda")).major, Version(entry.cuda).major
    ok = base_major == torch_major
    found.append(Outcome("base-cuda-compiler", "base", "base", ok,
                         f"the base's nvcc is CUDA {m.group('cuda')}, same major as torch's CUDA {entry.cuda}" if ok
                         else f"the base's nvcc is CUDA {m.group('cuda')} but torch is a CUDA {entry.cuda} build: "
                         "building extensions (DeepSpeed JIT ops, flash-attn from source) fails with 'The detected "
                         "CUDA version mismatches the version that was used to compile PyTorch'; use a CUDA "
                         f"{torch_major}.x devel base", cuda_rule["source"]))
    return found


# --- flash-attn -----------------------------------------------------------------------------------------


def flash_attn_builds(version: str, torch_minor: str) -> tuple[list[str], list[str] | None, str]:
    """(torch CUDA builds with a wheel, CPython versions of those wheels or None for the release list, source)."""
    data = rules()["flash_attn"]["releases"][version]
    for extra in data.get("extra", []):
        if extra["torch"] == torch_minor:
            return extra["builds"], extra["python"], extra["source"]
    return data["torch"].get(torch_minor, []), None, data["source"]


def _wheel_pythons(data: dict, torch_minor: str, own: list[str] | None) -> list[str]:
    if own is not None:
        return own
    excluded = {p for t, p in data.get("exclude", []) if t == torch_minor}
    return [p for p in data["python"] if p not in excluded]


def _check_flash_attn(entry: Entry) -> list[Outcome]:
    version = entry.pins.get("flash-attn")
    ids = ("flash-attn-known", "flash-attn-torch", "flash-attn-cuda", "flash-attn-python", "flash-attn-abi")
    if version is None:
        return [Outcome(i, "wheel", "flash-attn", None, "flash-attn is not installed", "") for i in ids]
    data = rules()["flash_attn"]["releases"].get(version)
    if data is None:
        # A recipe limit, not a rejection: the release may well have wheels, but this data has not read its release
        # workflow, so the recipe cannot name the wheel to install (render/lock stop with exit 3).
        return [Outcome("flash-attn-known", "recipe", "flash-attn", False, f"flash-attn {version} is not in the "
                        f"wheel data (known: {', '.join(rules()['flash_attn']['releases'])}): the recipe cannot name "
                        "its prebuilt wheel; run refresh-compat --flash-attn-git DIR", "compat.yaml flash_attn")]
    tm, major = minor(entry.torch), str(Version(entry.cuda).major)
    builds, own_py, src = flash_attn_builds(version, tm)
    why = "without a prebuilt wheel it builds from source for hours"
    out = [Outcome("flash-attn-known", "wheel", "flash-attn", True, f"flash-attn {version} is in the data", src)]
    if not builds:
        minors = list(data["torch"]) + [x["torch"] for x in data.get("extra", [])]
        out.append(Outcome("flash-attn-torch", "wheel", "flash-attn", False, f"flash-attn {version} has no "
                           f"prebuilt wheel for torch {tm} (wheels: {', '.join(minors)}); {why}", src))
        return out
    out.append(Outcome("flash-attn-torch", "wheel", "flash-attn", True, f"wheels for torch {tm}", src))
    build = next((b for b in builds if b.split(".")[0] == major), None)
    if build is None or major not in data["cuda_tag"]:
        out.append(Outcome("flash-attn-cuda", "wheel", "flash-attn", False, f"flash-attn {version} has no wheel "
                           f"for torch {tm} with CUDA {major}.x (built for CUDA {', '.join(builds)}); {why}", src))
        return out
    out.append(Outcome("flash-attn-cuda", "wheel", "flash-attn", True, f"CUDA {major}.x wheel "
                       f"({data['cuda_tag'][major]})", src))
    pythons = _wheel_pythons(data, tm, own_py)
    ok = entry.python in pythons
    out.append(Outcome("flash-attn-python", "wheel", "flash-attn", ok,
                       f"wheel for Python {entry.python}" if ok else
                       f"flash-attn {version} has no wheel for Python {entry.python} with torch {tm} "
                       f"(wheels: {', '.join(pythons)}); {why}", src))
    built_abi = torch_abi(tm, build) if build in rules()["torch"][tm]["cuda_builds"] else None
    entry_abi = torch_abi(tm, entry.cuda) if entry.cuda in rules()["torch"][tm]["cuda_builds"] else None
    if built_abi is None or entry_abi is None:
        out.append(Outcome("flash-attn-abi", "wheel", "flash-attn", None, "torch build unknown", src))
        return out
    ok = built_abi == entry_abi
    out.append(Outcome(
        "flash-attn-abi", "wheel", "flash-attn", ok,
        f"wheel compiled against torch {tm}+cu{build.replace('.', '')} ({_abi(built_abi)} ABI), same as the entry's"
        if ok else
        f"flash-attn {version}'s torch {tm} wheels were compiled against torch {tm}+cu{build.replace('.', '')} "
        f"({_abi(built_abi)} C++ ABI) but the entry's torch {tm}+cu{entry.cuda.replace('.', '')} uses the "
        f"{_abi(entry_abi)} ABI: import fails with 'undefined symbol: _ZN3c105ErrorC2...'; pick a flash-attn "
        "release whose wheel was built against this torch build, or the matching CUDA build of torch",
        f"{src}; https://github.com/Dao-AILab/flash-attention/issues/1783; "
        "https://github.com/Dao-AILab/flash-attention/issues/1644"))
    return out


def _abi(flag: bool) -> str:
    return "C++11" if flag else "pre-C++11"


def flash_attn_wheel(entry: Entry) -> str | None:
    """The wheel flash-attn's setup.py downloads for the entry (it picks the ABI of the installed torch)."""
    version = entry.pins.get("flash-attn")
    if not version:
        return None
    fa = rules()["flash_attn"]
    data, tm = fa["releases"][version], minor(entry.torch)
    return fa["url"].format(version=version, cuda_tag=data["cuda_tag"][str(Version(entry.cuda).major)], torch=tm,
                            abi="TRUE" if torch_abi(tm, entry.cuda) else "FALSE", py=entry.python.replace(".", ""))


# --- constraints between versions ------------------------------------------------------------------------


@lru_cache(maxsize=1)
def constraint_rules() -> tuple[dict, ...]:
    """`rules:` plus the `packages:` minimums, all as requires/forbids rules. What packages declare in their own
    metadata (Requires-Dist, Requires-Python) is judged from PyPI's data by model/signals.py."""
    out = []
    for row in rules()["packages"]:
        name = row["package"]
        for dep in ("torch", "python"):
            out.append({"id": f"{name}-{dep}", "kind": "requires", "when": {name: row["versions"]},
                        "then": {dep: row[dep]}, "field": name, "source": row["source"],
                        "reason": f"{name} {{{name}}} needs {'torch' if dep == 'torch' else 'Python'} {row[dep]}, "
                                  f"the entry has {{{dep}}}"})
    out += rules().get("rules", [])
    return tuple(out)


def _facts(entry: Entry) -> dict[str, str]:
    return {"python": entry.python, "cuda": entry.cuda, **{k: v for k, v in entry.pins.items() if v}}


def _matches(facts: dict[str, str], name: str, spec: str) -> bool:
    if name not in facts:
        return False
    return spec == "*" or Version(facts[name]) in SpecifierSet(spec, prereleases=True)


def _constraint(entry: Entry, rule: dict, ops: bool = True) -> Outcome:
    facts = _facts(entry)
    when = rule["when"]
    applies = all(_matches(facts, k, v) for k, v in when.items()) and (ops or rule.get("needs") != "ops")
    cond = ", ".join(f"{k} {v}" for k, v in when.items()) + (" when DeepSpeed's CUDA ops are compiled"
                                                             if rule.get("needs") == "ops" else "")
    if not applies:
        return Outcome(rule["id"], rule["kind"], rule["field"], None, f"applies to {cond}", rule["source"])
    if rule["kind"] == "forbids":
        ok = False
    elif rule["kind"] == "requires":
        # A `then` package that is not installed cannot conflict with anything.
        ok = all(k not in facts or _matches(facts, k, v) for k, v in rule["then"].items())
    else:
        raise ValueError(f"compat.yaml rule {rule['id']}: unknown kind {rule['kind']!r}")
    reason = " ".join(rule["reason"].split()).format_map(_Missing(facts))
    if ok:
        need = ", ".join(f"{k} {v}" for k, v in rule["then"].items())
        reason = f"{cond}: needs {need}, satisfied"
    return Outcome(rule["id"], rule["kind"], rule["field"], ok, reason, " ".join(rule["source"].split()))


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "(not installed)"


# --- outputs ---------------------------------------------------------------------------------------------


def require(entries, recipe: bool = False) -> None:
    """Raise one CompatError (exit 2) listing every compatibility violation of the entries; with recipe, then
    one RecipeLimit (exit 3) listing what stops the recipe from building combinations that work."""
    lines = [v.render(e) for e in entries for v in check(e)]
    if lines:
        raise CompatError("\n".join(lines), "change the entry or, if the rule is wrong, fix compat.yaml with a source")
    limits = [v.render(e) for e in entries for v in recipe_limits(e)] if recipe else []
    if limits:
        raise RecipeLimit("\n".join(limits), "the combination works (validate accepts it), but this recipe cannot "
                          "build it from the sources this machine reaches: add a source to compat.yaml toolchain "
                          "or base_os with its evidence, or build it elsewhere")


def derive(entry: Entry) -> dict:
    """Facts that follow from the rules: what later steps (render, labels, smoke) need."""
    torch = _torch_facts(entry)
    cuda = rules()["cuda"][entry.cuda]
    return {
        "min_driver": cuda["min_driver"],
        "toolkit_driver": cuda["toolkit_driver"],
        "cxx11abi": torch_abi(minor(entry.torch), entry.cuda),
        "cudnn_major": torch["cudnn"],
        "flash_attn_wheel": flash_attn_wheel(entry),
    }
