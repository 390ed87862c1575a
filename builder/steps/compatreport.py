"""`compat`: every compatibility rule checked for the entries, with outcome and evidence, and the facts
derived from them (builder/model/explain.py); exit 2 when an entry breaks a rule."""

from __future__ import annotations

from builder.errors import UserError
from builder.model import compat, explain, matrix

Options = matrix.Selection  # tags and --all only


def main(options: matrix.Selection, m: matrix.Matrix) -> int:
    entries = options.entries(m)
    print("\n\n".join(explain.report(e) for e in entries))
    broken = [e.tag for e in entries if compat.check(e)]
    if broken:
        raise UserError(f"{', '.join(broken)} break(s) compatibility rules (table above)",
                        "change the entry or, if a rule is wrong, fix compat.yaml with a source")
    return 0
