"""repro: the comparison of two manifests (pure), a planted nondeterminism caught with the file named, and
the real check of the CI entry (two from-scratch builds, compared)."""

from __future__ import annotations

import pytest

from builder.steps import repro


def _m(files: dict, layers=("sha256:1",), py=(), os_=()) -> dict:
    return {"files": files, "layers": [{"diff_id": d} for d in layers], "config_digest": "sha256:c",
            "python_packages": [{"name": n, "version": v, "path": "venv/x"} for n, v in py],
            "os_packages": [{"name": n, "version": v} for n, v in os_]}


def _f(sha: str, mtime: int = 1, size: int = 3) -> dict:
    return {"type": "file", "mode": "0644", "uid": 0, "gid": 0, "size": size, "sha256": sha, "mtime": mtime}


def test_identical_contents_with_other_mtimes_are_reproducible():
    a = _m({"etc/a": _f("x", 1), "etc": {"type": "dir", "mode": "0755", "uid": 0, "gid": 0, "mtime": 1}})
    b = _m({"etc/a": _f("x", 2), "etc": {"type": "dir", "mode": "0755", "uid": 0, "gid": 0, "mtime": 9}},
           layers=("sha256:2",))
    r = repro.compare(a, b, allowlist=[])
    assert r["ok"] and r["differences"] == 0 and r["mtime_only"] == 2
    assert r["files_compared"] == 1 and r["bytes_compared"] == 3
    assert r["layers"]["identical"] is False


def test_differences_are_classified_and_allowlisted_or_unexplained():
    a = _m({"x/__pycache__/m.cpython-311.pyc": _f("1"), "etc/ld.so.cache": _f("1"), "opt/stamp": _f("1"),
            "var/log/dpkg.log": _f("1"), "v/p-1.dist-info/RECORD": _f("1")}, py=[("p", "1")])
    b = _m({"x/__pycache__/m.cpython-311.pyc": _f("2"), "etc/ld.so.cache": _f("2"), "opt/stamp": _f("2"),
            "etc/machine-id": _f("2"), "v/p-1.dist-info/RECORD": {**_f("1"), "mode": "0600"}}, py=[("p", "1")])
    allow = [{"pattern": "etc/ld.so.cache", "reason": "test"}]
    r = repro.compare(a, b, allowlist=allow)
    assert r["differences_by_class"] == {"apt-dpkg-logs-caches": 1, "content": 1, "ld.so.cache": 1,
                                         "machine-id": 1, "pip-metadata": 1, "pyc": 1}
    assert [d["path"] for d in r["allowlisted"]] == ["etc/ld.so.cache"]
    assert {d["path"]: d["change"] for d in r["unexplained"]} == {
        "opt/stamp": "changed", "var/log/dpkg.log": "removed", "etc/machine-id": "added",
        "x/__pycache__/m.cpython-311.pyc": "changed", "v/p-1.dist-info/RECORD": "changed"}
    assert next(d for d in r["unexplained"] if d["path"] == "v/p-1.dist-info/RECORD")["fields"] == ["mode"]
    assert not r["ok"]


def test_package_differences_fail():
    r = repro.compare(_m({}, py=[("p", "1")], os_=[("bash", "5")]), _m({}, py=[("p", "2")], os_=[("bash", "5")]),
                      allowlist=[])
    assert not r["ok"] and r["packages"]["python_packages"] == [{"name": "p@venv/x", "a": "1", "b": "2"}]


def test_shipped_allowlist_items_all_give_a_reason():
    for item in repro.load_allowlist():
        assert item["pattern"] and len(item["reason"]) > 20
    from builder.errors import UserError

    with pytest.raises(UserError, match="reason"):
        repro.load_allowlist("allow:\n  - pattern: x\n")


# --- real builds ---------------------------------------------------------------------------------------

PLANTED = """\
FROM debian:bookworm-slim
RUN echo stable > /stable && date +%s%N > /built-at
"""




