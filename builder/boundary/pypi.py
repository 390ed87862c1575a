"""PyPI's JSON API (https://docs.pypi.org/api/json/): a project's document and a wheel's PEP 658 core metadata.

Read by `refresh-compat` (release facts) and `propose` (the newest releases); every read goes through
web.get (time and size bounds)."""

from __future__ import annotations

import json
from urllib.parse import urljoin

from builder.boundary import web
from builder.errors import EnvironmentProblem

JSON_URL = "https://pypi.org/pypi/{name}/json"
TIMEOUT_S = 30


def project(name: str) -> dict:
    """The project's JSON document (every release's files); unreachable or not JSON is exit 3."""
    url = JSON_URL.format(name=name)
    try:
        return json.loads(web.get(url, timeout=TIMEOUT_S))
    except (OSError, json.JSONDecodeError) as exc:
        raise EnvironmentProblem(f"cannot read {url}: {exc}",
                                 "check the network/proxy (SSL_CERT_FILE for an intercepting proxy)") from exc


def wheel_metadata(name: str, wheel: dict) -> str:
    """The wheel's core metadata (`<file URL>.metadata`, PEP 658); OSError (web.Failed) when the index has none:
    files uploaded before 2023 often lack it, and the JSON API's `core-metadata` flag is unreliable behind mirrors."""
    url = file_url(name, wheel) + ".metadata"
    return web.get(url, timeout=TIMEOUT_S).decode("utf-8", "replace")


def file_url(name: str, file: dict) -> str:
    """A release file's absolute URL: a mirror of PyPI's JSON API may give it relative to the document."""
    return urljoin(JSON_URL.format(name=name), file["url"])


def fetch_file(name: str, file: dict):
    """A release file (an entry of the project document's `releases`) from the artifact cache, sha256-checked."""
    from builder.boundary import artifacts

    return artifacts.fetch(file_url(name, file), file["digests"]["sha256"], file["filename"])
