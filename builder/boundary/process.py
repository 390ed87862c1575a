"""Every subprocess of builder/ starts here: one runner that echoes, limits, streams and masks.

Secrets are masked in this one place, with `errors.mask` (the given secret values, then URL credentials): in
the command line echoed before it runs (`+ docker build …`, cibuildwheel's habit), in each line streamed to
the log while it runs, and (the secret values only: it may be data, see `errors.hide`) in the output handed
back. A program that is missing or runs past its time limit is a one-line EnvironmentProblem (exit 3).

Unit tests forbid real processes (tests/unit/conftest.py) and stub `run` or `pipe` here instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from builder import log
from builder.errors import EnvironmentProblem, hide, mask

NOT_RUNNABLE_HINT = "install it or put it on PATH (a setting may name it: BUILDER_DOCKER for docker)"
KILL_WAIT_S = 10  # after a kill: how long the output of a process that left children behind is waited for


class NotRunnable(EnvironmentProblem):
    """The program is not there or may not be executed (exit 3)."""


class TimedOut(EnvironmentProblem):
    """The program ran past its time limit and was killed (exit 3)."""


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str  # with stream=True: stdout and stderr interleaved, as they were printed
    stderr: str
    shown: str  # the command line as echoed, secrets masked


def run(argv: Sequence[str], *, timeout: float | None, input: str | None = None,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None, stream: bool = False,
        secrets: Sequence[str] = (), echo: bool = True) -> Result:
    """Run a command to its end (killed after `timeout` s, TimedOut); `stream` prints each line as it comes."""
    shown, proc = _launch(argv, secrets, echo, env=env, cwd=cwd, text=True, errors="replace",
                          stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT if stream else subprocess.PIPE)
    try:
        out, err = _follow(proc, input, timeout, secrets) if stream else proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise TimedOut(f"`{_brief(shown)}` did not finish within {timeout:g} s and was stopped",
                       "is what it talks to (engine, index, network) answering? re-run when it is") from None
    except BaseException:  # Ctrl-C included: no command outlives the builder
        _stop(proc)
        raise
    return Result(proc.returncode, hide(out, secrets), hide(err or "", secrets), shown)


class Pipe:
    """A running command whose binary stdout is read as a stream by the caller (`docker save`); then finish()."""

    def __init__(self, proc: subprocess.Popen, secrets: Sequence[str]):
        self._proc, self._secrets = proc, secrets
        self.stdout = proc.stdout

    def finish(self) -> tuple[int, str]:
        """(exit code, stderr with the secrets masked), once stdout has been read or closed."""
        err = self._proc.stderr.read().decode("utf-8", "replace")
        self._proc.stderr.close()
        return self._proc.wait(), hide(err, self._secrets)

    def stop(self) -> None:
        _stop(self._proc)


def pipe(argv: Sequence[str], *, env: Mapping[str, str] | None = None, secrets: Sequence[str] = (),
         bufsize: int = -1) -> Pipe:
    """Start a command whose stdout the caller reads as bytes, while it runs."""
    _, proc = _launch(argv, secrets, True, env=env, bufsize=bufsize, stdin=subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return Pipe(proc, secrets)


def _launch(argv: Sequence[str], secrets: Sequence[str], echo: bool, **popen) -> tuple[str, subprocess.Popen]:
    """The one Popen of builder/: echo the masked command line, start it, a missing program is exit 3."""
    argv = [os.fspath(a) for a in argv]
    with _signals_held() as pressed:
        shown = log.echo_command(argv, secrets) if echo else log.command_line(argv, secrets)
        try:
            proc = subprocess.Popen(argv, **popen)
        except OSError as exc:
            raise NotRunnable(f"cannot run {_brief(mask(argv[0], secrets))}: {exc.strerror or exc}", NOT_RUNNABLE_HINT
                              ) from None
    if pressed:
        try:
            handler, sig = pressed[0]
            handler(sig, None)  # the Ctrl-C (or SIGTERM) that came while starting it, now that it can be stopped
        except BaseException:
            _stop(proc)
            raise
    return shown, proc


class _signals_held:
    """Hold Ctrl-C (and SIGTERM) from the echo of a command line until its process exists and is handed back.

    A SIGINT or SIGTERM in that window (a user who presses Ctrl-C on seeing `+ docker build`, a runner cancelling
    the job) would raise inside Popen or before the caller's try: the child would run on unowned, and a
    `docker build` left so finishes and moves the tag. Held, the signal is replayed once the caller can stop
    the child. Only the main thread can set handlers, and an ignored signal stays ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> list:
        self.pressed: list = []
        self.previous: dict = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                handler = signal.getsignal(sig)
                if callable(handler):
                    self.previous[sig] = signal.signal(sig, lambda s, _f, h=handler: self.pressed.append((h, s)))
        return self.pressed

    def __exit__(self, exc_type, *_) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if exc_type is not None and self.pressed:  # nothing was started: the signal wins over the failure
            handler, sig = self.pressed[0]
            handler(sig, None)


def _follow(proc: subprocess.Popen, input: str | None, timeout: float | None,
            secrets: Sequence[str]) -> tuple[str, str]:
    """Print every line as it arrives (masked) while waiting at most `timeout` s; return all of it."""
    lines: list[str] = []
    reader = threading.Thread(target=_pump, args=(proc.stdout, lines, secrets), daemon=True)
    reader.start()
    if input is not None:
        try:
            proc.stdin.write(input)
            proc.stdin.close()
        except BrokenPipeError:  # it exited without reading: its exit code says why
            pass
    proc.wait(timeout=timeout)
    reader.join()
    return "".join(lines), ""


def _pump(stream, lines: list[str], secrets: Sequence[str]) -> None:
    for line in stream:
        lines.append(line)
        log.output(line, secrets)


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # pragma: no cover - the kernel reaps a killed process at once
        pass


def _brief(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
