"""What is in a built image, read by running smoke/'s stdlib scripts in it (smoke/ is in every image).

`problems` checks the image against its own facts: every pin installed at its version, torch the CUDA build
it should be and not replaced by a later install, `pip check` clean. `inventory` lists every package for the
SBOM; `read_facts`, `read_locks` and `read_os_release` copy files out without starting a container.
"""

from __future__ import annotations

import io
import json
import tarfile

from builder.boundary import engine
from builder.errors import StepFailed
from builder.model import schemas

IN_IMAGE_SCRIPT = "/opt/train-image/smoke/installed.py"
FACTS = "/opt/train-image/image.json"
MAX_COPY = 64 << 20  # facts, locks and os-release are kilobytes: an engine sending more is not believed


def _script_output(image: str, script: str, prefix: str, schema: str) -> tuple[dict | None, str]:
    """Run one of smoke/'s stdlib scripts in the image (smoke/ is in every image); its JSON line, checked against
    smoke/schemas/<schema>.schema.json (the image is whatever a registry served: its scripts may print anything),
    or why not."""
    code, logs = engine.run_container(image, ["python", script], timeout=300)
    for line in logs.splitlines():
        if line.startswith(prefix):
            try:
                found = json.loads(line[len(prefix):])
            except (ValueError, RecursionError):
                return None, f"{script} printed a {prefix.strip()} line that is not JSON"
            wrong = schemas.problems(schema, found, smoke=True)
            if wrong:
                return None, f"{script} printed {prefix.strip()} of the wrong shape: {wrong[0]}"
            return found, ""
    return None, f"exit {code}: {logs.strip()[-500:]}"


def installed(image: str) -> dict:
    """What is installed, as smoke/installed.py reports it (smoke/schemas/installed.schema.json)."""
    found, why = _script_output(image, IN_IMAGE_SCRIPT, "INSTALLED-JSON ", "installed")
    return found if found is not None else {"error": why}


def problems(facts: dict, found: dict) -> list[str]:
    """Each mismatch, naming the package. Empty when the image is what its facts say."""
    if "error" in found:
        return [f"could not inspect the image: {found['error']}"]
    out = []
    for name, pinned in facts["pins"].items():
        got = found["versions"].get(name)
        if pinned is None and got is not None:
            out.append(f"{name} {got} is installed but the matrix pins none")
        elif pinned is not None and got != pinned:
            out.append(f"{name}: installed {got or 'nothing'}, matrix pins {pinned}")
    if found.get("torch_error"):
        out.append(f"torch does not import: {found['torch_error']}")
    elif found.get("torch_cuda") != facts["cuda"]:
        out.append(f"torch is a CUDA {found.get('torch_cuda')} build, the entry says CUDA {facts['cuda']} "
                   "(was torch replaced by a later install?)")
    if found.get("torch_dists", 0) > 1:
        out.append(f"{found['torch_dists']} distributions provide `torch`: a second torch was installed")
    for rogue in ("pynvml", "nvidia-ml-py3"):
        if found["versions"].get(rogue):
            out.append(f"{rogue} {found['versions'][rogue]} is installed; the NVML binding must be nvidia-ml-py")
    if not found.get("pip_check", {}).get("ok"):
        out.append(f"pip check fails: {found.get('pip_check', {}).get('output', '')}")
    if not found.get("python", "").startswith(facts["python"] + "."):
        out.append(f"Python is {found.get('python')}, the entry says {facts['python']}")
    return out


INVENTORY_SCRIPT = "/opt/train-image/smoke/inventory.py"


def inventory(image: str) -> dict:
    """Every Python and OS package in the image, with a content hash each (smoke/inventory.py)."""
    found, why = _script_output(image, INVENTORY_SCRIPT, "INVENTORY-JSON ", "inventory")
    if found is None:
        raise StepFailed(f"could not list the packages of {image}: {why[-300:]}")
    return found


def _copy_out(image, path: str) -> dict[str, bytes]:
    """The regular files at `path` (a file or a directory, not below it) in the image, by base name, copied out
    of a created (never started) container: works without a shell. NotFound and the like propagate: each caller
    says what its missing file means."""
    container = engine.sdk().containers.create(image.id, command=["true"], network_disabled=True)
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(_at_most(stream, MAX_COPY))) as tar:
            return {m.name.rsplit("/", 1)[-1]: tar.extractfile(m).read() for m in tar.getmembers()
                    if m.isfile() and m.name.count("/") <= 1}
    finally:
        container.remove(force=True)


def _at_most(chunks, limit: int) -> bytes:
    """The streamed bytes, or ValueError past `limit` (an endless archive from the engine)."""
    out = bytearray()
    for chunk in chunks:
        out += chunk
        if len(out) > limit:
            raise ValueError(f"the engine sent more than {limit >> 20} MiB")
    return bytes(out)


def _image_name(image) -> str:
    return image.tags[0] if image.tags else image.id[:19]


def read_facts(image) -> dict:
    """The image's facts file (see _copy_out), checked against builder/schemas/facts.schema.json where it is read:
    the image comes from outside (any registry), and a list, or `pins` as text, must be one line, not a traceback
    in whichever caller reads a field first."""
    try:
        data = json.loads(next(iter(_copy_out(image, FACTS).values())))
    except Exception as exc:  # noqa: BLE001 - NotFound, bad tar, bad JSON: one answer for the user
        raise StepFailed(f"{_image_name(image)} has no readable {FACTS} ({type(exc).__name__})",
                         "this is not a train-images image, or it was built incorrectly") from None
    wrong = schemas.problems("facts", data)
    if wrong:
        more = f" (+{len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise StepFailed(f"{_image_name(image)}: {FACTS} is not this builder's facts file: {wrong[0]}{more}",
                         "this image was not built by this builder, or its facts file was altered: rebuild it")
    return data


LOCKS = "/opt/train-image/locks"
OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")


def read_locks(image) -> dict[str, bytes]:
    """The lock files the image was built from, as the image carries them ({file name: content})."""
    try:
        return {name: data for name, data in _copy_out(image, LOCKS).items() if name.endswith(".lock")}
    except Exception as exc:  # noqa: BLE001 - NotFound or a bad tar: the image carries no locks
        raise StepFailed(f"{_image_name(image)} has no readable {LOCKS}/ ({type(exc).__name__})",
                         "this image was not built by this builder, or was built incorrectly") from None


def read_os_release(image) -> str:
    """The image's os-release text (the distribution and its version, as scanners read it)."""
    for path in OS_RELEASE:
        try:
            return next(iter(_copy_out(image, path).values())).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001, S112 - /etc/os-release is often a link: try the next place
            continue
    raise StepFailed(f"{_image_name(image)} has no readable {' or '.join(OS_RELEASE)}",
                     "an SBOM names the distribution of its OS packages; this image does not say which it is")
