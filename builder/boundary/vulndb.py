"""Known vulnerabilities of Python releases, from the package index's JSON API: the `vulnerabilities` list
(OSV ids, aliases, fixed_in; no severity) that pip-audit reads.

Where the index serves the release's own document (/pypi/NAME/VERSION/json) that is the answer. Some indexes
(mirrors) serve only the project's document (/pypi/NAME/json), whose `vulnerabilities` are those of the latest
release: used when the installed version is the latest, otherwise the package is reported as *not audited*,
never as clean. Every request has a timeout and a size bound; unit tests stub `fetch_json`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

from builder.errors import EnvironmentProblem

INDEX = os.environ.get("BUILDER_VULN_INDEX", "https://pypi.org/pypi")
TIMEOUT_S = 30
MAX_BYTES = 64 << 20  # a project document lists every release's files: torch's is tens of MB at most
WORKERS = 8


def fetch_json(url: str) -> dict | None:
    """The JSON document at `url`; None when the index answers 404 (no such project or release)."""
    import requests  # deferred: only audit talks to the index

    verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE") or True
    try:
        with requests.get(url, timeout=TIMEOUT_S, stream=True, verify=verify,
                          headers={"Accept": "application/json"}) as resp:
            if resp.status_code == 404:
                return None
            resp.raise_for_status()
            body = resp.raw.read(MAX_BYTES + 1, decode_content=True)
    except requests.RequestException as exc:
        raise EnvironmentProblem(f"the package index did not answer for {url}: {type(exc).__name__}: "
                                 f"{str(exc)[:200]}", "check the network or proxy; set BUILDER_VULN_INDEX to a "
                                                      "mirror's JSON API") from None
    if len(body) > MAX_BYTES:
        raise EnvironmentProblem(f"{url} answered more than {MAX_BYTES >> 20} MB", "is this a package index?")
    import json

    try:
        return json.loads(body)
    except ValueError:
        raise EnvironmentProblem(f"{url} did not answer JSON", "is this a package index's JSON API?") from None


def release(name: str, version: str) -> dict:
    """{"data": "release"|"project"|"none", "vulnerabilities": [...], "why": str} for one installed release."""
    doc = fetch_json(f"{INDEX}/{quote(name)}/{quote(version)}/json")
    if doc is not None:
        return {"data": "release", "vulnerabilities": doc.get("vulnerabilities") or [], "why": ""}
    doc = fetch_json(f"{INDEX}/{quote(name)}/json")
    if doc is None:
        return {"data": "none", "vulnerabilities": [], "why": "not on the index"}
    latest = (doc.get("info") or {}).get("version")
    if latest == version:
        return {"data": "project", "vulnerabilities": doc.get("vulnerabilities") or [], "why": ""}
    return {"data": "none", "vulnerabilities": [],
            "why": f"the index serves no per-release data, and its vulnerability list is for {latest}"}


def releases(packages: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """release() for each (name, version), a few at a time."""
    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(packages, pool.map(lambda p: release(*p), packages)))
