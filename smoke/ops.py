"""DeepSpeed's prebuilt ops: what the image claims, what is really in the wheel, and whether it loads.

Used twice, standard library only (plus deepspeed/torch when asked to load an op):
  - at build time, last step of the Dockerfile's ops stage: `python ops.py verify --ops fused_adam,cpu_adam
    --arch-list "7.5;8.0+PTX" --out ops.json` fails the stage when an op is missing, built for another
    accelerator, unloadable, compiled for other GPU archs than asked, or carries AVX-512 code;
  - in the gate (the `ops` check, `run` below): the same facts, read back from the installed package, under
    DS_ACCELERATOR=cuda with no compiler on PATH, so a missing op cannot hide behind a JIT build.

GPU archs are read from the op's ELF `.nv_fatbin` section (what `cuobjdump --list-elf` shows), so a CPU host can
tell whether the ops run on a given GPU: SASS for X.y runs on X.z (z >= y); PTX for X.y JIT-compiles on
anything >= X.y.
"""

import argparse
import importlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def elf_section(path, name):
    """Bytes of section `name` of a 64-bit little-endian ELF file, or None."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for sh in sections:
        end = names.index(b"\0", sh[0])
        if names[sh[0]:end].decode() == name:
            return data[sh[4]:sh[4] + sh[5]]
    return None


def fatbin_archs(path):
    """Sorted list of ("sm"|"ptx", "X.Y") embedded in the library's fat binary (empty: no GPU code)."""
    blob = elf_section(path, ".nv_fatbin")
    found = set()
    if not blob:
        return []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; skip padding
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 32 <= end:
            kind, _, entry_header, size = struct.unpack_from("<HHIQ", blob, entry)
            arch, = struct.unpack_from("<I", blob, entry + 28)
            if kind in (KIND_PTX, KIND_ELF) and arch:
                found.add(("ptx" if kind == KIND_PTX else "sm", f"{arch // 10}.{arch % 10}"))
            if entry_header == 0:
                break
            entry += entry_header + size
        pos = end
    return sorted(found, key=lambda a: (tuple(int(x) for x in a[1].split(".")), a[0]))


def parse_arch_list(text):
    """TORCH_CUDA_ARCH_LIST ("7.5;8.0;9.0+PTX") -> set of ("sm"|"ptx", "X.Y")."""
    out = set()
    for token in text.replace(" ", ";").split(";"):
        token = token.strip()
        if not token:
            continue
        arch = token.split("+")[0]
        out.add(("sm", arch))
        if token.endswith("+PTX"):
            out.add(("ptx", arch))
    return out


def _cap(text):
    major, minor = text.split(".")
    return int(major), int(minor)


def runs_on(archs, capability):
    """Does code with these archs run on a GPU of `capability` ("8.9")? Returns the arch used, or None."""
    want = _cap(capability)
    sass = [a for k, a in archs if k == "sm" and _cap(a)[0] == want[0] and _cap(a)[1] <= want[1]]
    if sass:
        return "sm_" + max(sass, key=_cap).replace(".", "")
    ptx = [a for k, a in archs if k == "ptx" and _cap(a) <= want]
    if ptx:
        return "compute_" + max(ptx, key=_cap).replace(".", "") + " (PTX JIT)"
    return None


def avx512_instructions(path):
    """How many instructions use AVX-512 registers (zmm): nonzero means the op dies (SIGILL) on CPUs without it."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", path], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if "%zmm" in line)


def op_file(module):
    spec = importlib.util.find_spec(module)
    return spec.origin if spec else None


def inventory(ops):
    """Per op: prebuilt (installed_ops), file, size, GPU archs. `ops` is [{"name", "module", "cuda"}]."""
    from deepspeed.git_version_info import accelerator_name, installed_ops
    result = {"accelerator": accelerator_name, "ops": {}}
    for op in ops:
        path = op_file(op["module"])
        entry = {"prebuilt": bool(installed_ops.get(op["name"])), "module": op["module"], "file": path}
        if path:
            entry["bytes"] = os.path.getsize(path)
            entry["archs"] = ["{}_{}".format(k, a.replace(".", "")) for k, a in fatbin_archs(path)]
        result["ops"][op["name"]] = entry
    return result


def problems(ops, arch_list, inv, accelerator="cuda"):
    """Everything wrong with the built ops; empty when the image has what it claims."""
    found = []
    if inv["accelerator"] != accelerator:
        found.append(f"ops were built for accelerator {inv['accelerator']!r}, not {accelerator!r}: DeepSpeed ignores "
                     f"them under that accelerator and JIT-builds (build with DS_ACCELERATOR={accelerator})")
    want = parse_arch_list(arch_list) if arch_list else None
    for op in ops:
        got = inv["ops"][op["name"]]
        if not got["prebuilt"] or not got["file"]:
            found.append(f"{op['name']}: not prebuilt (installed_ops={got['prebuilt']}, module {op['module']} "
                         f"{'absent' if not got['file'] else 'present'}): DeepSpeed would JIT-build it at run time")
            continue
        if op.get("cuda") and want is not None:
            have = {(k, a) for k, a in fatbin_archs(got["file"])}
            if have != want:
                found.append(f"{op['name']}: GPU code for {sorted(have)} but the arch list asked for {sorted(want)}")
    return found


def load(ops):
    """Import every op module: links against this torch (ABI) and its CUDA libraries. Returns problems."""
    found = []
    for op in ops:
        try:
            importlib.import_module(op["module"])
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            found.append(f"{op['name']}: {op['module']} does not load: {type(e).__name__}: {e}")
    return found


def verify(args):
    ops = json.loads(args.ops)
    inv = inventory(ops)
    found = problems(ops, args.arch_list, inv, args.accelerator)
    found += load([o for o in ops if inv["ops"][o["name"]]["file"]])
    for op in ops:
        path = inv["ops"][op["name"]]["file"]
        if path and not op.get("cuda"):
            n = avx512_instructions(path)
            inv["ops"][op["name"]]["avx512_instructions"] = n
            # An op that picks its AVX-512 kernels at run time (__builtin_cpu_supports) is portable: counted only.
            if n and not op.get("avx512_dispatched"):
                found.append(f"{op['name']}: {n} AVX-512 instructions: built for the build machine's CPU, not the "
                             "portable target")
    inv.update(arch_list=args.arch_list, cpu_target=args.cpu_target, nvcc=args.nvcc,
               nvcc_bytes=int(args.nvcc_bytes) if args.nvcc_bytes else None)
    for line in found:
        print(f"ops check: {line}", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(inv, f, indent=2, sort_keys=True)
            f.write("\n")
    print(json.dumps(inv, indent=2, sort_keys=True))
    return 1 if found else 0


# ----------------------------------------------------------------------------- the gate's "ops" check

def probe(ops, with_report=False):
    """In a process with DS_ACCELERATOR=cuda and no compiler on PATH: load each op the way DeepSpeed's
    optimizers do (get_accelerator().create_op_builder(NAME).load()). Prints JSON per op (and, with_report,
    DeepSpeed's op table as "_ds_report")."""
    out = {}
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import accelerator_name, installed_ops
        acc = get_accelerator()
        out.update(_accelerator=acc._name, _built_for=accelerator_name, _package=os.path.dirname(deepspeed.__file__))
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"_error": f"{type(e).__name__}: {e}"}))
        return 1
    for op in ops:
        r = {"prebuilt": bool(installed_ops.get(op["name"]))}
        try:
            builder = acc.create_op_builder(op["builder"]) if op.get("builder") else None
            if builder is None:
                raise LookupError(f"DeepSpeed's {acc._name} accelerator has no builder {op.get('builder')!r}")
            module = builder.load()
            r.update(loaded=True, module=getattr(module, "__file__", None))
        except BaseException as e:  # noqa: BLE001 - SystemExit from a failed JIT too
            r.update(loaded=False, error=f"{type(e).__name__}: {e}"[:1500])
        out[op["name"]] = r
    if with_report:
        try:
            out["_ds_report"] = ds_report()
        except Exception as e:  # noqa: BLE001 - the table is a figure; the loads above are the verdict
            out["_ds_report"] = {"_error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(out))
    return 0


def _no_compiler_path():
    """A PATH with python only: no c++/g++/gcc/nvcc/ninja, so a JIT build is impossible."""
    import tempfile
    d = tempfile.mkdtemp(prefix="smoke-nocc-")
    os.symlink(sys.executable, os.path.join(d, "python"))
    return d


def ds_report():
    """DeepSpeed's own op inventory (what `ds_report` prints), from this process: op -> "installed/compatible".
    Read in the probe, which has DeepSpeed imported already (a process of its own cost ~4 s of CPU)."""
    import contextlib
    import io

    from deepspeed import env_report
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        env_report.op_report(verbose=False)
    return parse_ds_report(buf.getvalue())


def parse_ds_report(text):
    table = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+) \.+ (\S+) \.+ (\S+)", re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            table[m.group(1)] = f"{m.group(2).strip('[]')}/{m.group(3).strip('[]')}"
    return table


def run(res, facts, mode):
    """The image's prebuilt ops load under the CUDA accelerator with no build step, and cover its GPUs."""
    spec = facts.get("ops") or {}
    names = facts.get("deepspeed_ops") or []
    if not names:
        res.add("image claims prebuilt DeepSpeed ops", None, "facts list none")
        return
    ops = [{"name": n, "builder": spec.get("builders", {}).get(n), "module": spec.get("modules", {}).get(n),
            "cuda": n in spec.get("cuda_ops", [])} for n in names]
    env = _probe_env("cuda", mode)
    from smoke import signatures
    got = _probe(res, env, ops, with_report=True)
    if got is None:
        return
    res.figures["accelerator"] = got.get("_accelerator")
    res.figures["compiler_on_path"] = False
    inv = {}
    for op in ops:
        r = got[op["name"]]
        # The file DeepSpeed loaded under the CUDA accelerator (the probe's); this process may resolve the module
        # name to the CPU-accelerator build (DS_ACCELERATOR=cpu in a CPU gate puts it first on sys.path).
        path = r.get("module") if r.get("loaded") else (op_file(op["module"]) if op["module"] else None)
        archs = fatbin_archs(path) if path else []
        inv[op["name"]] = {"prebuilt": r["prebuilt"], "loaded": r.get("loaded"),
                           "archs": ["{}_{}".format(k, a.replace(".", "")) for k, a in archs]}
        if not r["prebuilt"]:
            res.add(f"{op['name']} prebuilt", False, "not prebuilt into the image (DeepSpeed installed_ops says "
                    "False): it would be JIT-built on first use, which needs " +
                    ("nvcc/CUDA_HOME" if op["cuda"] else "g++, ninja and Python.h") +
                    (f"; here: {r.get('error', '')[:300]}" if not r.get("loaded") else ""))
            # Only this signature: the ninja/compiler errors behind it come from the PATH this check strips on purpose.
            res.hint(next(line for line in signatures.explain("not prebuilt into the image")
                          if line.startswith("op_not_prebuilt")).rsplit(" [", 1)[0])
            continue
        res.add(f"{op['name']} loads with no build step", r.get("loaded"), r.get("module") or r.get("error", ""))
        if not r.get("loaded"):
            res.diagnose(r.get("error", ""))
        if op["cuda"]:
            claims = dict(facts.get("gpu_capability") or {})
            if mode == "gpu":
                try:
                    import torch
                    for i in range(torch.cuda.device_count()):
                        major, minor = torch.cuda.get_device_capability(i)
                        claims[torch.cuda.get_device_name(i)] = f"{major}.{minor}"
                except Exception as e:  # noqa: BLE001
                    res.add("GPU capability readable", False, e)
            missing = [f"{gpu} (sm_{cap.replace('.', '')})" for gpu, cap in sorted(claims.items())
                       if runs_on(archs, cap) is None]
            built = ", ".join(inv[op["name"]]["archs"]) or "no GPU code"
            res.add(f"{op['name']} has GPU code for every GPU the image claims", not missing,
                    (f"no code for {', '.join(missing)}: built for {built} -> 'no kernel image is available for "
                     "execution on the device' on those GPUs; rebuild with their archs in TORCH_CUDA_ARCH_LIST")
                    if missing else f"{len(claims)} GPUs covered by {built}")
    res.figures["ops"] = inv
    res.figures["ds_report"] = got.get("_ds_report")
    res.summary = ", ".join(f"{n} " + (f"prebuilt [{', '.join(v['archs']) or 'cpu'}]" if v["prebuilt"]
                                       else "NOT prebuilt") for n, v in inv.items())
    if spec.get("cpu_accelerator"):
        cpu_accelerator(res, spec["cpu_accelerator"], mode)


def _probe_env(accelerator, mode):
    """The probe's environment: the given DeepSpeed accelerator, no compiler on PATH, no extensions dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "CUDA_HOME", "CUDA_PATH")}
    env.update(DS_ACCELERATOR=accelerator, PATH=_no_compiler_path(), TORCH_EXTENSIONS_DIR="/nonexistent-smoke")
    if mode == "cpu" or accelerator == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _probe(res, env, ops, with_report=False):
    """Run `probe` in a child with `env`: its JSON, or None after recording why it did not run."""
    p = subprocess.run([sys.executable, "-m", "smoke.ops", "probe", "--ops", json.dumps(ops)] +
                       (["--ds-report"] if with_report else []), env=env,
                       capture_output=True, text=True, timeout=300)
    try:
        got = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res.add(f"op probe ran (DS_ACCELERATOR={env['DS_ACCELERATOR']})", False,
                f"exit {p.returncode}: {p.stderr.strip()[-800:]}")
        res.diagnose(p.stderr)
        return None
    if "_error" in got:
        res.add(f"deepspeed imports under DS_ACCELERATOR={env['DS_ACCELERATOR']}", False, got["_error"])
        res.diagnose(got["_error"])
        return None
    return got


def cpu_accelerator(res, spec, mode):
    """DeepSpeed's CPU-accelerator ops (what a GPU-less host and the CPU gate load) are prebuilt: under
    DS_ACCELERATOR=cpu, with no compiler on PATH, DeepSpeed resolves to the CPU build in spec["dir"] and loads
    each op from there, never through a JIT build."""
    ops = [{"name": n, "builder": b, "module": spec["modules"][n], "cuda": False} for n, b in spec["builders"].items()]
    got = _probe(res, _probe_env("cpu", mode), ops)
    if got is None:
        return
    where, built_for = got.get("_package") or "", got.get("_built_for")
    res.add("DS_ACCELERATOR=cpu finds DeepSpeed's CPU build", where.startswith(spec["dir"] + os.sep) and
            built_for == "cpu", f"deepspeed from {where}, built for {built_for!r} (expected {spec['dir']}, 'cpu')")
    inv = {}
    for op in ops:
        r = got[op["name"]]
        from_dir = (r.get("module") or "").startswith(spec["dir"] + os.sep)
        inv[op["name"]] = {"prebuilt": r["prebuilt"], "loaded": r.get("loaded"), "module": r.get("module")}
        res.add(f"{op['name']} (CPU accelerator) loads prebuilt with no build step",
                bool(r["prebuilt"] and r.get("loaded") and from_dir),
                r.get("module") if r.get("loaded") else r.get("error", "not loaded"))
        if not r.get("loaded"):
            res.diagnose(r.get("error", ""))
    res.figures["cpu_accelerator_ops"] = inv
    res.summary += "; CPU accelerator: " + ", ".join(
        f"{n} {'prebuilt' if v['prebuilt'] and v['loaded'] else 'NOT prebuilt'}" for n, v in inv.items())


def main(argv=None):
    p = argparse.ArgumentParser(prog="ops", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="fail unless every op is prebuilt, loads and has the asked GPU archs")
    v.add_argument("--ops", required=True, help='JSON list of {"name", "module", "cuda"}')
    v.add_argument("--accelerator", default="cuda", help="the DS_ACCELERATOR the wheel was built for")
    v.add_argument("--arch-list", default="", help="the TORCH_CUDA_ARCH_LIST the ops were built with")
    v.add_argument("--cpu-target", default="")
    v.add_argument("--nvcc", default="")
    v.add_argument("--nvcc-bytes", default="")
    v.add_argument("--out")
    a = sub.add_parser("archs", help="print the GPU archs embedded in a shared library")
    a.add_argument("path")
    pr = sub.add_parser("probe", help="load each op as DeepSpeed does; JSON out")
    pr.add_argument("--ops", required=True)
    pr.add_argument("--ds-report", action="store_true", help="add DeepSpeed's op table (ds_report) as _ds_report")
    args = p.parse_args(argv)
    if args.cmd == "probe":
        return probe(json.loads(args.ops), args.ds_report)
    if args.cmd == "archs":
        print(" ".join(f"{k}_{x.replace('.', '')}" for k, x in fatbin_archs(args.path)))
        return 0
    return verify(args)


if __name__ == "__main__":
    sys.exit(main())
