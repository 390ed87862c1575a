"""The Docker boundary: the CLI for BuildKit builds, the SDK for images and containers.

The Docker SDK cannot do BuildKit builds (no secrets, no cache mounts), so builds go through the
`docker` CLI: `docker buildx build --load` where the plugin exists, otherwise `DOCKER_BUILDKIT=1
docker build` on a client that still embeds BuildKit (< 23). The binary is a setting (BUILDER_DOCKER)
because a machine can have a modern client without buildx next to an older one that works.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from builder import log
from builder.boundary import process
from builder.errors import EnvironmentProblem

CANDIDATES = ("docker", "/usr/bin/docker")
START_HINT = "start one: `sudo systemctl start docker`, or `dockerd >/tmp/dockerd.log 2>&1 &` as root"
GONE_HINT = ("check that it runs again (`docker info`; restart it: `sudo systemctl restart docker`, or start `dockerd` "
             "as root), then re-run the same command")


def address() -> str:
    """The engine both the SDK and the CLI talk to: DOCKER_HOST (both honour it), else the default socket."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


@contextmanager
def answering(what: str) -> Iterator[None]:
    """The engine going away while we talk to it (stopped, restarted, crashed: the SDK's connection is
    refused or reset) is the machine's fault, exit 3 with how to bring it back, not a traceback. So is an
    answer that is not JSON where the Engine API sends JSON."""
    from requests.exceptions import ConnectionError as RequestsConnectionError
    from requests.exceptions import InvalidJSONError

    try:
        yield
    except RequestsConnectionError as exc:
        raise EnvironmentProblem(f"the Docker engine at {address()} stopped answering {what} ({_reason(exc)})",
                                 GONE_HINT) from None
    except InvalidJSONError as exc:
        raise not_engine(f"answered {what} with something that is not JSON ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:160]


def not_engine(what: str) -> EnvironmentProblem:
    """The thing at DOCKER_HOST answers, but not as a Docker engine does (exit 3: the machine's engine is wrong)."""
    return EnvironmentProblem(f"the Docker engine at {address()} {what}",
                              "check that DOCKER_HOST names a working Docker engine (`docker version`)")


@dataclass(frozen=True)
class Client:
    binary: str
    mode: str  # "buildx" or "legacy"

    def build_argv(self, output: str | None = None) -> list[str]:
        """The build command; `output` (buildx only) replaces `--load`, BuildKit's `type=docker` with no options."""
        if self.mode != "buildx":
            return [self.binary, "build"]
        return [self.binary, "buildx", "build", *(["--output", output] if output else ["--load"])]

    def env(self) -> dict:
        # BUILDX_METADATA_PROVENANCE: BuildKit's provenance in the metadata file, not in the image (buildkit.argv).
        return dict(os.environ, DOCKER_BUILDKIT="1", BUILDX_METADATA_PROVENANCE="max")


def _quiet(argv: list[str], timeout: int = 20) -> process.Result:
    """A probe of a candidate client: one that cannot run, or hangs, is simply not the one (exit 127)."""
    try:
        return process.run(argv, timeout=timeout, echo=False)
    except EnvironmentProblem as exc:
        return process.Result(127, "", exc.message, "")


@functools.lru_cache(maxsize=1)
def client() -> Client:
    """Pick the docker binary that can run BuildKit builds."""
    setting = os.environ.get("BUILDER_DOCKER")
    candidates = [setting] if setting else [c for c in CANDIDATES if shutil.which(c)]
    if not candidates:
        raise EnvironmentProblem("no `docker` client found", "install Docker (Debian: apt-get install docker.io)")
    for binary in candidates:
        if _quiet([binary, "buildx", "version"]).returncode == 0:
            return Client(binary, "buildx")
        version = _quiet([binary, "version", "--format", "{{.Client.Version}}"]).stdout.strip()
        major = re.match(r"([0-9]{1,4})\.", version)  # anything else ("banana", a banner) is not a client we know
        if major and int(major.group(1)) < 23:
            return Client(binary, "legacy")
    raise EnvironmentProblem(
        f"no docker client here can run BuildKit builds (tried {', '.join(candidates)})",
        "install the buildx plugin, or set BUILDER_DOCKER to a docker client older than 23",
    )


MAX_ANSWER = 64 << 20  # the engine's JSON answers are kilobytes, a whole gate's logs a few megabytes


@functools.lru_cache(maxsize=1)
def sdk():
    """A Docker SDK client, after checking that an engine answers and supports BuildKit. The SDK asks for the
    engine's API version itself; we ask first (bounded, checked) and hand it the version to use."""
    import docker
    from requests.exceptions import RequestException

    try:
        probe = _bounded(docker.from_env(version=docker.constants.DEFAULT_DOCKER_API_VERSION, timeout=60))
        server, api_version = _versions(probe.api.version(api_version=False))
        api = _bounded(docker.from_env(version=api_version, timeout=600))
    except (docker.errors.DockerException, RequestException, ValueError) as exc:
        # ValueError: an answer that is not JSON (the SDK does not wrap it), an unusable DOCKER_HOST.
        hint = START_HINT if "DOCKER_HOST" not in os.environ else \
            "DOCKER_HOST is set: check that it names a running engine (unix:///PATH, tcp://HOST:PORT) or unset it; " \
            + START_HINT
        raise EnvironmentProblem(f"no Docker engine answers at {address()} ({_reason(exc)})", hint) from None
    major, minor = (int(x) for x in server.split(".")[:2])
    if (major, minor) < (18, 9):
        raise EnvironmentProblem(f"Docker engine {server} is too old for BuildKit", "upgrade to 18.09 or newer")
    return api


def _versions(answer) -> tuple[str, str]:
    """(engine version MAJOR.MINOR, API version) from GET /version, or exit 3 saying what came instead."""
    server = answer.get("Version") if isinstance(answer, dict) else None
    api_version = answer.get("ApiVersion") if isinstance(answer, dict) else None
    found = re.match(r"([0-9]{1,4})\.([0-9]{1,4})", server) if isinstance(server, str) else None
    if not found or not isinstance(api_version, str) or not re.fullmatch(r"1\.[0-9]{1,3}", api_version):
        shown = (f"version {str(server)[:40]!r}, API version {str(api_version)[:40]!r}" if isinstance(answer, dict)
                 else f"a JSON {type(answer).__name__}, not an object")
        raise not_engine(f"answered GET /version with no usable version ({shown})")
    return found.group(0), api_version


def _bounded(client):
    """`client` with every answer not read as a stream bounded to MAX_ANSWER bytes (see _read_bounded)."""
    client.api.hooks["response"].append(_read_bounded)
    return client


def _read_bounded(response, *args, stream: bool = False, **kwargs):
    """Read a whole answer here, at most MAX_ANSWER bytes, before requests would read all of it: a huge or
    endless body is one error line, not all of the machine's memory. Streams (logs, archives) are bounded
    by whoever reads them."""
    if stream:
        return response
    declared = response.headers.get("Content-Length", "")
    announced = declared.isdigit() and int(declared) > MAX_ANSWER  # not even started on
    data = b"" if announced else response.raw.read(MAX_ANSWER + 1, decode_content=True)
    if announced or len(data) > MAX_ANSWER:
        response.close()
        raise not_engine(f"sent an answer of more than {MAX_ANSWER >> 20} MiB to {response.request.method} "
                         f"{response.request.path_url[:80]!r}")
    response._content, response._content_consumed = data, True
    response.raw.release_conn()
    return response


def info() -> dict:
    """GET /info, checked to be an object (verify and smoke read Runtimes and versions from it)."""
    with answering("GET /info"):
        found = sdk().info()
    if not isinstance(found, dict) or not isinstance(found.get("Runtimes") or {}, dict):
        raise not_engine("answered GET /info with something that is not the engine's description")
    return found


def image_store(found: dict | None = None) -> str:
    """"containerd" where the engine keeps images in containerd's store (its export compresses layers: minutes for a
    CUDA image; buildx's default driver can export a registry cache), else "classic" (a graph driver)."""
    found = info() if found is None else found
    return "containerd" if "io.containerd.snapshotter" in str(found.get("DriverStatus")) else "classic"


def rewrites_timestamps() -> bool:
    """Does this docker's BuildKit date the image it exports from the build argument SOURCE_DATE_EPOCH (the config's
    created time and history)? buildx against an engine >= 26, whose embedded BuildKit is 0.13 or newer. The
    Dockerfile's steps date the files themselves (its layer_end), so there two builds of the same inputs give the
    same image, to the digest; elsewhere (Docker 20.10) the config carries the build's times."""
    major = re.match(r"([0-9]{1,4})\.", str(info().get("ServerVersion") or ""))
    return client().mode == "buildx" and bool(major) and int(major.group(1)) >= 26


@contextmanager
def holding(ref: str, hold: str) -> Iterator[None]:
    """Keep the image `ref` names now alive under the name `hold` while the block runs. A build moves `ref`; with
    the containerd image store the image it replaced is deleted at once (20.10 keeps it, unnamed), and the size
    budget could not say what grew since it. Afterwards only the name goes: the image too where nothing else
    names it."""
    found = image_or_none(ref)
    if found is not None:
        repository, tag = hold.rsplit(":", 1)
        with answering(f"while naming {ref} {hold}"):
            found.tag(repository, tag)
    try:
        yield
    finally:
        if found is not None:
            try:
                with answering(f"while removing the name {hold}"):
                    sdk().images.remove(hold)
            except Exception as exc:  # noqa: BLE001 - a name left behind is harmless; the build's own error matters
                log.info(f"warning: the name {hold} was left ({_reason(exc)}); `docker rmi {hold}` removes it")


def describe() -> dict:
    """What builds here, for a build report and its provenance: the client and how it builds, the engine's version
    and its image store."""
    found = info()
    c = client()
    return {"binary": c.binary, "mode": c.mode, "engine": str(found.get("ServerVersion") or "unknown"),
            "image_store": image_store(found)}


def run_cli(argv: list[str], mask: tuple[str, ...] = (), timeout: int | None = None, stream: bool = True,
            input: str | None = None) -> process.Result:
    """Run a docker CLI command, echoed first with `mask`'s values hidden; output streams unless `stream` is False."""
    return process.run(argv, timeout=timeout, input=input, env=client().env(), stream=stream, secrets=mask)


def image_or_none(ref: str):
    import docker

    try:
        with answering(f"while looking up {ref}"):
            attrs = sdk().api.inspect_image(ref)  # images.get(ref), with the answer checked before it is used
    except docker.errors.ImageNotFound:
        return None
    if not _is_image(attrs):
        raise not_engine(f"answered the inspection of {ref} with something that is not an image "
                         "(no sha256 Id, or Config, Labels or RepoDigests of the wrong kind)")
    # An imported image may have no Config at all: no labels, which the SDK's model cannot say by itself.
    return sdk().images.prepare_model({**attrs, "Config": attrs.get("Config") or {}})


def built_image(ref: str):
    """The image a build just named `ref`. An engine (or a BuildKit exporter) that reports the build done with
    no image behind the name is not doing what a Docker engine does: one line, exit 3, not ImageNotFound."""
    found = image_or_none(ref)
    if found is None:
        raise not_engine(f"reported the build of {ref} done, but holds no image of that name (removed meanwhile, "
                         "or the build was exported elsewhere)")
    return found


def _is_image(attrs) -> bool:
    """What the callers read of an image inspection has the shape the Engine API documents."""
    if not isinstance(attrs, dict) or not re.fullmatch(r"sha256:[0-9a-f]{64}", str(attrs.get("Id"))):
        return False
    config, digests = attrs.get("Config") or {}, attrs.get("RepoDigests") or []
    labels = config.get("Labels") or {} if isinstance(config, dict) else None
    return isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values()) \
        and isinstance(digests, list) and all(isinstance(d, str) and "@" in d for d in digests)


def run_container(image: str, command: list[str], *, timeout: int, network: str = "none",
                  volumes: dict | None = None, environment: dict | None = None, gpus: bool = False,
                  shm_size: str | None = None, on_line: Callable[[str], None] | None = None) -> tuple[int, str]:
    """Run a container to completion (killed after `timeout` s); return (exit code, combined logs).

    With `on_line`, each line of output goes to it as the container prints it (a long gate is not silent)."""
    import docker
    from requests.exceptions import ConnectionError as RequestsConnectionError
    from requests.exceptions import ReadTimeout

    kwargs = dict(detach=True, network_mode=network, volumes=volumes or {}, environment=environment or {},
                  shm_size=shm_size)
    if gpus:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    shown = [c if len(c) <= 80 else c[:60] + f"…({len(c)} chars)" for c in command]
    log.echo_command(["docker", "run", image, *shown])
    try:
        container = sdk().containers.run(image, command, **kwargs)
    except docker.errors.ImageNotFound:
        raise EnvironmentProblem(f"image {image} is not here and cannot be pulled",
                                 "pull it from a mirror, or provide a local copy") from None
    except docker.errors.APIError as exc:
        raise EnvironmentProblem(f"cannot start a container of {image}: {exc.explanation or exc}") from None
    try:
        follower = _Follower(container, on_line) if on_line else None
        try:
            status = container.wait(timeout=timeout)["StatusCode"]
        except (ReadTimeout, RequestsConnectionError):
            container.kill()
            status = 124
        streamed = follower.finish() if follower else None
        # What the stream collected is the whole output unless it broke off; then ask for it all once more.
        logs = streamed if streamed is not None else container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        return status, logs
    finally:
        container.remove(force=True)


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines from the byte chunks a log stream yields (a chunk may hold part of a line, or several)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line.decode("utf-8", "replace") + "\n"
    if pending:
        yield pending.decode("utf-8", "replace")


class _Follower:
    """Follows a running container's output in a thread (the wait for its exit holds the caller's), hands
    each line to `on_line` and keeps them all for the report."""

    def __init__(self, container, on_line: Callable[[str], None]):
        self.lines: list[str] = []
        self.broken = False
        self._container, self._on_line = container, on_line
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for line in lines_of(self._container.logs(stdout=True, stderr=True, stream=True, follow=True)):
                self.lines.append(line)
                self._on_line(line.rstrip("\n"))
        except Exception:  # the engine dropped the stream: the caller reads the logs whole instead
            self.broken = True

    def finish(self) -> str | None:
        """The collected output once the stream has ended (the container has exited), or None if it broke."""
        self._thread.join(timeout=30)
        return None if self.broken or self._thread.is_alive() else "".join(self.lines)
