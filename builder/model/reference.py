"""Image references as Docker parses them, so a value Docker would reject is refused before any build.

The grammar is distribution/reference's (reference/regexp.go and reference.go in github.com/distribution/
reference), transcribed:
  reference  := name [ ":" tag ] [ "@" digest ]
  name       := [domain "/"] path-component ["/" path-component]*      (at most 255 characters)
  domain     := host [":" port]; host := domain-component ["." domain-component]* | "[" IPv6 "]"
  domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
  path-component   := [a-z0-9]+ (separator [a-z0-9]+)*;  separator := [_.] | "__" | "-"+
  tag        := [\\w][\\w.-]{0,127}   (Go's \\w is ASCII: [A-Za-z0-9_])
  digest     := algorithm ":" hex;  algorithm := [A-Za-z][A-Za-z0-9]* ([+._-] [A-Za-z][A-Za-z0-9]*)*
                hex := [0-9a-fA-F]{32,}; go-digest then requires the registered algorithms' exact
                lengths in lowercase (sha256: 64, sha384: 96, sha512: 128).
Every pattern is matched with re.fullmatch: `$` would also accept a value ending in a newline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from builder.errors import UserError

NAME_TOTAL_MAX = 255
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
DOMAIN = rf"{_HOST}(?::[0-9]+)?"
PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_PATH = rf"{PATH_COMPONENT}(?:/{PATH_COMPONENT})*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_ALGORITHM = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*"
DIGEST_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}

NAME_RE = re.compile(rf"(?:(?P<domain>{DOMAIN})/)?(?P<path>{_PATH})")
DIGEST = rf"{_ALGORITHM}:[0-9a-fA-F]{{32,}}"
REFERENCE_RE = re.compile(rf"(?P<name>{NAME_RE.pattern})(?::(?P<tag>{TAG}))?(?:@(?P<digest>{DIGEST}))?")
TAG_RE = re.compile(TAG)
IMAGE_ID_RE = re.compile(r"(?:sha256:)?[a-f0-9]{12,64}")


@dataclass(frozen=True)
class Reference:
    name: str
    tag: str | None
    digest: str | None


def _domain_is_real(name: str) -> bool:
    """Docker treats the first component as a registry only if it has '.', ':' or is localhost (or uppercase)."""
    first, _, rest = name.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost" or first.lower() != first)


def problem(text: str) -> str | None:
    """Why Docker would reject `text` as an image reference, or None when it is valid."""
    if not isinstance(text, str) or not text:
        return "empty"
    m = REFERENCE_RE.fullmatch(text)
    if not m:
        if text.lower() != text and REFERENCE_RE.fullmatch(text.lower()):
            return "repository names must be lowercase"
        return "not NAME[:TAG][@DIGEST] (lowercase path components, tag of [A-Za-z0-9_.-] up to 128 characters)"
    name = m.group("name")
    if re.fullmatch(r"[a-f0-9]{64}", name):
        return "a 64-character hex string is an image ID, not a repository name"
    if len(name) > NAME_TOTAL_MAX:
        return f"the name is {len(name)} characters (Docker's limit is {NAME_TOTAL_MAX})"
    if m.group("domain") and not _domain_is_real(name):
        # e.g. "Foo/bar": the first part is not a registry host, so Docker reads it as a path: uppercase is invalid
        if not re.fullmatch(PATH_COMPONENT, m.group("domain")):
            return "repository names must be lowercase"
    digest = m.group("digest")
    if digest:
        algorithm, _, hexpart = digest.partition(":")
        want = DIGEST_LENGTHS.get(algorithm)
        if want is None:
            return f"unsupported digest algorithm {algorithm!r} (use sha256)"
        if len(hexpart) != want or hexpart.lower() != hexpart:
            return f"a {algorithm} digest is {want} lowercase hex characters"
    return None


def parse(text: str) -> Reference | None:
    if problem(text) is not None:
        return None
    m = REFERENCE_RE.fullmatch(text)
    return Reference(m.group("name"), m.group("tag"), m.group("digest"))


def name_problem(text: str) -> str | None:
    """Like problem(), for a repository name alone (no tag, no digest)."""
    if not isinstance(text, str) or not NAME_RE.fullmatch(text):
        return "not a repository name (lowercase path components separated by '/', optional registry host first)"
    return problem(text)


def check_image_name(image: str) -> None:
    """Refuse what Docker would refuse, before asking the engine (and without a traceback)."""
    if IMAGE_ID_RE.fullmatch(image):
        return
    why = problem(image)
    if why:
        shown = repr(image) if len(image) <= 80 else repr(image[:77] + "...")
        raise UserError(f"{shown} is not an image reference, an image ID or a `docker save` file ({why})",
                        "e.g. ghcr.io/acme/train:cu121-torch2.3, sha256:<id>, or a path to a tar file")
