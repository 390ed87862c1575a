"""`validate`: the matrix against its schema and the compatibility rules; --strict adds the release rules."""

from __future__ import annotations

from dataclasses import dataclass

from builder import log
from builder.errors import UserError
from builder.flags import switch
from builder.model import compat, matrix


@dataclass(frozen=True)
class Options(matrix.Selection):
    strict: bool = switch("--strict", help="also require every base pinned by digest with its source")
    explain: bool = switch("--explain", help="print every rule checked and what the recipe derives (as `compat TAG`)")


def main(options: Options, m: matrix.Matrix) -> int:
    entries = options.entries(m)
    if options.explain:  # every rule and every derivation, before the verdict
        from builder.model import explain

        print("\n\n".join(explain.report(e) for e in entries))
    compat.require(entries)
    if options.strict:
        problems = matrix.strict_problems(m)
        if problems:
            raise UserError("\n".join(problems))
    # Known bugs of narrow configurations (and accepted ones) do not fail validation: said once it passed.
    for e in entries:
        for w in compat.warnings(e):
            log.info(f"warning: {w.render(e)}")
    log.info(f"{m.path}: {len(entries)} entries valid{' (strict)' if options.strict else ''}")
    return 0
