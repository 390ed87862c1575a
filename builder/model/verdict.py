"""What a compatibility judgment says: one rule checked against one entry (`Outcome`), and a broken one as the
user reads it (`Violation`). Shared by the judge (compat.py) and the knowledge it reads (names, archs, signals,
bugs), so each source returns the same shape with its evidence."""

from __future__ import annotations

from dataclasses import dataclass

from builder.model.matrix import Entry


@dataclass(frozen=True)
class Violation:
    rule: str
    field: str
    reason: str
    source: str

    def render(self, entry: Entry) -> str:
        return (f"{entry.source}:{entry.line(self.field)}: entry '{entry.tag}', field '{self.field}': "
                f"[{self.rule}] {self.reason} (source: {self.source})")


@dataclass(frozen=True)
class Outcome:
    """One rule checked against one entry. ok: True passed, False violated, None did not apply or could not be
    judged (the reason says which). warn: a problem that does not reject the entry (a crash in a narrow
    configuration, a known bug the entry accepted): `validate` prints it, `compat TAG` lists it."""

    rule: str
    kind: str
    field: str
    ok: bool | None
    reason: str
    source: str
    warn: bool = False
