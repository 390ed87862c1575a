"""A verb's option, declared once: the field of its frozen Options and the flag the CLI makes of it.

    @dataclass(frozen=True)
    class Options:
        image: str = arg(metavar="IMAGE", help="…")                  # a positional argument, required
        out: str = arg("--out", default=".", metavar="DIR", help="…")  # a flag; "." is the default of both
        check: bool = switch("--check", help="…")                    # store_true, False
        inputs: Inputs = nested(Inputs)                              # that dataclass's flags, as one field

The CLI (the only module that imports argparse) walks the fields: `flags.declared(cls)`. A field made
without these (publish's password, read from stdin) is no argument. Before, each option was written twice,
as a field and as an `add_argument` call, and the two defaults could disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

_KEY = "builder.flag"


@dataclasses.dataclass(frozen=True)
class Flag:
    """What argparse needs for one field: its names (none: a positional) and keyword arguments."""

    names: tuple[str, ...]
    kwargs: dict[str, Any]
    default_from: Callable[[], Any] | None = None  # evaluated when the parser is built (an environment variable)
    exclusive: str | None = None  # flags of one group name exclude each other
    negation: tuple[str, str] | None = None  # (flag, help) that stores False into a switch's field


def arg(*names: str, default: Any = dataclasses.MISSING, default_from: Callable[[], Any] | None = None,
        exclusive: str | None = None, **argparse_kwargs) -> Any:
    """A field and its argument. `default` is the field's and the flag's; `default_from` (a callable) gives the
    flag another one when the CLI builds its parser, e.g. from $GITHUB_OUTPUT, leaving the field's as it is."""
    if default is not dataclasses.MISSING:
        argparse_kwargs["default"] = default
    flag = Flag(names, argparse_kwargs, default_from, exclusive)
    return _field(flag, default)


def switch(*names: str, default_from: Callable[[], bool] | None = None, exclusive: str | None = None,
           negation: tuple[str, str] | None = None, help: str) -> Any:
    """A bool field, False unless the flag is given (or `default_from` says True and no negation is given)."""
    flag = Flag(names, {"action": "store_true", "default": False, "help": help}, default_from, exclusive, negation)
    return _field(flag, False)


def nested(cls: type) -> Any:
    """A field holding another flag-declaring dataclass, built whole from its own flags (model.inputs.Inputs)."""
    return dataclasses.field(default_factory=cls, metadata={_KEY: cls})


def _field(flag: Flag, default: Any) -> Any:
    if isinstance(default, (list, dict, set)):
        raise TypeError("a mutable default: use a tuple")
    return dataclasses.field(default=default, metadata={_KEY: flag})


def declared(cls: type) -> Iterator[tuple[str, Flag]]:
    """(field name, Flag) of every argument `cls` declares, nested dataclasses' included, in field order."""
    for f in dataclasses.fields(cls):
        found = f.metadata.get(_KEY)
        if isinstance(found, Flag):
            yield f.name, found
        elif isinstance(found, type):
            yield from declared(found)


def values(cls: type, parsed: Callable[[str], Any]) -> Any:
    """`cls` built from parsed values (`parsed(field name)`); nested fields are built the same way, and fields
    that are no argument keep their defaults."""
    given = {}
    for f in dataclasses.fields(cls):
        found = f.metadata.get(_KEY)
        if isinstance(found, Flag):
            given[f.name] = parsed(f.name)
        elif isinstance(found, type):
            given[f.name] = values(found, parsed)
    return cls(**given)
