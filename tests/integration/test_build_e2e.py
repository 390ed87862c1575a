"""Real BuildKit build of the CI entry: verified versions, labels, facts file, no secret anywhere, skip."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile

import pytest

from builder import reports
from builder.boundary import inspect as verify
from tests.conftest import ROOT
from tests.integration.images import CI_TAG, DOCKER, MIRROR_FLAGS, default_sigint, derived_image, need_full_build

pytestmark = pytest.mark.docker
IMAGE = f"ghcr.io/train-images/train:{CI_TAG}"


def inspect(ref: str) -> dict:
    return json.loads(subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True, text=True,
                                     check=True).stdout)[0]


def test_image_is_built_and_verified(ci_build):
    need_full_build(ci_build)
    report = ci_build["report"]
    facts = json.loads((ROOT / "dockerfiles" / CI_TAG / "image.json").read_text())
    assert report["result"] == "built" and report["verification"] == "ok"
    for name, version in facts["pins"].items():
        assert report["versions"][name] == version, name
    assert report["torch_cuda"] == facts["cuda"] == "13.0"
    assert inspect(IMAGE)["Id"] == report["image_id"]
    assert report["size_bytes"] > 1e9 and report["duration_s"] > 0
    # Every RUN executed (no layer cache), so the secret scan below covers real installs.
    run_steps = set(re.findall(r"#(\d+) \[[a-z]+ \d+/\d+\] RUN ", ci_build["log"]))
    cached = set(re.findall(r"#(\d+) CACHED", ci_build["log"]))
    assert len(run_steps) >= 4 and not run_steps & cached, "every RUN step must have executed"
    # uv's install lines (` + torch==2.13.0`): torch was installed by this build, not taken from a layer cache.
    assert re.search(r"^\s*#\d+ [\d.]+\s+\+ torch==2\.13\.0$", ci_build["log"], flags=re.M)
    assert reports.problems("build", report) == [], "the real build report must match builder/schemas/build"
    # What built it, as the provenance says it: the engine that answers here and its image store.
    server = json.loads(subprocess.run([DOCKER, "info", "--format", "{{json .}}"], capture_output=True, text=True,
                                       check=True).stdout)
    assert report["docker"]["engine"] == server["ServerVersion"]
    containerd = "io.containerd.snapshotter" in json.dumps(server.get("DriverStatus"))
    assert report["docker"]["image_store"] == ("containerd" if containerd else "classic")


def step_output(log: str, title: str) -> list[str]:
    """The lines a BuildKit step printed (plain progress), found by the start of its title."""
    ids = {m.group(1) for m in re.finditer(rf"^\s*#(\d+) {re.escape(title)}", log, flags=re.M)}
    return [m.group(2) for m in re.finditer(r"^\s*#(\d+) [\d.]+ (.*)$", log, flags=re.M) if m.group(1) in ids]


def test_the_cpu_ops_both_wheels_build_alike_were_compiled_once_and_reused_by_ninja(ci_build):
    """ops-common compiles CPUAdam once; the CUDA and the CPU-accelerator builds each link it from the objects ninja
    found up to date (their logged commands are the ones it would run), and say so in the build log."""
    need_full_build(ci_build)
    from builder.model import compat, matrix

    entry = matrix.load(ROOT / "matrix.yaml").by_tag()[CI_TAG]
    shared = [f"deepspeed.ops.adam.{op['name']}_op" for op in compat.toolchain(entry)["shared_ops"]]
    assert shared == ["deepspeed.ops.adam.cpu_adam_op"]
    common = step_output(ci_build["log"], "[ops-common 1/1] RUN ")
    assert f"building '{shared[0]}' extension" in common and "ninja: no work to do." not in common, common
    for stage in ("ops 1/", "ops-cpu 1/"):  # each stage's first step: DeepSpeed's build
        out = step_output(ci_build["log"], f"[{stage}")
        built = [line for line in out if line.startswith("building '") or line.startswith("ninja: no work")]
        at = built.index(f"building '{shared[0]}' extension")
        assert built[at + 1:at + 2] == ["ninja: no work to do."], (stage, built)
        # and the stage's own ops were compiled here, not found done
        others = [i for i, line in enumerate(built) if line.startswith("building '") and i != at]
        assert others and all(built[i + 1:i + 2] != ["ninja: no work to do."] for i in others), (stage, built)
    # The CPU FusedAdam compiles CPUAdam's cpu_adam_impl.cpp again under its own -DTORCH_EXTENSION_NAME: ccache
    # (keyed on the preprocessed source) answers it from ops-common's compile; ops-common found nothing to reuse.
    counts = {stage: re.findall(r"^ccache: (\d+) of (\d+) compiles from the cache$",
                                "\n".join(step_output(ci_build["log"], f"[{stage}")), flags=re.M)
              for stage in ("ops-common 1/", "ops-cpu 1/")}
    assert counts["ops-common 1/"] and counts["ops-common 1/"][0][0] == "0", counts
    assert counts["ops-cpu 1/"] and int(counts["ops-cpu 1/"][0][0]) >= 1, counts


def test_torch_and_its_cuda_libraries_are_two_layers_of_comparable_size(ci_build):
    """The ~5 GB of torch in two layers: the export hashes them in parallel and a pull fetches them in parallel,
    so neither may hold most of the bytes."""
    history = subprocess.run([DOCKER, "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}",
                              IMAGE], capture_output=True, text=True, check=True).stdout.splitlines()
    sizes = {what: int(line.split("\t")[0]) for line in history
             for what, marker in (("cuda", "-r /.in-torch-cuda.lock"),
                                  ("torch", "-r /.in-torch.lock")) if marker in line}
    assert sizes.keys() == {"cuda", "torch"}, history
    assert min(sizes.values()) > 1.5e9 and max(sizes.values()) < 0.65 * sum(sizes.values()), sizes


def test_labels(ci_build):
    labels = inspect(IMAGE)["Config"]["Labels"]
    report = ci_build["report"]
    assert labels["org.opencontainers.image.version"] == CI_TAG
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert len(labels["org.opencontainers.image.revision"]) >= 40
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert labels["org.opencontainers.image.base.digest"].startswith("sha256:")
    assert labels["io.train-images.input-hash"] == report["input_hash"]
    assert labels["io.train-images.pin.torch"] == "2.13.0"
    assert labels["io.train-images.pin.flash-attn"] == "none"
    assert labels["io.train-images.min-driver"] == "580.65.06"
    # The base here is a local debootstrap copy, not the pinned digest: that must be visible.
    assert labels["io.train-images.base.substituted"] == "true"


def test_facts_file_inside_image(ci_build):
    out = subprocess.run([DOCKER, "run", "--rm", "--network", "none", IMAGE, "cat", "/opt/train-image/image.json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == json.loads((ROOT / "dockerfiles" / CI_TAG / "image.json").read_text())
    which = subprocess.run([DOCKER, "run", "--rm", "--network", "none", IMAGE, "sh", "-c", "command -v smoke"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert which == "/usr/local/bin/smoke"


def test_no_secret_in_layers_history_config_or_log(ci_build, tmp_path):
    need_full_build(ci_build)
    marker = ci_build["marker"].encode()
    assert marker not in ci_build["log"].encode(), "the CA bundle leaked into the build log"
    history = subprocess.run([DOCKER, "history", "--no-trunc", IMAGE], capture_output=True, text=True, check=True)
    assert ci_build["marker"] not in history.stdout
    assert str(ci_build["bundle"]) not in history.stdout, "the secret's path is in the history"
    assert ci_build["marker"] not in json.dumps(inspect(IMAGE))
    # Every byte of every layer: docker save streams the image as a tar of layer tars.
    save = subprocess.Popen([DOCKER, "save", IMAGE], stdout=subprocess.PIPE)
    scanned = 0
    with tarfile.open(fileobj=save.stdout, mode="r|") as outer:
        for member in outer:
            if not member.isfile():
                continue
            handle = outer.extractfile(member)
            tail = b""
            while chunk := handle.read(1 << 22):
                assert marker not in tail + chunk, f"the CA bundle's bytes are in {member.name}"
                tail = chunk[-len(marker):]
                scanned += len(chunk)
    assert save.wait() == 0
    assert scanned > 1e9, f"only {scanned} bytes scanned"


def test_second_build_with_unchanged_inputs_is_skipped(ci_build):
    proc = subprocess.run([sys.executable, "-m", "builder", "build", CI_TAG, *MIRROR_FLAGS], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((ROOT / "build/reports" / f"{CI_TAG}.build.json").read_text())
    assert report["result"] == "skipped" and report["image_id"] == ci_build["report"]["image_id"]
    assert reports.problems("build", report) == []
    assert "docker build" not in proc.stderr.split("▶ build")[1]
    assert "skipped" in proc.stderr  # the summary table says so


def test_verification_names_a_replaced_package(ci_build, tmp_path):
    # A later install that moves a pinned package must be caught with the package named.
    ref = derived_image("moved-transformers", IMAGE, ["pip install --no-deps transformers==5.23.0"], tmp_path)
    facts = json.loads((ROOT / "dockerfiles" / CI_TAG / "image.json").read_text())
    problems = verify.problems(facts, verify.installed(ref))
    assert problems == ["transformers: installed 5.23.0, matrix pins 5.24.0"]


def test_ctrl_c_stops_cleanly(ci_build):
    """SIGINT during a real build: the docker build stops, the summary says so, exit 130, tag not moved."""
    import signal
    import time

    before = inspect(IMAGE)["Id"]
    proc = subprocess.Popen([sys.executable, "-m", "builder", "build", CI_TAG, "--local-base", "--force",
                             "--no-cache"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    seen = ""
    deadline = time.monotonic() + 300
    while "[os " not in seen and time.monotonic() < deadline:  # BuildKit has started the first stage
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    output = seen + rest
    assert proc.returncode == 130, output[-2000:]
    assert "interrupted" in output and "Traceback" not in output
    leftover = subprocess.run(["pgrep", "-f", f"docker build .*-t {IMAGE} "], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "the docker build process must not outlive the builder"
    assert inspect(IMAGE)["Id"] == before, "an interrupted build must not move the tag"


def _starts_a_real_build(argv: list[str]) -> tuple[bool, str]:
    """Run `builder build` until it either finishes (skipped) or starts `docker build`; then Ctrl-C it."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "builder", "build", CI_TAG, *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    seen, deadline = "", time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if line.startswith(f"+ {DOCKER} build") or line.startswith("+ docker build"):
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=120)
            return True, seen + rest
    proc.wait(timeout=60)
    return False, seen


def test_a_build_flag_change_is_not_skipped(ci_build):
    """The input hash covers the build flags: another apt mirror (here Debian's own) is another image."""
    before = inspect(IMAGE)["Id"]
    started, output = _starts_a_real_build(["--local-base", "--apt-mirror", "http://deb.debian.org/debian"])
    assert started, "a changed --apt-mirror must rebuild, not skip: " + output[-1500:]
    assert "APT_MIRROR=http://deb.debian.org/debian" in output
    assert inspect(IMAGE)["Id"] == before


def test_a_foreign_image_under_the_name_is_never_skipped_to(ci_build, tmp_path):
    """An image that carries our input-hash label but that this builder did not build (pulled, or left by a
    pull request on a shared runner) is rebuilt, not trusted."""
    original = inspect(IMAGE)["Id"]
    foreign = derived_image("foreign-same-labels", IMAGE, ["true"], tmp_path)
    assert inspect(foreign)["Config"]["Labels"]["io.train-images.input-hash"] == ci_build["report"]["input_hash"]
    subprocess.run([DOCKER, "tag", foreign, IMAGE], check=True)
    try:
        started, output = _starts_a_real_build(list(MIRROR_FLAGS))
        assert started, "an image this builder did not build must not be skipped to: " + output[-1500:]
    finally:
        subprocess.run([DOCKER, "tag", original, IMAGE], check=True)


def test_two_builds_of_one_tag_at_once(ci_build):
    """The second stops at once (exit 3, naming the first); the first is not disturbed."""
    import signal
    import time

    first = subprocess.Popen([sys.executable, "-m", "builder", "build", CI_TAG, "--local-base", "--force"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)
    try:
        deadline, seen = time.monotonic() + 300, ""
        while time.monotonic() < deadline and "  sources: " not in seen:  # printed under the tag lock
            seen += first.stdout.readline()
        second = subprocess.run([sys.executable, "-m", "builder", "build", CI_TAG, "--local-base", "--force"],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 3, second.stderr[-1500:]
        assert f"`build` (pid {first.pid}) is working on this tag right now" in second.stderr
        assert first.poll() is None, "the first build must go on"
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=180)
