"""Hostile matrices and --matrix paths: each refused with exit 2, file:line and field named, no traceback,
no secret echoed, nothing written. A few legitimate-but-unusual inputs must still be accepted."""

from __future__ import annotations

import os
import time

import pytest

from builder.model import yamlread
from tests.conftest import VALID_MATRIX, run_cli
from tests.unit.hostile import SECRET, assert_refused

DIGEST = "8bbc6e304b193e84327fa30d93eea70ec0213b808239a46602a919a479a73b12"
BASE_LINE = f"    base: nvidia/cuda:12.1.1-runtime-ubuntu22.04@sha256:{DIGEST}"


def sub(old: str, new: str) -> str:
    assert old in VALID_MATRIX, old
    return VALID_MATRIX.replace(old, new, 1)


def base(value: str) -> str:
    return sub(BASE_LINE, f"    base: {value}")


# (id, matrix text, needles the error must contain)
FIELD_CASES = [
    # `$` matched before a final newline: every pattern-checked field with a trailing "\n"
    ("tag-newline", sub("  - tag: cu121-torch2.3", '  - tag: "cu121-torch2.3\\n"'), ["field 'tag'", ":5:"]),
    ("index-newline", sub("  index_url: https://pypi.org/simple", '  index_url: "https://pypi.org/simple\\n"'),
     ["field 'index_url'", ":3:"]),
    ("base-newline", base(f'"debian:bookworm-slim@sha256:{DIGEST}\\n"'), ["field 'base'"]),
    ("image-newline", sub("  image: example.org/team/train", '  image: "example.org/team/train\\n"'),
     ["field 'image'"]),
    ("source-newline", sub('    base_source: "test fixture"', '    base_source: "test fixture\\n"'),
     ["field 'base_source'"]),
    ("runner-newline", sub("    runner: [ubuntu-latest]", '    runner: ["ubuntu-latest\\n"]'), ["field 'runner'"]),
    ("python-newline", sub('    python: "3.10"', '    python: "3.10\\n"'), ["field 'python'"]),
    ("torch-newline", sub("    torch: 2.3.1", '    torch: "2.3.1\\n"'), ["field 'torch'"]),
    ("source-nel", sub('    base_source: "test fixture"', '    base_source: "a\\u2028RUN id"'),
     ["field 'base_source'"]),
    # local versions and epochs make invalid Docker tags at publish
    ("torch-local", sub("    torch: 2.3.1", "    torch: 2.3.1+cu121"), ["field 'torch'", "local version"]),
    ("peft-local", sub("    peft: 0.12.0", "    peft: 0.12.0+local"), ["field 'peft'", "local version"]),
    ("flash-local", sub("    flash-attn: 2.6.3", "    flash-attn: 2.6.3+cu12torch2.3"),
     ["field 'flash-attn'", "local version"]),
    ("torch-epoch", sub("    torch: 2.3.1", "    torch: 1!2.3.1"), ["field 'torch'", "epoch"]),
    ("accelerate-epoch", sub("    accelerate: 0.34.2", "    accelerate: 2!0.34.2"), ["field 'accelerate'", "epoch"]),
    ("deepspeed-range", sub("    deepspeed: 0.15.1", "    deepspeed: '>=0.15'"), ["field 'deepspeed'"]),
    # base references Docker rejects
    ("base-uppercase", base("nvidia/CUDA:12.1.1"), ["field 'base'", "lowercase"]),
    ("base-long-tag", base("debian:" + "a" * 129), ["field 'base'"]),
    ("base-short-digest", base("debian@sha256:abc123"), ["field 'base'"]),
    ("base-digest-length", base("debian@sha256:" + "a" * 63), ["field 'base'", "64"]),
    ("base-digest-upper", base("debian@sha256:" + "A" * 64), ["field 'base'", "lowercase"]),
    ("base-digest-algo", base("debian@md5:" + "a" * 32), ["field 'base'", "unsupported digest"]),
    ("base-long-name", base("a" * 256), ["field 'base'", "255"]),
    ("base-empty-tag", base("'debian:'"), ["field 'base'"]),
    ("base-leading-dash", base("-debian"), ["field 'base'"]),
    ("base-double-slash", base("library//debian"), ["field 'base'"]),
    ("base-dotdot", base("library/../debian"), ["field 'base'"]),
    ("base-digest-only", base(f"'@sha256:{DIGEST}'"), ["field 'base'"]),
    ("base-space", base("'debian bookworm'"), ["field 'base'"]),
    ("base-image-id", base("a" * 64), ["field 'base'", "image ID"]),
    ("base-unicode-tag", base("debian:bookwörm"), ["field 'base'"]),
    ("base-separator", base("debian__-x"), ["field 'base'"]),
    ("image-with-tag", sub("  image: example.org/team/train", "  image: example.org/team/train:latest"),
     ["field 'image'"]),
    ("image-uppercase", sub("  image: example.org/team/train", "  image: example.org/Team/train"),
     ["field 'image'"]),
    # credentials: refused and never shown
    ("index-userinfo", sub("  index_url: https://pypi.org/simple", f"  index_url: https://bob:{SECRET}@pypi.org/simple"),
     ["field 'index_url'", "credentials"]),
    ("index-token", sub("  index_url: https://pypi.org/simple", f"  index_url: https://{SECRET}@pypi.org/simple"),
     ["field 'index_url'", "credentials"]),
    ("index-query-token", sub("  index_url: https://pypi.org/simple",
                              f"  index_url: https://pypi.org/simple?token={SECRET}"), ["field 'index_url'"]),
    ("entry-index-userinfo", sub("    python: \"3.11\"", f"    python: \"3.11\"\n    index_url: http://u:{SECRET}@h.org/s"),
     ["entry 'cu130-torch2.13-bookworm'", "field 'index_url'", "credentials"]),
    ("index-ftp", sub("  index_url: https://pypi.org/simple", "  index_url: ftp://pypi.org/simple"),
     ["field 'index_url'"]),
    # structure
    ("no-defaults", sub("defaults:\n  image: example.org/team/train\n  index_url: https://pypi.org/simple\n", ""),
     ["defaults", "missing"]),
    ("defaults-list", sub("defaults:\n  image: example.org/team/train\n  index_url: https://pypi.org/simple\n",
                          "defaults: [a, b]\n"), ["defaults", "expected a mapping"]),
    ("defaults-null", sub("defaults:\n  image: example.org/team/train\n  index_url: https://pypi.org/simple\n",
                          "defaults:\n"), ["defaults", "expected a mapping"]),
    ("entries-mapping", "defaults: {image: a/b}\nentries: {a: 1}\n", ["entries", "non-empty list"]),
    ("entry-string", "defaults: {image: a/b}\nentries: [just-a-string]\n", ["entries[0]", "expected a mapping"]),
    ("unknown-key-newline", sub("    peft: 0.12.0", '    "pe\\nft": 0.12.0'), ["unknown key", "field 'pe\\nft'"]),
    ("non-string-key", sub("    peft: 0.12.0", "    [1, 2]: x"), ["keys must be strings"]),
    ("duplicate-key", sub("    peft: 0.12.0", "    peft: 0.12.0\n    peft: 0.12.0"), ["appears twice"]),
    ("merge-duplicate", sub("  - tag: cu121-torch2.3", "  - tag: cu121-torch2.3\n    tag: x"), ["appears twice"]),
    ("python-object", sub("    peft: 0.12.0", "    peft: !!python/object/apply:os.system [id]"),
     ["not valid YAML"]),
    ("undefined-alias", sub("    peft: 0.12.0", "    peft: *nowhere"), ["not valid YAML"]),
    ("huge-int", sub("    peft: 0.12.0", "    peft: " + "9" * 5000), ["line 13", "5000 characters"]),
    ("tab-indent", sub("    peft: 0.12.0", "\tpeft: 0.12.0"), ["not valid YAML"]),
    ("nul-byte", sub('    base_source: "test fixture"', '    base_source: "a\x00b"'), ["not valid YAML"]),
    ("deep-flow", "defaults: " + "[" * 5000 + "]" * 5000 + "\n", ["nested more than"]),
    ("deep-block", "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n", ["nested more than"]),
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(6)),
     ["YAML nodes"]),
]


@pytest.mark.parametrize("text, needles", [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_hostile_matrix_is_refused(project, capsys, text, needles):
    (project / "matrix.yaml").write_text(text)
    err = assert_refused(project, capsys, ["render"], 2, "matrix.yaml", *needles)
    assert len(err) < 2000, "one short message, not a dump of the input"


def test_strict_refuses_plain_http_index(project, capsys):
    (project / "matrix.yaml").write_text(sub("https://pypi.org/simple", "http://pypi.org/simple"))
    assert run_cli("validate") == 0
    capsys.readouterr()
    assert_refused(project, capsys, ["validate", "--strict"], 2, "matrix.yaml:3:", "field 'index_url'", "plain http")


@pytest.mark.parametrize("data, needles", [
    (VALID_MATRIX.encode().replace(b"test fixture", b"test \xff fixture", 1), [":7:", "byte ", "0xff", "not UTF-8"]),
    (VALID_MATRIX.encode().replace(b"peft: 0.12.0", b"peft: 0.12.0 # \xc3\x28", 1), ["not UTF-8"]),
    (b"\xfe\xff\x00d\x00e", ["not UTF-8"]),
], ids=["latin1-byte", "truncated-sequence", "utf16-bom"])
def test_non_utf8_is_refused_with_offset(project, capsys, data, needles):
    (project / "matrix.yaml").write_bytes(data)
    assert_refused(project, capsys, ["render"], 2, "matrix.yaml", *needles)


def _fifo(project):
    os.mkfifo(project / "fifo.yaml")
    return "fifo.yaml"


def _loop(project):
    os.symlink("loop-b.yaml", project / "loop-a.yaml")
    os.symlink("loop-a.yaml", project / "loop-b.yaml")
    return "loop-a.yaml"


def _under_file(project):
    return "matrix.yaml/inner.yaml"


@pytest.mark.parametrize("make, needles", [
    (lambda p: str(p), ["is a directory"]),
    (lambda p: "/dev/zero", ["/dev/zero", "is a device"]),
    (lambda p: "/dev/null", ["/dev/null", "is a device"]),
    (_fifo, ["fifo.yaml", "is a FIFO"]),
    (_loop, ["loop-a.yaml", "cannot read"]),
    (_under_file, ["inner.yaml", "cannot read"]),
    (lambda p: "missing/matrix.yaml", ["missing/matrix.yaml", "cannot read"]),
], ids=["directory", "dev-zero", "dev-null", "fifo", "symlink-loop", "path-under-file", "missing"])
def test_matrix_path_that_is_not_a_file(project, capsys, make, needles):
    started = time.monotonic()
    assert_refused(project, capsys, ["--matrix", make(project), "render"], 2, *needles)
    assert time.monotonic() - started < 5, "never a blocking or unbounded read"


def test_one_megabyte_of_yaml_is_refused_fast(project, capsys):
    lines = ["defaults:\n  image: a/b\nentries:\n"]
    n, size = 0, len(lines[0])
    while size < 1_000_000:  # a running total: summing the list each time made the test itself take 15 s
        lines.append(f"  - {{tag: t{n}, python: '3.10', cuda: '12.1'}}\n")
        size += len(lines[-1])
        n += 1
    (project / "matrix.yaml").write_text("".join(lines))
    started = time.monotonic()
    assert_refused(project, capsys, ["render"], 2, "matrix.yaml", "YAML nodes")
    # Counting after a full parse took 8.3 s here; the limit now applies while parsing (docs/architecture.md).
    assert time.monotonic() - started < 2


def test_file_growing_past_the_limit_is_refused(project, capsys, monkeypatch):
    monkeypatch.setattr(yamlread, "MAX_BYTES", 100)
    assert_refused(project, capsys, ["render"], 2, "matrix.yaml", "too large")


# --- legitimate inputs that must keep working -----------------------------------------------------------


def test_merge_key_with_override_is_accepted(project, capsys):
    text = sub("  - tag: cu121-torch2.3", "  - &first\n    tag: cu121-torch2.3")
    text += ("  - <<: *first\n    tag: cu121-torch2.3-b\n    default: false\n    transformers: 4.44.0\n")
    (project / "matrix.yaml").write_text(text)
    assert run_cli("render") == 0, capsys.readouterr().err
    facts = (project / "dockerfiles/cu121-torch2.3-b/image.json").read_text()
    assert '"transformers": "4.44.0"' in facts and '"torch": "2.3.1"' in facts


def test_utf8_bom_is_accepted(project, capsys):
    (project / "matrix.yaml").write_bytes(b"\xef\xbb\xbf" + VALID_MATRIX.encode())
    assert run_cli("validate") == 0, capsys.readouterr().err


def test_registry_with_port_and_digest_base_is_accepted(project, capsys):
    (project / "matrix.yaml").write_text(VALID_MATRIX.replace("base: debian:bookworm-slim@",
                                                              "base: localhost:5000/mirror/debian:bookworm-slim@"))
    assert run_cli("validate", "--strict") == 0, capsys.readouterr().err
