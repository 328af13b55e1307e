"""MessageStream and MessageScanner's stream_over: a large message in pieces, never whole."""

from __future__ import annotations

import pytest

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner, shared_scanner
from pgtarn.proto.streaming import HEAD_SIZE, MessageStream

QSX = frozenset(b"QSX")


def big_query(size: int) -> bytes:
    return build.query("SELECT '" + "x" * size + "'")


def test_scanner_stops_at_a_large_watched_message_cut() -> None:
    big = big_query(1000)
    small = build.query("SELECT 1")
    scanner = MessageScanner(QSX, stream_over=500)
    chunk = small + big[:300]
    events = scanner.feed(chunk)
    assert [(kind, end) for kind, _body, end in events] == [(0x51, len(small))]
    assert scanner.big_at == len(small) and scanner.big_start == b""
    assert scanner.at_boundary and scanner.held == 0 and scanner.buffered == 0
    # the next feed starts fresh: big_at is cleared
    scanner.feed(small)
    assert scanner.big_at == -1


def test_scanner_keeps_a_large_message_that_arrives_whole() -> None:
    big = big_query(1000)
    scanner = MessageScanner(QSX, stream_over=500)
    events = scanner.feed(big)
    assert len(events) == 1 and scanner.big_at == -1


def test_scanner_streams_nothing_unwatched_or_small() -> None:
    bind = build.message(b"B", b"\x00\x00" + b"y" * 1000)
    scanner = MessageScanner(QSX, stream_over=500)
    assert scanner.feed(bind[:300]) == [] and scanner.big_at == -1  # skipped by length
    small = big_query(100)
    scanner = MessageScanner(QSX, stream_over=500)
    scanner.feed(small[:50])
    assert scanner.big_at == -1 and scanner.held == 50


def test_scanner_large_message_whose_header_was_cut() -> None:
    big = big_query(1000)
    small = build.query("SELECT 1")
    scanner = MessageScanner(QSX, stream_over=500)
    first = small + big[:3]
    assert len(scanner.feed(first)) == 1 and scanner.held == 3
    scanner.feed(big[3:400])
    assert scanner.big_at == 0 and scanner.big_start == big[:3]
    assert scanner.at_boundary


def test_shared_scanners_differ_by_stream_over() -> None:
    assert shared_scanner(QSX, 1000, None, 10) is not shared_scanner(QSX, 1000, None, 20)
    assert shared_scanner(QSX, 1000, None, 10) is shared_scanner(QSX, 1000, None, 10)


@pytest.mark.parametrize("cut", [1, 5, 7, 100, 4000, 20000])
def test_stream_pieces_are_the_message(cut: int) -> None:
    big = big_query(30000)
    after = build.query("SELECT 2")
    data = big + after
    stream = MessageStream(data[:5], 1 << 30, head_size=1000)
    sent = bytearray()
    rest = b""
    pos = 0
    while not stream.done:
        chunk = data[pos : pos + cut]
        piece, taken = stream.feed(chunk)
        if stream.head_ready and not sent:
            sent += stream.head()
        sent += piece
        pos += taken
        if stream.done:
            rest = chunk[taken:]
    assert bytes(sent) == big
    assert rest == after[: len(rest)]
    assert stream.head() == big[:1005]


def test_stream_of_a_message_shorter_than_the_head() -> None:
    msg = big_query(10)
    stream = MessageStream(msg, 1 << 30)
    piece, taken = stream.feed(msg + b"tail")
    assert (piece, taken) == (b"", len(msg)) and stream.done and stream.head() == msg


def test_stream_refuses_a_bad_length() -> None:
    with pytest.raises(ProtocolViolation):
        MessageStream(b"Q\x00\x00\x10\x00", 1000)
    with pytest.raises(ProtocolViolation):
        MessageStream(b"Q\x00\x00\x00\x02", 1000)


def error_response(message: str) -> bytes:
    return build.error_response("XX000", message, "ERROR")


@pytest.mark.parametrize("cut", [3, 100, 5000, 9000, 70000])
def test_heads_report_a_long_message_at_its_end_by_its_head(cut: int) -> None:
    error = error_response("e" * 200_000)
    after = build.ready_for_query(b"I")
    data = build.command_complete("SELECT 1") + error + after
    scanner = MessageScanner(frozenset(b"EZ"), stream_over=1000, heads=True)
    events = []
    for at in range(0, len(data), cut):
        chunk = data[at : at + cut]
        events += [(kind, body, at + end) for kind, body, end in scanner.feed(chunk)]
        assert scanner.buffered <= 5 + HEAD_SIZE  # never more than the head
    kinds = [chr(kind) for kind, _body, _end in events]
    assert kinds == ["E", "Z"]
    _kind, body, end = events[0]
    assert len(body) == HEAD_SIZE and error[5:].startswith(body)
    assert end == len(build.command_complete("SELECT 1")) + len(error)
    assert events[1][2] == len(data) and scanner.at_boundary


def test_heads_keep_short_messages_whole() -> None:
    error = error_response("short")
    scanner = MessageScanner(frozenset(b"EZ"), stream_over=1000, heads=True)
    assert scanner.feed(error[:10]) == []
    ((_kind, body, _end),) = scanner.feed(error[10:])
    assert body == error[5:]
