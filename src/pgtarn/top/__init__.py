"""`pgtarn top`: a live terminal view of a pgtarn or PgBouncer, from its admin console.

It needs rich and psycopg, which the pooler does not: they come with the `top` extra. Without
them `run_top` only says how to install them.
"""

from __future__ import annotations

import sys

INSTALL_HINT = "pip install 'pgtarn[top]'"


def _missing(exc: ImportError) -> str:
    """The missing package's name, or re-raise an ImportError that is not ours to explain."""
    name = (exc.name or "").split(".")[0]
    if name in ("rich", "psycopg") or "psycopg" in str(exc):
        return name or "psycopg"
    raise exc


try:
    from .command import run_top
except ImportError as exc:  # the `top` extra is not installed
    _MISSING = _missing(exc)

    def run_top(argv: list[str]) -> int:
        print(
            f"pgtarn top needs {_MISSING}, which is not installed: {INSTALL_HINT}", file=sys.stderr
        )
        return 1


__all__ = ["INSTALL_HINT", "run_top"]
