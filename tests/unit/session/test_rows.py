"""What advisory lock calls did, read from their rows (session/rows.py, SessionTracker), and
where a batch's rows come (ClientFramer.executes_before, session/framer.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pgtarn.proto import build
from pgtarn.proto.build import data_row
from pgtarn.proto.framing import HEAD_SIZE
from pgtarn.session.effects import Parsed
from pgtarn.session.framer import ClientFramer
from pgtarn.session.parsing import effects_of
from pgtarn.session.tracking import ADVISORY_LOCK, SessionState, SessionTracker

from .test_tracking import IDLE, VOID, returned

TRY = "SELECT pg_try_advisory_lock(1)"
UNLOCK = "SELECT pg_advisory_unlock(1)"


def tracker() -> SessionTracker:
    return SessionTracker(SessionState())


def batch(
    session: SessionTracker,
    text: str,
    *rows: tuple[str | None, ...],
    binary: bool = False,
    base: int = 0,
    error: bool = False,
) -> None:
    """One Query (or Bind) of text, its statements' rows relayed, maybe an error, then its
    ReadyForQuery."""
    session.add(effects_of(text), 0, IDLE, base)
    for row in rows:
        returned(session, *row, binary=binary)
    if error:
        session.error()
    session.ready(IDLE)


@pytest.mark.parametrize("binary", [False, True])
def test_a_refused_try_lock_takes_nothing_and_a_granted_one_counts(binary: bool) -> None:
    session = tracker()
    batch(session, TRY, ("f",), binary=binary)
    assert session.state.locks == {} and session.state.reasons() == []
    batch(session, TRY, ("t",), binary=binary)
    assert session.state.locks == {"1": 1}
    assert session.state.reasons() == [ADVISORY_LOCK]


def test_an_unlock_that_releases_nothing_changes_no_count() -> None:
    session = tracker()
    batch(session, UNLOCK, ("f",))
    assert session.state.locks == {}
    batch(session, "SELECT pg_advisory_lock(1)", (VOID,))
    batch(session, UNLOCK, ("t",))
    batch(session, UNLOCK, ("f",))
    assert session.state.locks == {}
    batch(session, "SELECT pg_advisory_lock(1)", (VOID,))
    assert session.state.locks == {"1": 1}  # not 0: the count never went below


def test_a_released_lock_of_another_key_text_is_one_fewer_of_its_mode() -> None:
    session = tracker()
    batch(session, "SELECT pg_advisory_lock($1)", (VOID,))
    batch(session, "SELECT pg_advisory_lock_shared(2)", (VOID,))
    batch(session, "SELECT pg_advisory_unlock($2)", ("f",))  # another value: nothing
    assert session.state.locks == {"$1": 1, "shared 2": 1}
    batch(session, UNLOCK, ("t",))  # $1 was 1: PostgreSQL released it
    assert session.state.locks == {"shared 2": 1}
    batch(session, "SELECT pg_advisory_unlock_shared(2)", ("t",))
    assert session.state.locks == {} and not session.state.reasons()


def test_a_null_result_took_nothing_and_an_expression_key_pins_uncounted() -> None:
    session = tracker()
    batch(session, "SELECT pg_advisory_lock($1)", (None,))  # a NULL key: strict, nothing
    assert not session.state.reasons()
    batch(session, "SELECT pg_try_advisory_lock(1 + 1)", ("f",))
    assert not session.state.reasons()
    batch(session, "SELECT pg_try_advisory_lock(1 + 1)", ("t",))
    assert session.state.locks_uncounted
    batch(session, "SELECT pg_advisory_unlock(1 + 1)", ("t",))
    assert session.state.reasons() == [ADVISORY_LOCK]  # uncounted: until all are unlocked
    batch(session, "SELECT pg_advisory_unlock_all()", (VOID,))
    assert not session.state.reasons()


def test_each_call_reads_its_own_column() -> None:
    session = tracker()
    batch(session, "SELECT pg_try_advisory_lock(1), pg_try_advisory_lock(2) AS two", ("f", "t"))
    assert session.state.locks == {"2": 1}


def test_a_statement_that_never_ran_or_failed_alone_took_nothing() -> None:
    session = tracker()
    batch(session, "SELECT 1/0; SELECT pg_advisory_lock(1)", error=True)
    assert not session.state.reasons()
    batch(session, "SELECT pg_advisory_lock(1)", error=True)  # lock_timeout, deadlock
    assert not session.state.reasons()


def test_a_failed_statement_of_several_calls_may_hold_some() -> None:
    session = tracker()
    batch(session, "SELECT pg_advisory_lock(1), pg_advisory_lock(2)", error=True)
    assert session.state.locks_uncounted and session.state.locks == {}


def test_a_row_that_came_counts_whatever_failed_after_it() -> None:
    session = tracker()
    batch(session, "SELECT pg_try_advisory_lock(1); SELECT 1/0", ("t",), error=True)
    assert session.state.locks == {"1": 1}
    batch(session, "SELECT pg_advisory_unlock_all(); SELECT 1/0", (VOID,), error=True)
    assert not session.state.reasons()


def test_a_lock_among_other_expressions_that_failed_stays_pinned() -> None:
    # session locks outlive the error: one may have been taken before it
    session = tracker()
    batch(session, "SELECT pg_advisory_lock(1), 1 / (random() * 0)::int", error=True)
    assert session.state.reasons() == [ADVISORY_LOCK]


@pytest.mark.parametrize("rows", [(), (("t", "t"),)], ids=["no row", "another shape"])
def test_a_row_that_cannot_be_told_counts_as_written(rows: tuple[tuple[str, ...], ...]
                                                     ) -> None:  # fmt: skip
    session = tracker()
    batch(session, TRY, *rows)
    assert session.state.locks == {"1": 1}
    batch(session, UNLOCK, *rows)
    assert session.state.locks == {}


def test_rows_of_an_unknown_place_count_as_written() -> None:
    session = tracker()
    batch(session, TRY, ("f",), base=-1)
    assert session.state.locks == {"1": 1}


def test_results_before_the_statement_are_skipped() -> None:
    session = tracker()
    session.add(effects_of("SELECT 1; SELECT 2; " + TRY), 0, IDLE)
    returned(session, "t")
    returned(session, "t")
    returned(session, "f")
    session.ready(IDLE)
    assert session.state.locks == {}
    # a Bind whose Execute comes after two others of its batch
    session.add(effects_of(TRY), 0, IDLE, 2)
    returned(session, "t")
    returned(session, "t")
    returned(session, "f")
    session.ready(IDLE)
    assert session.state.locks == {}


def test_rows_of_a_batch_before_are_not_read_and_the_watch_ends_with_the_batch() -> None:
    session = tracker()
    session.add(Parsed([], 1), 0, IDLE)  # a batch of its own, before
    session.add(effects_of(TRY), 1, IDLE)
    assert session.watching
    returned(session, "t")  # the batch before's
    session.ready(IDLE)
    assert session.watching
    returned(session, "f")
    session.ready(IDLE)
    assert session.state.locks == {} and not session.watching


def test_only_the_wanted_rows_are_kept() -> None:
    session = tracker()
    session.add(effects_of("SELECT 1; " + TRY), 0, IDLE)
    for _ in range(3):
        session.result(0x44, build.data_row(["x"])[5:])
    assert session.rows == {}
    session.result(0x43, b"SELECT 3\x00")
    returned(session, "t")
    assert list(session.rows) == [1]


# --- where a batch's rows come (the framer) ------------------------------------------------------


def executes_seen(chunks: list[bytes], open_before: list[bool]) -> list[int]:
    """executes_before at each Bind the texts hook is given (a named statement that
    changes state, "s", makes every Bind reach it)."""
    framer = ClientFramer(10_000)
    seen: list[int] = []

    def hook(msg_type: int, body: bytes, _outstanding: int) -> bytes | None:
        if msg_type == 0x42:
            seen.append(framer.executes_before(False))
        return None

    framer.watch(tracker(), hook)
    framer.named_effects[b"s"] = effects_of(TRY)
    for chunk, was_open in zip(chunks, open_before, strict=True):
        framer.feed(chunk, 0, was_open)
    return seen


BIND = build.bind("", "s", [])
EXECUTE = build.execute()


def test_a_bind_counts_the_executes_before_it_in_its_batch() -> None:
    chunk = (
        BIND
        + EXECUTE
        + BIND
        + build.message(b"D", b"P\x00")
        + EXECUTE
        + build.SYNC
        + BIND
        + EXECUTE
        + build.SYNC
    )
    assert executes_seen([chunk], [False]) == [0, 1, 0]


def test_a_bind_with_no_execute_after_it_is_unknown() -> None:
    assert executes_seen([BIND + BIND + EXECUTE + build.SYNC], [False]) == [-1, 0]
    assert executes_seen([BIND + build.SYNC], [False]) == [-1]


def test_a_batch_begun_in_an_earlier_chunk() -> None:
    # asyncpg: Parse, Describe and Flush, then Bind, Execute and Sync
    prepare = build.parse("s", TRY) + build.message(b"D", b"Ss\x00") + build.message(b"H")
    assert executes_seen([prepare, BIND + EXECUTE + build.SYNC], [False, True]) == [0]
    # an earlier chunk of the batch the hook did not see: unknown
    assert executes_seen([EXECUTE, BIND + EXECUTE + build.SYNC], [False, True]) == [-1]
    # one it saw, with an Execute
    assert executes_seen([BIND + EXECUTE, BIND + EXECUTE + build.SYNC], [False, True]) == [0, 1]


def head_of(values: Sequence[str | None]) -> bytes:
    """The body of a DataRow of values as a long row's reaches the tracker: its first
    HEAD_SIZE bytes."""
    return data_row(values)[5 : 5 + HEAD_SIZE]


@pytest.mark.parametrize("lock_first", [True, False])
def test_a_long_rows_lock_column_is_read_from_its_head_or_taken_as_maybe_granted(
    lock_first: bool,
) -> None:
    """Two lock calls, one result read from a row that came as its head only: a column in
    the head says what it says (a refused try-lock takes nothing), one past the cut counts
    as the call says as written (a lock maybe taken: pinned, uncounted for an expression)."""
    session = tracker()
    text = "SELECT pg_try_advisory_lock(1), pg_try_advisory_lock(2)"
    values = ["f", "x" * (2 * HEAD_SIZE)] if lock_first else ["x" * (2 * HEAD_SIZE), "f"]
    session.add(effects_of(text), 0, IDLE, 0)
    session.result(0x44, head_of(values))
    session.result(0x43, b"SELECT 1\x00")
    session.ready(IDLE)
    # lock 1: read "f" from the head (nothing), or its value cut (as written); lock 2's
    # value is past the cut either way (as written)
    assert session.state.locks == ({"2": 1} if lock_first else {"1": 1, "2": 1})
