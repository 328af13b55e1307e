"""MessageScanner and StartupReader over arbitrary chunk boundaries."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner, StartupReader, split_messages

message_types = st.sampled_from(list(b"ZSEDTCQPBX1dc"))
messages = st.lists(
    st.tuples(message_types, st.binary(max_size=300)), min_size=1, max_size=30
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300)
@given(msgs=messages, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
       watch=st.sets(message_types))
def test_watched_messages_found_whatever_the_chunking(msgs, cuts, watch):  # type: ignore[no-untyped-def]
    stream = b"".join(build.message(bytes([t]), body) for t, body in msgs)
    scanner = MessageScanner(frozenset(watch))
    found = []
    offset = 0
    for chunk in chunked(stream, cuts):
        for msg_type, body, end in scanner.feed(chunk):
            found.append((msg_type, body))
            # the offset points just past the message within this chunk
            assert 0 < end <= len(chunk)
            absolute_end = offset + end
            assert stream[absolute_end - len(body) : absolute_end] == body
        offset += len(chunk)
    assert found == [(t, body) for t, body in msgs if t in watch]
    assert scanner.at_boundary


def test_skips_unwatched_large_message_without_buffering() -> None:
    scanner = MessageScanner(frozenset(b"Z"))
    big = build.message(b"D", b"x" * 100_000)
    assert scanner.feed(big[:10]) == []
    assert scanner.feed(big[10:50_000]) == []
    assert not scanner.at_boundary
    events = scanner.feed(big[50_000:] + build.ready_for_query(b"T"))
    assert [(t, b) for t, b, _ in events] == [(ord("Z"), b"T")]
    assert len(scanner._buf) == 0


@pytest.mark.parametrize("length", [0, 3, 2**31, 2**32 - 1])
def test_bad_lengths_are_protocol_violations(length: int) -> None:
    data = b"Q" + length.to_bytes(4, "big") + b"xxxx"
    with pytest.raises(ProtocolViolation):
        MessageScanner(frozenset(b"Q"), max_size=2**31 - 1).feed(data)
    with pytest.raises(ProtocolViolation):  # split header, unwatched type
        scanner = MessageScanner(frozenset(b"Z"), max_size=2**31 - 1)
        scanner.feed(data[:2])
        scanner.feed(data[2:])


def test_max_size_is_enforced() -> None:
    scanner = MessageScanner(frozenset(b"Q"), max_size=100)
    with pytest.raises(ProtocolViolation):
        scanner.feed(build.query("x" * 200))
    assert MessageScanner(frozenset(b"Q"), max_size=100).feed(build.query("x" * 50))


@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10))
def test_startup_reader_chunks(cuts):  # type: ignore[no-untyped-def]
    packet = build.startup_message({"user": "u", "database": "d"})
    stream = packet + b"trailing"
    reader = StartupReader()
    result = None
    rest = b""
    consumed = 0
    for chunk in chunked(stream, cuts):
        if result is not None:
            rest += chunk
            continue
        consumed += len(chunk)
        result, rest = reader.feed(chunk)
    assert result == packet[4:]
    assert rest == b"trailing"


@pytest.mark.parametrize("length", [0, 7, 10_001, 2**31])
def test_startup_reader_rejects_bad_length(length: int) -> None:
    with pytest.raises(ProtocolViolation):
        StartupReader().feed(length.to_bytes(4, "big") + b"\x00" * 8)


def test_split_messages_roundtrip() -> None:
    data = build.query("select 1") + build.SYNC + build.ready_for_query(b"E")
    assert split_messages(data) == [(ord("Q"), b"select 1\x00"), (ord("S"), b""), (ord("Z"), b"E")]


def test_counted_types_are_reported_without_their_body() -> None:
    scanner = MessageScanner(frozenset(b"QZ"), bodies=frozenset(b"Z"))
    data = build.query("select 1") + build.ready_for_query(b"T")
    events = scanner.feed(data[:7])
    events += scanner.feed(data[7:])
    assert [(chr(t), body) for t, body, _ in events] == [("Q", b""), ("Z", b"T")]
    assert events[-1][2] == len(data) - 7


def test_held_and_released_let_a_caller_hold_back_partial_watched_messages() -> None:
    """Forwarding released + chunk[:len - held] (rebuilding watched messages that started in
    an earlier chunk) reproduces the stream for every way of cutting it."""
    stream = (build.message(b"D", b"row" * 3) + build.message(b"1") + build.message(b"T", b"x")
              + build.message(b"3") + build.ready_for_query(b"I") + build.message(b"D", b"r"))
    for cut1 in range(len(stream) + 1):
        for cut2 in range(cut1, len(stream) + 1):
            scanner = MessageScanner(frozenset(b"13Z"))
            out = bytearray()
            for chunk in (stream[:cut1], stream[cut1:cut2], stream[cut2:]):
                events = scanner.feed(chunk)
                out += scanner.released
                start = 0
                for msg_type, body, end in events:
                    msg_start = end - 5 - len(body)
                    if msg_start < 0:  # began in an earlier, held-back chunk: rebuild it
                        out += build.message(bytes((msg_type,)), body)
                        start = end
                out += chunk[start : len(chunk) - scanner.held]
            assert bytes(out) == stream, (cut1, cut2)


def test_a_stop_type_ends_the_feed_so_what_follows_it_is_never_read() -> None:
    scanner = MessageScanner(frozenset(b"SX"), 100, stop=frozenset(b"X"))
    events = scanner.feed(build.SYNC + build.TERMINATE + b"d\xff\xff\xff\xff")
    assert [chr(t) for t, _, _ in events] == ["S", "X"]
    resumed = MessageScanner(frozenset(b"SX"), 100, stop=frozenset(b"X"))
    assert resumed.feed(build.TERMINATE[:3]) == []
    events = resumed.feed(build.TERMINATE[3:] + b"d\xff\xff\xff\xff")
    assert [chr(t) for t, _, _ in events] == ["X"]
