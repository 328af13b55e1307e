"""MessageScanner and StartupReader over arbitrary chunk boundaries."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner, StartupReader, shared_scanner, split_messages

message_types = st.sampled_from(list(b"ZSEDTCQPBX1dc"))
messages = st.lists(st.tuples(message_types, st.binary(max_size=300)), min_size=1, max_size=30)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300)
@given(
    msgs=messages,
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
    watch=st.sets(message_types),
)
def test_watched_messages_found_whatever_the_chunking(
    msgs: list[tuple[int, bytes]], cuts: list[int], watch: set[int]
) -> None:
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
def test_startup_reader_chunks(cuts: list[int]) -> None:
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
    stream = (
        build.message(b"D", b"row" * 3)
        + build.message(b"1")
        + build.message(b"T", b"x")
        + build.message(b"3")
        + build.ready_for_query(b"I")
        + build.message(b"D", b"r")
    )
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


def _fed_alone(scanner: MessageScanner, data: bytes, msg_type: int, body: bytes) -> bool:
    """What one_whole and ends_at_ready stand for: feed returns just that message, at the
    end of data, and leaves the scanner at a boundary."""
    try:
        events = scanner.feed(data)
    except ProtocolViolation:
        return False
    return (
        events == [(msg_type, body, len(data))]
        and scanner.at_boundary
        and scanner.held == 0
        and scanner.released == b""
    )


@settings(max_examples=400, deadline=None)
@given(
    msgs=messages,
    watch=st.sets(message_types),
    begun=st.integers(0, 7),
    max_size=st.sampled_from([2**31 - 1, 64]),
    status=st.sampled_from([b"", b"I", b"T"]),
)
def test_one_whole_and_ends_at_ready_answer_as_feed_would(
    msgs: list[tuple[int, bytes]], watch: set[int], begun: int, max_size: int, status: bytes
) -> None:
    if status:  # most replies end so
        msgs = [*msgs, (0x5A, status)]
    data = b"".join(build.message(bytes([t]), body) for t, body in msgs)
    before = build.message(b"D", b"x" * 8)[:begun]  # a message cut short, or nothing

    def scanner() -> MessageScanner:
        fresh = MessageScanner(frozenset(watch), max_size)
        fresh.feed(before)
        return fresh

    first, body = msgs[0]
    whole = scanner().one_whole(data, first)
    ready = scanner().ends_at_ready(data)
    fed_whole = len(msgs) == 1 and _fed_alone(scanner(), data, first, body)
    fed_ready = _fed_alone(scanner(), data, 0x5A, data[-1:])
    assert whole <= fed_whole and ready <= fed_ready  # never where feed would differ
    if not before:  # and, at a boundary, wherever feed agrees
        assert whole == fed_whole and ready == fed_ready


def test_ends_at_ready_is_a_usual_reply_after_nothing_watched() -> None:
    reply = (
        build.message(b"T", b"row description")
        + build.message(b"D", b"a row")
        + build.command_complete("SELECT 1")
        + build.ready_for_query(b"I")
    )
    scanner = MessageScanner(frozenset(b"ZSE"))
    assert scanner.ends_at_ready(reply)
    assert scanner.ends_at_ready(build.ready_for_query(b"T"))
    assert not scanner.ends_at_ready(reply[:-1])  # cut short
    assert not scanner.ends_at_ready(reply + build.message(b"N", b""))  # more after it
    assert not scanner.ends_at_ready(build.parameter_status("a", "b") + reply)  # watched
    assert not scanner.ends_at_ready(reply[3:])  # not at a message's start
    assert not MessageScanner(frozenset(b"SE")).ends_at_ready(reply)  # ReadyForQuery unwatched
    assert not MessageScanner(frozenset(b"ZSE"), max_size=8).ends_at_ready(reply)  # too long
    scanner.feed(reply[:3])  # a message begun
    assert not scanner.ends_at_ready(reply)


def test_one_whole_is_one_whole_message_at_a_boundary() -> None:
    query = build.query("select 1")
    scanner = MessageScanner(frozenset(b"QSX"), max_size=1000)
    assert scanner.one_whole(query, 0x51)
    assert not scanner.one_whole(query, 0x50)  # another type
    assert not scanner.one_whole(query[:-1], 0x51)  # cut short
    assert not scanner.one_whole(query + build.SYNC, 0x51)  # more after it
    assert not scanner.one_whole(build.query("x" * 1000), 0x51)  # past the packet size
    assert not MessageScanner(frozenset(b"SX")).one_whole(query, 0x51)  # not watched
    scanner.feed(build.query("select 2")[:7])  # a message begun
    assert not scanner.one_whole(query, 0x51)


def test_a_scanner_says_which_types_it_watches_and_with_bodies() -> None:
    """Kept as the shared tables only, the sets read back as given (bodies: watch's default)."""
    both = MessageScanner(frozenset({0x51, 0x58}), bodies=frozenset({0x51}))
    assert both.watch == {0x51, 0x58} and both.bodies == {0x51}
    alone = MessageScanner(frozenset({0x00, 0xFF}))
    assert alone.watch == alone.bodies == {0x00, 0xFF}


def test_a_lent_scanner_is_kept_only_while_a_message_is_cut() -> None:
    """A shared scanner lent to many owners: a cut message's state moves to a scanner of
    the owner's own and the shared one is left new; once whole again, the owner gives its
    own up. Another owner's feed in between sees none of it."""
    watch = frozenset({0x51})
    shared = shared_scanner(watch, 1000)
    assert shared_scanner(watch, 1000) is shared and shared.kept() is shared
    query = build.query("SELECT 1")
    assert shared.feed(query[:7]) == [] and shared.held == 7
    own = shared.kept()
    assert own is not shared and own.held == 7 and not own.at_boundary
    assert shared.at_boundary and shared.held == 0
    # another owner's whole Query, on the shared scanner meanwhile
    assert shared.feed(query) == [(0x51, b"SELECT 1\x00", len(query))]
    assert shared.kept() is shared
    assert own.feed(query[7:]) == [(0x51, b"SELECT 1\x00", len(query) - 7)]
    assert own.kept() is shared
    # a scanner of one owner alone is always kept as it is
    alone = MessageScanner(watch)
    alone.feed(query[:3])
    assert alone.kept() is alone


def test_a_bad_length_on_a_lent_scanner_stays_with_its_owner() -> None:
    shared = shared_scanner(frozenset({0x51}), 100)
    with pytest.raises(ProtocolViolation):
        shared.feed(b"Q\x00\x01\x00\x00")
    own = shared.kept()
    assert own is not shared and shared.at_boundary
    with pytest.raises(ProtocolViolation):
        own.feed(build.query("SELECT 1"))  # every later feed of its owner fails
    assert shared.feed(build.query("SELECT 1"))  # the others' do not


def test_to_boundary_says_where_the_message_begun_before_ends() -> None:
    query = build.query("SELECT 1")  # watched
    flush = build.message(b"H")  # not watched: skipped by length
    scanner = MessageScanner(frozenset({0x51}))
    assert scanner.to_boundary(query) == 0
    for watched, message in ((True, query), (False, build.message(b"E", b"\x00" * 9))):
        for cut in range(1, len(message)):
            scanner = MessageScanner(frozenset({0x51}))
            scanner.feed(message[:cut])
            rest = message[cut:] + flush
            assert scanner.to_boundary(rest) == len(message) - cut, (watched, cut)
            assert scanner.to_boundary(message[cut:-1] if cut < len(message) - 1 else b"") == -1
            # and feed agrees: the message ends there (a watched one is reported there)
            events = scanner.feed(rest)
            assert scanner.at_boundary
            if watched:
                assert events == [(0x51, query[5:], len(message) - cut)]
    bad = MessageScanner(frozenset({0x51}), max_size=100)
    bad.feed(b"Q\x00")
    assert bad.to_boundary(b"\x01\x00\x00") == -1  # a bad length: feed raises on it
