"""The one process runner with real children (its unit tests script Popen): lines stream as they come, masked;
a hung child is killed at its time limit; stdin, exit codes and a binary pipe work end to end."""

from __future__ import annotations

import sys
import time

import pytest

from builder.boundary import process

TOKEN = "s3cr3t-T0ken"


def test_lines_stream_masked_while_the_child_runs(capsys):
    code = (f"import sys, time\nprint('index https://u:{TOKEN}@idx.example/simple', flush=True)\n"
            f"print('to stderr {TOKEN}', file=sys.stderr, flush=True)\nsys.exit(4)\n")
    result = process.run([sys.executable, "-c", code], timeout=60, stream=True, secrets=[TOKEN])
    log = capsys.readouterr().err
    assert result.returncode == 4
    assert TOKEN not in log + result.stdout
    assert "  index https://****@idx.example/simple" in log and "  to stderr ****" in log


def test_a_hung_child_is_killed_at_its_time_limit():
    started = time.monotonic()
    with pytest.raises(process.TimedOut, match="did not finish within 1 s"):
        process.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1, stream=True)
    assert time.monotonic() - started < 15


def test_stdin_and_captured_output_round_trip():
    result = process.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper(), end='')"],
                         timeout=60, input="torch==2.13.0\n", echo=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "TORCH==2.13.0\n", "")


def test_a_missing_program_is_exit_3():
    with pytest.raises(process.NotRunnable) as caught:
        process.run(["/nonexistent/docker", "version"], timeout=5)
    assert caught.value.exit_code == 3 and "No such file or directory" in caught.value.message


def test_a_binary_pipe_reads_while_the_child_writes():
    code = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 4096); sys.stderr.write('done\\n'); sys.exit(2)"
    pipe = process.pipe([sys.executable, "-c", code], bufsize=1 << 16)
    assert pipe.stdout.read() == bytes(range(256)) * 4096
    pipe.stdout.close()
    assert pipe.finish() == (2, "done\n")
