"""libpq keyword/value connection strings (conninfo) for the tests and the benchmarks."""

from __future__ import annotations

import re

__all__ = ["make_dsn"]


def _dsn_value(value: object) -> str:
    """A conninfo value: bare when it can be, else single-quoted with \\ and ' escaped."""
    text = str(value)
    if text and not re.search(r"[\s'\\]", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def make_dsn(**params: object) -> str:
    """Build a libpq keyword/value connection string; None values are left out."""
    return " ".join(f"{key}={_dsn_value(val)}" for key, val in params.items() if val is not None)
