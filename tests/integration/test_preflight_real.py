"""preflight with the real probe, from this machine: every tag either passes or names what it cannot reach
(exit 3) with the mirror flag. Here (no registry, no GitHub) the CI entries pass, with their local bases."""

from __future__ import annotations

import subprocess

import pytest

from builder.errors import EnvironmentProblem
from builder.model import context, matrix
from builder.model.inputs import Inputs
from builder.steps import preflight
from tests.conftest import ROOT
from tests.integration.images import DOCKER


def image_exists(ref: str) -> bool:
    return subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True).returncode == 0


@pytest.mark.network
@pytest.mark.docker
def test_every_tag_passes_or_names_each_unreachable_source(require_docker):
    """Every CI entry passes (`make docker` provided its base); any other entry passes too where its base happens
    to be local here (a developer who built it), and otherwise names each source it cannot reach."""
    for entry in matrix.load(ROOT / "matrix.yaml").entries:
        inputs = Inputs(local_base=True)
        staged = context.stage(entry, inputs, root=ROOT / "build" / "context" / "preflight")
        try:
            report = preflight.preflight(entry, inputs, staged, image_exists=image_exists)
        except EnvironmentProblem as exc:
            assert not entry.ci, exc.message
            for line in exc.message.splitlines():
                assert line.startswith(f"{entry.tag}: cannot reach the ") and "provide a mirror with --" in line
            continue
        assert all(c["ok"] for c in report["checked"]), (entry.tag, report["checked"])
