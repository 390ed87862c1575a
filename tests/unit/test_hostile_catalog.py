"""Hostile step reports for `catalog`: wrong types and shapes are refused naming the report file and
field (exit 2, nothing written); free text from a report can never become Markdown structure."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

from tests.conftest import run_cli
from tests.unit.hostile import assert_refused
from tests.unit.test_catalog import TAG, write_reports, write_repro

REPORTS = "build/reports"


def report_path(project, step: str):
    return project / REPORTS / f"{TAG}.{step}.json"


def raw_report(project, step: str, data: dict) -> None:
    """A report file as a person or another tool might leave it, bypassing the schema-checked writer."""
    path = report_path(project, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def mutate(project, step: str, **changes) -> None:
    path = report_path(project, step)
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split("__")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[last] = value
    path.write_text(json.dumps(data))


TYPE_CASES = [
    ("build", {"image_id": 123}, "image_id"),
    ("build", {"image_id": "not-an-id"}, "image_id"),
    ("build", {"image_id": "sha256:" + "1" * 64 + "\n"}, "image_id"),  # JSON Schema's `$` ends the text
    ("build", {"size_bytes": "5 GB"}, "size_bytes"),
    ("build", {"size_bytes": True}, "size_bytes"),
    ("build", {"versions": ["torch"]}, "versions"),
    ("build", {"versions": {"torch": 2.13}}, "versions.torch"),
    ("build", {"result": ["built"]}, "result"),
    ("smoke", {"passed": "yes"}, "passed"),
    ("smoke", {"checks": {"train": {}}}, "checks"),
    ("smoke", {"checks": [1]}, "checks[0]"),
    ("smoke", {"checks__1__figures": [0.4]}, "checks[1].figures"),
    ("smoke", {"checks__1__figures__steps_per_s": "fast"}, "checks[1].figures.steps_per_s"),
    ("smoke", {"checks__2__figures__ranks": 2.5}, "checks[2].figures.ranks"),
    ("smoke", {"checks__2__figures__largest": 7}, "checks[2].figures.largest"),
    ("smoke", {"checks__2__figures__largest__busbw_gbps": "1.2"}, "checks[2].figures.largest.busbw_gbps"),
    ("smoke", {"checks__1__name": {"x": 1}}, "checks[1].name"),
    ("smoke", {"mode": 1}, "mode"),
    ("smoke", {"mode": "# Owned\n<script>alert(1)</script>"}, "mode"),
    ("smoke", {"finished_at": "<script>alert(1)</script>"}, "finished_at"),
    ("smoke", {"image_id": ["sha256:1"]}, "image_id"),
    ("publish", {"digest": "sha256:zzz"}, "digest"),
    ("publish", {"full_tag": "a b"}, "full_tag"),
    ("publish", {"full_tag": "cu121\n# pwned"}, "full_tag"),
    ("publish", {"repository": "Evil/Repo"}, "repository"),
    ("publish", {"pull": "`rm -rf /`"}, "pull"),
    ("publish", {"published_at": 7}, "published_at"),
    ("publish", {"size_bytes": "1"}, "size_bytes"),
    ("publish", {"tag": "another-tag"}, "tag"),
    ("repro", {"differences": "many"}, "differences"),
    ("repro", {"identical": "yes"}, "identical"),
    ("repro", {"finished_at": 3}, "finished_at"),
    ("repro", {"finished_at": "2026-12-03T01:00:00Z\n## Fake"}, "finished_at"),
    ("repro", {"result": ["differs"]}, "result"),
    ("repro", {"result": "</td><img src=x onerror=alert(1)>"}, "result"),
]


@pytest.mark.parametrize("step, changes, field", TYPE_CASES,
                         ids=[f"{c[0]}-{next(iter(c[1]))}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_wrong_report_types_are_refused(project, capsys, step, changes, field):
    write_reports()
    write_repro()
    mutate(project, step, **changes)
    assert_refused(project, capsys, ["catalog"], 2, f"{TAG}.{step}.json", f"field '{field}'")
    assert not (project / "IMAGES.md").exists()


def test_report_missing_a_field_the_catalog_reads_is_refused(project, capsys):
    write_reports()
    publish = json.loads(report_path(project, "publish").read_text())
    del publish["digest"]
    raw_report(project, "publish", publish)
    assert_refused(project, capsys, ["catalog"], 2, f"{TAG}.publish.json", "field 'digest' is missing",
                   "re-run `python -m builder publish")


@pytest.mark.parametrize("raw, needle", [
    (b"[1, 2]", "expected a JSON object"),
    (b'"text"', "expected a JSON object"),
    (b"null", "expected a JSON object"),
    (b'{"passed": tru', "not valid JSON"),
    (b'{"mode": "\xff"}', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"", "not valid JSON"),
], ids=["list", "string", "null", "truncated", "non-utf8", "deep", "empty"])
def test_malformed_report_files(project, capsys, raw, needle):
    write_reports()
    report_path(project, "smoke").write_bytes(raw)
    assert_refused(project, capsys, ["catalog"], 2, f"{TAG}.smoke.json", needle)


def test_report_that_is_a_directory(project, capsys):
    write_reports()
    report_path(project, "smoke").unlink()
    report_path(project, "smoke").mkdir()
    assert_refused(project, capsys, ["catalog"], 2, f"{TAG}.smoke.json", "is a directory")


def test_report_that_is_a_fifo(project, capsys):
    write_reports()
    report_path(project, "smoke").unlink()
    os.mkfifo(report_path(project, "smoke"))
    assert_refused(project, capsys, ["catalog"], 2, f"{TAG}.smoke.json", "is a FIFO")


def test_missing_reports_directory_is_an_error(project, capsys):
    assert_refused(project, capsys, ["catalog"], 2, "build/reports", "does not exist")
    assert_refused(project, capsys, ["catalog", "--reports", "nowhere"], 2, "nowhere", "does not exist")


def test_reports_path_that_is_a_file(project, capsys):
    (project / "afile").write_text("")
    assert_refused(project, capsys, ["catalog", "--reports", "afile"], 2, "afile", "not a directory")


def test_unwritable_output_is_one_line_exit_3(project, capsys):
    write_reports()
    (project / "blocker").write_text("")
    err = assert_refused(project, capsys, ["catalog", "--out", "blocker/sub"], 3, "blocker/sub", "cannot write")
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


# --- Markdown injection: rendered, but inert ---------------------------------------------------------

# Free-text fields only: a field with a fixed form (mode, result, dates, references) is refused by the
# report's schema when it holds anything else (TYPE_CASES above).
INJECTIONS = {
    "level": {"kind": "gpu", "gpu_model": "# Owned\n<script>alert(1)</script>", "gpu_count": 1},
    "checks__2__figures__backend": "[click](https://evil.example/x) | www.evil.example | a@b.example",
    "checks__0__name": "`code` ![img](x.png)",
}


def _table_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_report_text_cannot_become_markdown(project, capsys):
    write_reports()
    mutate(project, "smoke", **INJECTIONS)
    # Hand-edited files that still keep to the schemas: the catalog must stay inert.
    mutate(project, "publish", exceptions=["</td><img src=x onerror=alert(1)>\n## Fake"])
    mutate(project, "build", versions={"torch": "2.13.0 | injected | cell", "peft": "<b>bold</b>"})
    assert run_cli("catalog") == 0, capsys.readouterr().err
    md = (project / "IMAGES.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert headings == ["# Images", f"## `{TAG}`"], headings
    for raw in ("<script", "<img", "<b>", "](", "https://evil", "www.evil", "a@b", "`code`", "![", "\n## Fake"):
        assert not re.search(r"(?<!\\)" + re.escape(raw), md), f"{raw!r} reached IMAGES.md unescaped"
    assert "\\<script\\>" in md and "\\[click\\]" in md  # the text is still there, shown literally
    for block in md.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if rows:
            assert len({_table_pipes(r) for r in rows}) == 1, f"a cell broke its table:\n{block}"


@pytest.mark.parametrize("raw, needle", [
    (b"[]", "expected a JSON object"),
    (b"{", "not valid JSON"),
    (b'{"a": "\xff"}', "not UTF-8"),
    (b"[" * 100_000, "nested too deeply"),
], ids=["list", "truncated", "non-utf8", "deep-unclosed"])
def test_shared_report_reader_refuses_malformed_reports(project, raw, needle):
    """reports.read feeds publish's gate and others: the same checks as the catalog's reader."""
    from builder import reports
    from builder.errors import UserError
    from builder.model import paths

    path = paths.report(TAG, "smoke")
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    with pytest.raises(UserError) as info:
        reports.read(TAG, "smoke")
    assert str(path) in info.value.message and needle in info.value.message


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EIO], ids=["enospc", "erofs", "eio"])
def test_catalog_disk_errors_are_one_line_exit_3(project, capsys, monkeypatch, err):
    from builder import fsutil

    write_reports()

    def failing(path, text):
        raise OSError(err, os.strerror(err), str(path))

    monkeypatch.setattr(fsutil, "write_atomic", failing)
    message = assert_refused(project, capsys, ["catalog"], 3, "IMAGES.md", "cannot write", os.strerror(err))
    assert len([line for line in message.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions; the monkeypatched EROFS case covers it")
def test_catalog_into_a_read_only_directory(project, capsys):
    write_reports()
    out = project / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert_refused(project, capsys, ["catalog", "--out", "ro"], 3, "cannot write")
    finally:
        out.chmod(0o755)
