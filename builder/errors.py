"""One exception family; each kind maps to an exit code. Only cli.main() prints and exits.

Every message and hint is passed through `mask()` when the error is made, so an error can never echo a
credential someone put into a URL or a registry name (the value is shown with `****@` instead).
"""

import re
from urllib.parse import unquote, urlsplit

# scheme://user:password@host or user:password@host/...: the userinfo part, wherever it appears.
# Both alternatives start only at a word boundary (the lookbehinds), which keeps the scan linear: a message
# of 100k characters is masked in milliseconds, not seconds.
_USERINFO = re.compile(r"(?P<pre>(?:(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://)|(?<![^\s'\"(=,\[]))[^\s/@'\"]*@(?![A-Za-z][A-Za-z0-9]*:[0-9a-fA-F]{32})(?=[^\s@/'\"]*[.:\[/]|localhost)")
_QUERY_SECRET = re.compile(r"(?i)((?:token|password|passwd|secret|key|auth|sig|signature)=)[^&\s'\"]+")


def hide(text, secrets=()):
    """`text` with each of the given secret values replaced by ****, and nothing else changed: for a command's
    output that is data (a lock, a file `git show` printed), which the URL patterns of `mask` could alter
    (`pykey==1.0`, `key=lambda`)."""
    if not isinstance(text, str):
        return text
    for value in sorted(_parts(secrets), key=len, reverse=True):  # the longest first: overlaps
        text = text.replace(value, "****")
    return text


def _parts(secrets) -> set[str]:
    """The values, and the password of each that is a URL with one: a tool may print the token alone
    (`token=…`, an encoded URL), not the whole PIP_INDEX_URL it came in."""
    found = {s for s in secrets if s}
    for value in list(found):
        try:
            password = urlsplit(value).password if "@" in value else None
        except ValueError:  # not a URL after all
            password = None
        if password and len(password) >= 4:  # `a`, `x`: masking those would garble every line
            found.update({password, unquote(password)})
    return found


def mask(text, secrets=()):
    """`text` with the given secret values and URL credentials (user:password@, token=...) replaced by ****.

    The one masking function: errors, echoed command lines and streamed command output all pass through it."""
    text = hide(text, secrets)
    if not isinstance(text, str) or ("@" not in text and "=" not in text):
        return text
    text = _USERINFO.sub(lambda m: f"{m.group('pre') or ''}****@", text)
    return _QUERY_SECRET.sub(r"\1****", text)


class BuilderError(Exception):
    """Base class. `exit_code` tells the shell what kind of failure this was."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        message, hint = mask(message), mask(hint)
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} — {self.hint}"


class UserError(BuilderError):
    """Bad input: the matrix, a flag, a tag selection. The user must change something."""

    exit_code = 2


class MatrixError(UserError):
    """The matrix file is invalid. Message names file, tag, field and YAML line."""


class CompatError(UserError):
    """A combination breaks a compatibility rule."""


class EnvironmentProblem(BuilderError):
    """The machine lacks something (Docker engine, BuildKit, a base image, disk)."""

    exit_code = 3


class StepFailed(BuilderError):
    """A pipeline step ran and failed (build error, failed gate, refused publish)."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI runner cancelling, Kubernetes stopping a pod): stopped as for Ctrl-C, through the same
    cleanup (children stopped, nothing half-written), but exit 143 (128 + SIGTERM) instead of 130."""

    exit_code = 143
