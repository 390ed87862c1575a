"""Text from outside (an image's files, an engine's or registry's words) reaches the terminal with its control
characters spelled out (`\\x1b`), never obeyed: builder/log.py is the one way to stdout and stderr, and the
CLI prints its errors through it."""

from __future__ import annotations

import re

from builder import log
from builder.errors import StepFailed
from tests.conftest import run_cli
from tests.unit.test_hostile_flags import _save

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m\rrogue"
METADATA = "venv/lib/python3.11/site-packages/rogue-1.0.dist-info/METADATA"


def _bare(text: str) -> str:
    return text.replace("\n", "").replace("\t", "")


def test_a_package_name_from_an_image_is_shown_not_obeyed_by_diff(tmp_path, monkeypatch, capsys):
    """A real path: two `docker save` archives, one with a package whose name is escape sequences; `diff`
    prints it in its table (stdout)."""
    monkeypatch.chdir(tmp_path)
    metadata = f"Metadata-Version: 2.1\nName: {EVIL}\nVersion: 1.0\n".encode()
    (tmp_path / "a.tar").write_bytes(_save())
    (tmp_path / "b.tar").write_bytes(_save(layer_members={"etc/hostname": b"box\n", METADATA: metadata}))
    code = run_cli("diff", "a.tar", "b.tar")
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert "| \\x1b]0;pwned\\x07\\x1b[2j\\x9b31m" in out, out  # the name as the manifest reads it (lower case)
    assert not CONTROL.search(_bare(out + err)), repr(out + err)


def test_error_and_progress_lines_are_cleaned(capsys):
    from builder import cli

    cli._print_error(StepFailed(f"the registry said {EVIL}", f"hint {EVIL}"))
    log.info(f"progress {EVIL}")
    log.out(f"verdict {EVIL}\tcolumn\nnext line")
    out, err = capsys.readouterr()
    assert not CONTROL.search(_bare(out + err)), repr(out + err)
    assert err.splitlines()[0] == "error: the registry said \\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x0drogue"
    assert out == "verdict \\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x0drogue\tcolumn\nnext line\n"  # tab, newline kept
