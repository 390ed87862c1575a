"""Run one step over many entries with one failure policy, one progress shape and one summary table.

Policy, the same for every step: one process per tag at a time (fsutil.tag_lock: a second one for the same
tag stops at once with exit 3) for steps that write; a step that only reads (`lock --check`: the step's
`needs_tag_lock(options)` says no) takes no lock, so it runs beside a build and in a read-only checkout;
a tag that fails does not stop the others; each failure is kept with its error for the CLI to print;
Ctrl-C stops at once (the running tag is `interrupted`, the rest `not run`) —
steps write only whole files (temp file + rename), so nothing is left half-done.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from builder import fsutil, log
from builder.errors import BuilderError, EnvironmentProblem, Terminated, UserError
from builder.model.matrix import Entry
from builder.steps import Done

INTERRUPTED = 130


@dataclass(frozen=True)
class Outcome:
    tag: str
    result: str  # the step's own word (built, passed, …) or failed / interrupted / not run
    seconds: float
    detail: str = ""
    error: BuilderError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.result not in ("interrupted", "not run")


def run(step: str, entries: Sequence[Entry], fn: Callable[[Entry], Done], lock: bool = True) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for index, entry in enumerate(entries):
        started = time.monotonic()
        try:
            held = fsutil.tag_lock(entry.tag, step) if lock else contextlib.nullcontext()
            with log.step(f"{step} {entry.tag}") as note, held:
                done = fn(entry)
                note["result"] = done.result
            outcomes.append(Outcome(entry.tag, done.result, time.monotonic() - started, done.detail))
        except KeyboardInterrupt as exc:
            outcomes.append(Outcome(entry.tag, "terminated" if isinstance(exc, Terminated) else "interrupted",
                                    time.monotonic() - started))
            outcomes += [Outcome(e.tag, "not run", 0.0) for e in entries[index + 1:]]
            break
        except (BuilderError, OSError) as exc:
            if isinstance(exc, OSError):
                if exc.errno not in fsutil.FULL:
                    raise
                exc = fsutil.write_failed(exc.filename, exc)  # a full disk anywhere in a step: exit 3, one line
            first = (exc.message.splitlines() or [""])[0]
            outcomes.append(Outcome(entry.tag, "failed", time.monotonic() - started, first, exc))
    rows = [[o.tag, f"{log.mark(o.ok)} {o.result}", f"{o.seconds:.0f}s", o.detail[:100]] for o in outcomes]
    log.summary(f"{step}: {sum(o.ok for o in outcomes)} of {len(outcomes)} ok", ("tag", "result", "time", "detail"),
                rows)
    return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """0 when all ok; 143 when terminated (SIGTERM); 130 when interrupted; else the most actionable failure
    kind: bad input (2) before a missing machine facility (3) before a failed step (1)."""
    if any(o.result == "terminated" for o in outcomes):
        return Terminated.exit_code
    if any(o.result == "interrupted" for o in outcomes):
        return INTERRUPTED
    errors = [o.error for o in outcomes if o.error is not None]
    if not errors:
        return 0
    for kind in (UserError, EnvironmentProblem):
        if any(isinstance(e, kind) for e in errors):
            return kind.exit_code
    return 1
