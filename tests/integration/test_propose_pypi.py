"""`propose` against the real PyPI, in a clone of this repository (its own matrix.yaml and compat.yaml, so nothing
here is written): PyPI has torch releases newer than the matrix's newest (2.13); the rules decide what is written.

1. With the shipped compat.yaml: exit 0; whatever torch it reads is newer than 2.13, and either the entry is
   appended and validates, or nothing is written and the rule that rejects it is named.
2. With compat.yaml holding the facts that rule asked for -- the torch row as PyPI reports it (the facts line
   propose prints), and, for a CUDA line the data does not know, 13.0's driver/arch/nvcc rows copied under the
   new key as stand-ins (the driver floor is NVIDIA's fact, not PyPI's; a maintainer adds it with its source) --
   the entry for that torch is appended after the last entry, `validate --strict` and `compat TAG` accept it,
   and a second run proposes nothing new and leaves matrix.yaml byte for byte as it was.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from packaging.version import Version

from builder.model import knowledge
from tests.workflow import harness

FACTS = re.compile(r"torch (?P<release>\S+): CUDA (?P<cuda>\d+\.\d+) build on PyPI, cuDNN (?P<cudnn>\d+), "
                   r"Python (?P<python>\S+), (?P<abi>C\+\+11|pre-C\+\+11) ABI")


def builder(clone, *argv: str) -> subprocess.CompletedProcess:
    # cwd first on sys.path: `-m builder` is the clone's package, reading the clone's compat.yaml.
    return subprocess.run([sys.executable, "-m", "builder", *argv], cwd=clone, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def clone(tmp_path):
    return harness.clean_clone(tmp_path / "repo")


def appended_tag(before: str, after: str) -> str:
    assert after.startswith(before.rstrip("\n")), "every line before the new entry is kept"
    tags = re.findall(r"^  - tag: (\S+)", after, re.M)
    assert len(tags) == len(re.findall(r"^  - tag: ", before, re.M)) + 1
    return tags[-1]


def copy_row(text: str, head: str, cuda: str) -> str:
    """The two-line row starting with `head` (a CUDA 13.0 row) again, under `cuda`, marked as a stand-in."""
    lines = text.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(head))
    row = "".join(lines[at:at + 2]).replace('"13.0"', f'"{cuda}"', 1)
    row = re.sub(r'source: "[^"]*"', 'source: "test stand-in: CUDA 13.0\'s row under the new CUDA line"', row)
    return "".join(lines[:at + 2]) + row + "".join(lines[at + 2:])


def give_facts(clone, facts: dict) -> None:
    path = clone / "builder" / "data" / "compat.yaml"
    text = path.read_text()
    minor, cuda = knowledge.minor_of(facts["release"]), facts["cuda"]
    row = {"cuda_builds": [cuda], "pypi_cuda": cuda, "python": facts["python"], "cxx11abi": facts["abi"] == "C++11",
           "cudnn": int(facts["cudnn"])}
    if f'\n  "{minor}": {{' not in text:
        text = knowledge.apply_text(text, [knowledge.Change("torch", minor, "", None, row)],
                                    f"PyPI torch {facts['release']} (propose's facts line, test)")
    if f'\n  "{cuda}": {{min_driver' not in text:
        for head in ('"13.0": {min_driver', '"13.0": {nvcc:', '- {cuda: "13.0", kind: pypi'):
            text = copy_row(text, head, cuda)
    path.write_text(text)


@pytest.mark.network
def test_propose_against_real_pypi(clone):
    matrix_file = clone / "matrix.yaml"
    before = matrix_file.read_text()
    first = builder(clone, "propose")
    assert first.returncode == 0, first.stderr
    facts = FACTS.search(first.stderr)
    if matrix_file.read_text() == before:  # rejected with the shipped rules: the rule is named
        assert facts and re.search(r"^  \[[a-z0-9-]+\] ", first.stderr, re.M), first.stderr
        assert Version(facts["release"]) > Version("2.13.0"), first.stderr
        give_facts(clone, facts.groupdict())
        first = builder(clone, "propose")
        assert first.returncode == 0, first.stderr
    after = matrix_file.read_text()
    tag = appended_tag(before, after)
    entry = re.search(rf"^  - tag: {re.escape(tag)}\n((?:    .*\n)+)", after, re.M).group(1)
    torch = re.search(r"^    torch: (\S+)$", entry, re.M).group(1)
    assert Version(torch) > Version("2.13.0") and "    ci: false" in entry
    assert f"  - tag: {tag}" in first.stdout, first.stdout  # it prints what it proposed
    for argv in (("validate", "--strict"), ("compat", tag)):
        proc = builder(clone, *argv)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    second = builder(clone, "propose")
    assert second.returncode == 0 and "nothing new" in second.stderr, second.stderr
    assert matrix_file.read_text() == after
