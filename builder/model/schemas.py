"""The JSON Schemas of what steps hand each other, and one way of saying how a document breaks them.

builder/schemas/<name>.schema.json: the step reports and the facts file; smoke/schemas/: what the in-image
gate writes. Every problem is one line naming the field as a reader writes it (`checks[1].figures.ranks`),
what it must be and what it is, so a hand-edited report is fixed without reading the schema.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path

import jsonschema

from builder.model import reference

# Formats the schemas name for values Docker must accept: checked with the same grammar as the rest of builder.
_FORMAT_CHECKS = {"repository": reference.name_problem, "image-reference": reference.problem}
_FORMAT_WORDS = {"repository": "a repository name", "image-reference": "an image reference"}


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, why in _FORMAT_CHECKS.items():
        checker.checks(name)(lambda value, why=why: not isinstance(value, str) or why(value) is None)
    return checker


FORMATS = _format_checker()

_TYPE_WORDS = {"string": "text", "integer": "an integer", "number": "a number", "boolean": "true or false",
               "object": "an object", "array": "a list", "null": "null"}


@cache
def schema(name: str) -> dict:
    """builder/schemas/<name>.schema.json: the reports builder writes, and the facts file render writes."""
    text = resources.files("builder").joinpath(f"schemas/{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@cache
def smoke_schema(name: str) -> dict:
    """smoke/schemas/<name>.schema.json: what the in-image gate writes (kept with smoke/, the writer)."""
    # Beside the package, not the working directory: smoke/ and builder/ ship together in one checkout.
    folder = Path(__file__).resolve().parents[2] / "smoke" / "schemas"
    return json.loads((folder / f"{name}.schema.json").read_text(encoding="utf-8"))


def _pattern(validator, pattern: str, instance, _schema):
    """`pattern` as JSON Schema means it (ECMA-262): a final `$` ends the text. Python's `$` also matches
    before a last newline, which would let "sha256:…\\n" or a two-line tag through."""
    if validator.is_type(instance, "string") and not re.search(re.sub(r"(?<!\\)\$$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})


def type_name(value) -> str:
    """A JSON value's kind in the words of the messages ("a list", "text")."""
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "text", int: "an integer", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def field_name(path) -> str:
    """A path into a document as code reads it: checks[1].figures.ranks."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(error: jsonschema.ValidationError) -> str:
    """One line: which field, what it must be, what it is."""
    path, kind, want, value = list(error.absolute_path), error.validator, error.validator_value, error.instance
    if kind == "required":
        missing = next((key for key in want if key not in value), want[0])
        return f"field '{field_name([*path, missing])}' is missing"
    subject = f"field '{field_name(path)}'" if path else "the top level"
    if kind == "type":
        wants = [want] if isinstance(want, str) else want
        return f"{subject} must be {' or '.join(_TYPE_WORDS.get(w, w) for w in wants)}, got {type_name(value)}"
    if kind in ("enum", "const"):
        options = want if kind == "enum" else [want]
        return f"{subject} must be {' or '.join(_shown(o) for o in options)}, got {_shown(value)}"
    if kind == "pattern":
        return f"{subject} is not in the expected form ({_shown(value)} does not match {want})"
    if kind == "format" and want in _FORMAT_CHECKS:
        return f"{subject} is not {_FORMAT_WORDS[want]} ({_shown(value)}: {_FORMAT_CHECKS[want](value)})"
    if kind == "minimum":
        return f"{subject} must be at least {want}, got {_shown(value)}"
    return f"{subject}: {error.message[:200]}"


def problems(name: str, data, smoke: bool = False) -> list[str]:
    """Every way `data` breaks schema `name`, one line each (empty when valid), in document order."""
    validator = _Validator(smoke_schema(name) if smoke else schema(name), format_checker=FORMATS)
    return [describe(e) for e in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path])]
