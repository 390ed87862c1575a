"""`python -m builder login --registry R --username U --password-stdin`: credentials into the Docker config.

The workflow runs it first in every job that reads or writes a registry, so `plan`'s label reads (private
packages answer 401 to anonymous reads), docker's pushes, BuildKit's cache and cosign all find the same
credentials ($DOCKER_CONFIG/config.json `auths`, the format `docker login` writes). It needs no Docker engine.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import dataclass

from builder import fsutil, log
from builder.boundary import registry
from builder.errors import EnvironmentProblem, UserError
from builder.flags import arg
from builder.model.plan import default_registry


@dataclass(frozen=True)
class Options:
    registry: str | None = arg("--registry", default=None, metavar="HOST[/NAMESPACE]",
                               help="the registry (default: $REGISTRY, else ghcr.io/<repository owner>)")
    username: str | None = arg("--username", default=None, required=True, help="the registry user (GitHub: the actor)")
    password_stdin: bool = arg("--password-stdin", default=False, action="store_true", required=True,
                               help="read the password or token from stdin (never an argument)")


def store(host: str, username: str, password: str) -> str:
    directory = registry.config_dir()
    if directory is None:
        raise EnvironmentProblem("no home directory to keep the Docker config in (HOME is unset and this user "
                                 "has no passwd entry)", "set DOCKER_CONFIG (or HOME) to a writable directory")
    if not os.environ.get("DOCKER_CONFIG") and not directory.parent.is_dir():
        # HOME=/nonexistent is how a service user says "no home": never create one (as root, that would work)
        raise EnvironmentProblem(f"HOME {directory.parent} is not a directory: nowhere to keep {directory}/config.json",
                                 "set DOCKER_CONFIG (or HOME) to a writable directory")
    path = directory / "config.json"
    data = registry.read_config(path, host) or {}
    if not isinstance(data.get("auths", {}), dict):
        raise UserError(f"{path}: auths is not a JSON object", f"fix it, or remove it and log in to {host} again")
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    data.setdefault("auths", {})[host] = {"auth": token}
    # A credential: never readable by others (mkstemp's 0600 from the start, kept by the rename).
    try:
        fsutil.write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode=0o600)
    except OSError as exc:  # HOME unwritable or read-only: one line, and the temp file is gone already
        raise fsutil.write_failed(path, exc) from None
    return str(path)


def main(options: Options, m=None) -> int:
    where = options.registry or default_registry()
    host = registry.repository(where, "x").host
    password = sys.stdin.read().rstrip("\r\n")
    if not password:
        raise UserError("--password-stdin: nothing on stdin", "pipe the token in: printf %s \"$TOKEN\" | …")
    path = store(host, options.username, password)
    log.info(f"credentials for {host} ({options.username}) stored in {path}")
    if os.environ.get("GITHUB_OUTPUT"):  # later steps name the registry as steps.login.outputs.registry
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as out:
            out.write(f"registry={where}\n")
    return 0
