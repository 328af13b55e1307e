"""The parsers of SQL texts a client's relay needs, each imported at its first use."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from ..session.effects import Parsed


@cache
def load_pglast() -> Callable[[str], Parsed]:
    """session/parsing.py's effects_of, imported at the first text to parse and not at start:
    pglast is large, and memory a pooler whose clients send no text that may change session
    state (or that does not track it) never needs."""
    from ..session.parsing import effects_of  # lazy, for the memory (see the docstring)

    return effects_of


@cache
def load_readonly() -> tuple[
    Callable[[bytes, Callable[[bytes], bytes | None]], int], Callable[[dict[str, str]], bool]
]:
    """session/readonly.py's classify_chunk and reads_by_default, imported when a client of
    a read_write_split database first starts a transaction: it holds pglast, whose memory a
    pooler without the split does not need (as load_pglast)."""
    from ..session import readonly  # lazy, for the memory (see load_pglast)

    return readonly.classify_chunk, readonly.reads_by_default


def effects_of(sql: str) -> Parsed:
    """The effects of a query text (session/parsing.py), pglast loaded on first use."""
    return load_pglast()(sql)
