"""What the row of an advisory lock call says it did (session state read from results).

A lock function alone in a one-row SELECT (effects.ROW_EFFECTS) did what its column of the
statement's DataRow says: pg_try_advisory_lock* took a lock only when true, pg_advisory_unlock*
released one only when true, pg_advisory_lock* and pg_advisory_unlock_all() ran when the row
came. SessionTracker keeps the rows of a batch; read makes the effects what they say, or,
where the row cannot be told, what the call says as written (as before rows were read). A
row too long to hold comes as its head (its first bytes): a column past it cannot be told.
"""

from __future__ import annotations

from typing import Final

from ..errors import ProtocolViolation
from ..proto.messages import parse_data_row_head
from .effects import (
    LOCK,
    LOCK_ROW,
    LOCK_TAKEN,
    LOCK_UNCOUNTED,
    ROW_EFFECTS,
    UNLOCK,
    UNLOCK_ALL,
    UNLOCK_ROW,
    UNLOCKED,
    UNLOCKED_ALL,
    Effect,
    Parsed,
)

#: A boolean result that says true, in text or binary format.
_TRUE: Final = (b"t", b"\x01")


def read(parsed: Parsed, base: int, rows: dict[int, bytes], error_at: int) -> Parsed:
    """parsed with its ROW_EFFECTS made what its rows say (base: see Batch.bases)."""
    effects: list[Effect] = []
    for effect in parsed.effects:
        if effect[0] in ROW_EFFECTS:
            said = _row_says(effect, base, rows, error_at)
            if said is not None:
                effects.append(said)
        else:
            effects.append(effect)
    return Parsed(effects, parsed.statements)


def _row_says(effect: Effect, base: int, rows: dict[int, bytes], error_at: int
              ) -> Effect | None:  # fmt: skip
    """What one of ROW_EFFECTS did, read from its statement's row: None for nothing. When the
    row cannot be told (where it comes is unknown, it did not come, it is not the one
    expected), what the call says as written, as before rows were read."""
    kind = effect[0]
    statement, column, columns = effect[-3], effect[-2], effect[-1]
    if base >= 0:
        index = base + statement
        body = rows.get(index)
        if body is not None:
            # (a row too long to hold came as its head: a column before the cut is read;
            # one past it cannot be told)
            try:
                count, values = parse_data_row_head(body)
            except ProtocolViolation:
                count, values = -1, []
            if count == columns and column < len(values):
                return _value_says(effect, values[column])
        elif 0 <= error_at <= index:
            # An error before the statement: it never ran. In it: the one call failed, and
            # did nothing; of several, the ones before it did (session locks stay).
            if error_at < index or columns == 1:
                return None
            return (LOCK_UNCOUNTED,) if kind == LOCK_ROW else None
    if kind == LOCK_ROW:
        return (LOCK, effect[1]) if effect[1] is not None else (LOCK_UNCOUNTED,)
    if kind == UNLOCK_ROW:
        return (UNLOCK, effect[1]) if effect[1] is not None else None
    return (UNLOCK_ALL,)


def _value_says(effect: Effect, value: bytes | None) -> Effect | None:
    """What a call did, from its column's value (text or binary format; NULL: a strict
    function given a NULL, which did nothing)."""
    kind = effect[0]
    if kind == LOCK_ROW:
        granted = value in _TRUE if effect[2] else value is not None
        if not granted:
            return None
        return (LOCK_TAKEN, effect[1]) if effect[1] is not None else (LOCK_UNCOUNTED,)
    if kind == UNLOCK_ROW:
        return (UNLOCKED, effect[1], effect[2]) if value in _TRUE else None
    return (UNLOCKED_ALL,) if value is not None else None
