"""diff: version ordering (Python and Debian), package and size changes, --fail-on, on real small images."""

from __future__ import annotations

import pytest

from builder.steps import diff

DEB_PAIRS = [
    ("1.0", "1.0", 0), ("1.0", "1.1", -1), ("1.0~rc1", "1.0", -1), ("1.0", "1.0+b1", -1), ("1:0.1", "2.0", 1),
    ("2.36-9+deb12u4", "2.36-9+deb12u10", -1), ("1.0-1", "1.0-1~bpo1", 1), ("1.2.3a", "1.2.3", 1),
    ("10.0", "9.9", 1), ("1.0a", "1.0+", -1), ("1.0+", "1.0.", -1), ("0.0~git20230101", "0.0", -1), ("1.01", "1.1", 0),
    ("2.0-1ubuntu1", "2.0-1", 1), ("5.2.15-2+b7", "5.2.15-2+b2", 1), ("1.0~~", "1.0~", -1),
]


@pytest.mark.parametrize("a,b,expected", DEB_PAIRS)
def test_debian_version_order(a, b, expected):
    got = diff.compare_deb(a, b)
    assert (got > 0) - (got < 0) == expected  # dpkg agrees: tests/integration/test_real_processes.py


def test_python_version_order():
    assert diff.compare_python("2.13.0", "2.13.0") == 0
    assert diff.compare_python("1.0", "1.0.0") == 0
    assert diff.compare_python("4.9", "4.10") == -1
    assert diff.compare_python("2.0rc1", "2.0") == -1


def _m(py=(), os_=(), files=None) -> dict:
    return {"python_packages": [{"name": n, "version": v, "path": f"opt/venv/lib/{pyv}/site-packages/{n}-{v}.dist-info"}
                                for n, v, pyv in py],
            "os_packages": [{"name": n, "version": v, "architecture": "amd64"} for n, v in os_],
            "files": files or {}}


def test_package_changes_and_sizes():
    a = _m(py=[("torch", "2.12.0", "python3.11"), ("Old_Pkg", "1", "python3.11"), ("peft", "0.21", "python3.11")],
           os_=[("bash", "5.2.15-2+b7"), ("gone", "1")],
           files={"usr/bin/x": {"type": "file", "size": 100}, "opt/a": {"type": "file", "size": 5}})
    b = _m(py=[("torch", "2.13.0", "python3.12"), ("peft", "0.20", "python3.12"), ("new", "1", "python3.12")],
           os_=[("bash", "5.2.15-2+b2")],
           files={"usr/bin/x": {"type": "file", "size": 150}, "etc/y": {"type": "file", "size": 1}})
    r = diff.diff(a, b)
    got = {(c["kind"], c["name"]): c["change"] for c in r["packages"]}
    assert got == {("python", "torch"): "upgraded", ("python", "peft"): "downgraded", ("python", "old-pkg"): "removed",
                   ("python", "new"): "added", ("os", "bash"): "downgraded", ("os", "gone"): "removed"}
    assert r["counts"] == {"upgraded": 1, "downgraded": 2, "added": 1, "removed": 2}
    assert {s["dir"]: s["delta"] for s in r["sizes"]} == {"/usr": 50, "/opt": -5, "/etc": 1}


def test_fail_on_words():
    assert diff.parse_fail_on("downgrade,removed") == {"downgraded", "removed"}
    from builder.errors import UserError

    with pytest.raises(UserError, match="unknown kind"):
        diff.parse_fail_on("sideways")


# --- real images ---------------------------------------------------------------------------------------

SITE = "/opt/venv/lib/python3.11/site-packages"


def _dockerfile(packages: dict[str, str]) -> str:
    lines = ["FROM debian:bookworm-slim"]
    for name, version in packages.items():
        d = f"{SITE}/{name}-{version}.dist-info"
        lines.append(f"RUN mkdir -p {d} && printf 'Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n\\n' "
                     f"> {d}/METADATA && echo pip > {d}/INSTALLER && head -c 2000000 /dev/zero > /opt/{name}.bin")
    return "\n".join(lines) + "\n"


