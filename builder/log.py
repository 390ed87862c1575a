"""Progress for long steps: `step` prints a heading, then ✓/✕ with the elapsed time; a summary table."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from builder import errors

_OK, _FAIL = "✓", "✕"
# C0 controls but newline and tab, DEL, C1 controls: what moves a terminal's cursor, retitles its window or
# starts an escape sequence. Registries, engines, images and gates put text in our output; none of it may.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """`text` with each control character shown as `\\xNN` instead of sent to the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def info(message: str) -> None:
    """A line for the user on stderr (progress, warnings, errors): the one way to stderr, cleaned."""
    print(clean(message), file=sys.stderr, flush=True)


def out(message: str = "", end: str = "\n") -> None:
    """A result on stdout (a verdict, a table), cleaned like info()."""
    print(clean(message), end=end, flush=True)


def output(line: str, secrets: Sequence[str] = ()) -> None:
    """One line of a command's or container's output as it arrives: indented under its command, masked."""
    info("  " + errors.mask(line.rstrip(), secrets))


def command_line(argv: Sequence[str], secrets: Sequence[str] = ()) -> str:
    """A command as a shell would read it, with the secret values and any URL credentials masked."""
    return errors.mask(shlex.join(str(a) for a in argv), secrets)


def echo_command(argv: Sequence[str], secrets: Sequence[str] = ()) -> str:
    """Print a command before it runs (cibuildwheel habit), masked; return the line as printed."""
    text = command_line(argv, secrets)
    info(f"+ {text}")
    return text


@contextmanager
def step(title: str) -> Iterator[dict]:
    """Heading, then ✓/✕ plus elapsed seconds. The yielded dict collects a one-line result note."""
    start = time.monotonic()
    note: dict = {}
    in_gha = os.environ.get("GITHUB_ACTIONS") == "true"
    if in_gha:
        info(f"::group::{title}")
    info(f"▶ {title}")
    try:
        yield note
    except BaseException:
        if in_gha:
            info("::endgroup::")
        info(f"{_FAIL} {title} ({time.monotonic() - start:.1f}s)")
        raise
    if in_gha:
        info("::endgroup::")
    extra = f" — {note['result']}" if note.get("result") else ""
    info(f"{_OK} {title} ({time.monotonic() - start:.1f}s){extra}")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (also valid Markdown)."""
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    lines = [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def summary(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print the end-of-run table; in GitHub Actions also append it to the job summary."""
    text = table(headers, rows)
    info(f"\n{title}\n{text}")
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"### {title}\n\n{text}\n\n")


def mark(ok: bool) -> str:
    return _OK if ok else _FAIL
