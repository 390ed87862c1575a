"""`python -m builder` with two network/in-image parts stubbed, for the fault tests (tests/integration/
test_faults_engine.py) that build a tiny stand-in Dockerfile in seconds instead of the real image.

Stubbed, and only these: the preflight (it probes PyPI, the apt archive and the base's registry over the
network; the build itself still fetches nothing) and the post-build verification that every pin is installed
(the stand-in image has no Python, no torch). Everything the faults hit runs for real: the CLI, the runner
and its tag lock, staging and hashing the context, `docker build` through the docker CLI with BuildKit,
reading its output, explaining the failure, writing (or not) the report, exit codes.
"""

from __future__ import annotations

import sys

from builder import cli
from builder.boundary import inspect
from builder.steps import preflight


def _preflight(entry, *_args, **_kwargs) -> dict:  # any signature: build passes entry, inputs, context
    return {"tag": entry.tag, "checked": []}


def main() -> int:
    preflight.preflight = _preflight
    inspect.installed = lambda ref: {"versions": {}, "torch_cuda": None}
    inspect.problems = lambda facts, found: []
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
