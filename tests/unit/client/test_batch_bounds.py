"""Where a client's extended batch ends (relay.py): whether the ReadyForQuery of its last Sync
may end the link, for the plain relay and the framer's parts."""

from __future__ import annotations

from pgtarn.client.relay import (
    _goes_on,
    _names_statements,
    _only_flushes,
    _parts_go_on,
    _unnamed_unbound,
)
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner
from pgtarn.session.framer import SYNC_MARK

FLUSH = build.message(b"H")
BIND = build.bind("", "", [])
EXECUTE = build.execute()


def _events(data: bytes) -> tuple[list[tuple[int, bytes, int]], int]:
    scanner = MessageScanner(frozenset(b"QSX"), 1 << 20)
    events = scanner.feed(data)
    return events, scanner.held


def goes_on(data: bytes, was_open: bool = False) -> bool:
    events, held = _events(data)
    return _goes_on(data, events, held, was_open)


def test_a_batch_that_ends_with_its_sync_or_query_is_done() -> None:
    assert not goes_on(build.query("select 1"))
    assert not goes_on(build.parse("", "select 1") + BIND + EXECUTE + build.SYNC)
    assert not goes_on(build.SYNC + FLUSH)  # a Flush after the Sync changes nothing


def test_messages_after_the_last_sync_keep_the_batch_open() -> None:
    assert goes_on(build.parse("", "select 1") + build.SYNC + BIND)  # pg8000
    assert goes_on(BIND + EXECUTE)  # no Sync yet
    assert goes_on(build.SYNC + build.message(b"D", b"S\x00"))
    assert goes_on(build.query("select 1")[:4])  # a message cut short


def test_a_chunk_of_flushes_leaves_the_batch_as_it_was() -> None:
    assert goes_on(FLUSH, was_open=True)
    assert not goes_on(FLUSH + FLUSH, was_open=False)
    assert _only_flushes(b"") and _only_flushes(FLUSH * 3)
    assert not _only_flushes(FLUSH + b"H") and not _only_flushes(BIND)


def test_the_framers_parts_end_a_batch_at_a_sync_mark_or_a_query() -> None:
    parse = (0x50, b"\x00select 1\x00\x00\x00")
    bind = (0x42, b"\x00\x00\x00\x00\x00\x00\x00\x00")
    assert not _parts_go_on([parse, bind, EXECUTE + build.SYNC, SYNC_MARK], False)
    assert not _parts_go_on([(0x51, b"EXECUTE s\x00")], True)
    assert not _parts_go_on([build.SYNC, SYNC_MARK, FLUSH], False)
    assert _parts_go_on([build.SYNC, SYNC_MARK, bind], False)
    assert _parts_go_on([parse], False)
    assert _parts_go_on([FLUSH], True) and not _parts_go_on([FLUSH], False)


def test_the_unnamed_statement_is_held_from_its_parse_to_its_bind() -> None:
    parse_unnamed = (0x50, b"\x00select $1\x00\x00\x00")
    parse_named = (0x50, b"s1\x00select $1\x00\x00\x00")
    bind_unnamed = (0x42, b"\x00\x00\x00\x00\x00\x00\x00\x00")
    bind_named = (0x42, b"\x00s1\x00\x00\x00\x00\x00\x00\x00")
    assert _unnamed_unbound([parse_unnamed, build.SYNC, SYNC_MARK], False)
    assert _unnamed_unbound([(0x44, b"S\x00"), build.SYNC, SYNC_MARK], True)  # Describe
    assert not _unnamed_unbound([bind_unnamed, EXECUTE + build.SYNC, SYNC_MARK], True)
    assert _unnamed_unbound([bind_named], True)  # another statement's Bind
    assert not _unnamed_unbound([parse_named, bind_named], False)
    assert not _unnamed_unbound([parse_unnamed, bind_unnamed], False)
    portal_unnamed = (0x42, b"c1\x00\x00\x00\x00\x00\x00\x00\x00")  # a named portal
    portal_named = (0x42, b"c1\x00s1\x00\x00\x00\x00\x00\x00\x00")
    assert not _unnamed_unbound([portal_unnamed], True)
    assert _unnamed_unbound([portal_named], True)
    assert _unnamed_unbound([(0x42, b"c1")], True)  # no NUL: not a Bind of it


def test_names_statements_of_a_query() -> None:
    execute, plain = build.query("EXECUTE p1 (5)"), build.query("SELECT 1;")
    for data in (execute, plain):  # alone: from its text, or from the chunk without one
        expected = data is execute
        assert _names_statements(data, data[5:], alone=True) == expected
        assert _names_statements(data, b"", alone=True) == expected
    # with other messages around it: any of the words anywhere in the chunk
    assert _names_statements(plain + build.query("prepare p2 as select 2"), plain[5:], False)
    assert not _names_statements(plain + build.SYNC, plain[5:], alone=False)
