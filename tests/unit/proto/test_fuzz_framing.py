"""Property-based fuzzing of framing and startup parsing: any bytes, any chunking, bounded."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner, StartupReader
from pgtarn.proto.messages import (
    CANCEL_REQUEST,
    GSSENC_REQUEST,
    SSL_REQUEST,
    StartupPacket,
    parse_startup,
    read_startup,
)

from .fuzzing import (
    FUZZ,
    Message,
    bad_lengths,
    chunked,
    cuts,
    encode,
    message_types,
    messages,
    mutated,
    names,
)

# --- MessageScanner ------------------------------------------------------------------------


class Holdback:
    """A caller that forwards what a scanner lets go: released + chunk[:len - held], with
    watched messages that began in an earlier chunk rebuilt from their body (as server/relay.py).

    Only a scanner that gives every watched message's body can be used so; with counted
    types, `out` is not kept.
    """

    def __init__(self, scanner: MessageScanner) -> None:
        self.scanner = scanner
        self.out = bytearray()
        self.events: list[Message] = []
        self.rebuilds = scanner.watch <= scanner.bodies

    def feed(self, chunk: bytes) -> None:
        scanner = self.scanner
        events = scanner.feed(chunk)
        assert len(scanner._buf) <= scanner.max_size + 1, "scanner buffer is unbounded"
        assert 0 <= scanner.held <= len(chunk)
        self.out += scanner.released
        start = 0
        for msg_type, body, end in events:
            assert 0 < end <= len(chunk)
            self.events.append((msg_type, body))
            if not self.rebuilds:
                continue
            if end - 5 - len(body) < 0:
                self.out += build.message(bytes((msg_type,)), body)
                start = end
            elif msg_type in scanner.bodies:
                assert chunk[end - len(body) : end] == body
        self.out += chunk[start : len(chunk) - scanner.held]


@FUZZ
@given(
    msgs=messages,
    points=cuts,
    watch=st.sets(message_types),
    counted=st.one_of(st.just(set()), st.sets(message_types)),
)
def test_scanner_reports_watched_messages_and_holds_back_only_partial_ones(
    msgs: list[Message], points: list[int], watch: set[int], counted: set[int]
) -> None:
    stream = encode(msgs)
    bodies = frozenset(watch - counted)
    max_size = max([len(b) + 4 for _, b in msgs], default=4)
    holder = Holdback(MessageScanner(frozenset(watch), max_size, bodies))
    for chunk in chunked(stream, points):
        holder.feed(chunk)
    assert holder.events == [(t, b if t in bodies else b"") for t, b in msgs if t in watch]
    if holder.rebuilds:
        assert bytes(holder.out) == stream
    assert holder.scanner.at_boundary


@FUZZ
@given(
    data=st.data(),
    msgs=messages,
    tail=st.binary(max_size=40),
    points=cuts,
    watch=st.sets(message_types),
    bad_type=message_types,
    max_size=st.sampled_from([200, 10_000, 2**31 - 1]),
)
def test_scanner_refuses_bad_lengths_exactly_when_the_header_is_complete(
    data: st.DataObject,
    msgs: list[Message],
    tail: bytes,
    points: list[int],
    watch: set[int],
    bad_type: int,
    max_size: int,
) -> None:
    msgs = [(t, b) for t, b in msgs if len(b) + 4 <= max_size]
    length = data.draw(bad_lengths(max_size))
    prefix = encode(msgs)
    stream = prefix + bytes((bad_type,)) + length.to_bytes(4, "big") + tail
    holder = Holdback(MessageScanner(frozenset(watch), max_size))
    header_end = len(prefix) + 5
    fed = 0
    raised = False
    for chunk in chunked(stream, points):
        try:
            holder.feed(chunk)
        except ProtocolViolation:
            raised = True
            assert fed < header_end <= fed + len(chunk), "refused before the header was complete"
            break
        fed += len(chunk)
        assert fed < header_end, "a bad length went unnoticed"
        assert holder.events == [(t, b) for t, b in msgs if t in watch][: len(holder.events)]
    assert raised
    # The scanner stays failed: later chunks raise again and nothing is buffered for them.
    for more in (b"", b"Z\x00\x00\x00\x05I", tail):
        with pytest.raises(ProtocolViolation):
            holder.scanner.feed(more)
        assert len(holder.scanner._buf) <= 5


def byte_by_byte(scanner: MessageScanner, stream: bytes) -> tuple[list[Message], bool]:
    """The reference: one byte per feed, so an error loses no event of an earlier message."""
    events: list[Message] = []
    try:
        for i in range(len(stream)):
            events += [(t, b) for t, b, _ in scanner.feed(stream[i : i + 1])]
    except ProtocolViolation:
        return events, True
    return events, False


@FUZZ
@given(
    data=st.data(),
    msgs=messages.filter(bool),
    points=cuts,
    watch=st.sets(message_types),
    max_size=st.sampled_from([64, 2**31 - 1]),
)
def test_scanner_on_mutated_streams_agrees_with_itself_whatever_the_chunking(
    data: st.DataObject,
    msgs: list[Message],
    points: list[int],
    watch: set[int],
    max_size: int,
) -> None:
    stream = data.draw(mutated(encode(msgs)))
    expected, expect_error = byte_by_byte(MessageScanner(frozenset(watch), max_size), stream)
    holder = Holdback(MessageScanner(frozenset(watch), max_size))
    raised = False
    try:
        for chunk in chunked(stream, points):
            holder.feed(chunk)
    except ProtocolViolation:
        raised = True
    assert raised == expect_error
    if raised:
        assert holder.events == expected[: len(holder.events)]
    else:
        assert holder.events == expected
        # whatever was garbled, what was let go is the stream, less what is still held back
        assert stream.startswith(bytes(holder.out))
        assert len(holder.out) + len(holder.scanner._buf) == len(stream)


# --- StartupReader and parse_startup -------------------------------------------------------

values = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=20
)
params_st = st.dictionaries(names, values, max_size=6)


def startup_body(code: int, params: dict[str, str]) -> bytes:
    return (
        struct.pack("!I", code)
        + b"".join(build.cstr(k) + build.cstr(v) for k, v in params.items())
        + b"\x00"
    )


@FUZZ
@given(params=params_st, trailing=st.binary(max_size=50), points=cuts)
def test_startup_reader_round_trips_and_stays_bounded(
    params: dict[str, str], trailing: bytes, points: list[int]
) -> None:
    packet = build.startup_message(params)
    reader = StartupReader(max_size=len(packet) + 10)
    body = None
    rest = b""
    for chunk in chunked(packet + trailing, points):
        if body is not None:
            rest += chunk
            continue
        body, left = reader.feed(chunk)
        rest += left
        assert len(reader._buf) < reader.max_size
    assert body == packet[4:]
    assert rest == trailing
    assert parse_startup(body).params == params


@FUZZ
@given(
    data=st.data(),
    tail=st.binary(max_size=60),
    points=cuts,
    max_size=st.sampled_from([8, 100, 10_000]),
)
def test_startup_reader_refuses_bad_lengths_and_stays_failed_and_bounded(
    data: st.DataObject, tail: bytes, points: list[int], max_size: int
) -> None:
    length = data.draw(st.one_of(st.integers(0, 7), bad_lengths(max_size)))
    reader = StartupReader(max_size)
    fed = 0
    with pytest.raises(ProtocolViolation):
        for chunk in chunked(length.to_bytes(4, "big") + tail, points):
            assert reader.feed(chunk) == (None, b"")
            fed += len(chunk)
            assert fed < 4, "a bad startup length went unnoticed"
    for more in (b"", tail, b"\x00" * 5000):
        with pytest.raises(ProtocolViolation):
            reader.feed(more)
        assert len(reader._buf) <= max(max_size, 4), "a failed reader keeps buffering"


codes = st.one_of(
    st.sampled_from([0x30000, 0x30001, 0x30002, 0x20000, 0x40000, 0x1234_5678, 0, 2**32 - 1]),
    st.integers(0, 2**32 - 1),
).filter(lambda c: c not in (SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST))


@FUZZ
@given(code=codes, params=params_st, data=st.data())
def test_parse_startup_round_trips_any_version_and_refuses_every_truncation(
    code: int, params: dict[str, str], data: st.DataObject
) -> None:
    body = startup_body(code, params)
    parsed = parse_startup(body)
    assert (parsed.code, parsed.major, parsed.minor) == (code, code >> 16, code & 0xFFFF)
    assert parsed.params == params and parsed.cancel_key is None
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(ProtocolViolation):  # without its final NUL, no prefix is a packet
        parse_startup(body[:cut])


def garbled_startups(code: int, params: dict[str, str]) -> st.SearchStrategy[bytes]:
    """Startup bodies with code that are not well formed: params' body mutated, random bytes,
    and a few known bad ones (invalid UTF-8, a string not terminated)."""
    return st.one_of(
        mutated(startup_body(code, params)),
        st.binary(max_size=80).map(lambda b: struct.pack("!I", code) + b),
        st.sampled_from([b"\xff\xfe\x00v\x00\x00", b"user\x00\xc3\x28\x00\x00", b"a\x00b"]).map(
            lambda b: struct.pack("!I", code) + b
        ),
    )


@FUZZ
@given(
    code=st.one_of(codes, st.sampled_from([SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST])),
    params=params_st,
    data=st.data(),
)
def test_parse_startup_on_garbled_bodies_raises_only_protocol_violation(
    code: int, params: dict[str, str], data: st.DataObject
) -> None:
    body = data.draw(garbled_startups(code, params))
    try:
        parsed = parse_startup(body)
    except ProtocolViolation:
        return
    assert parsed.code == struct.unpack_from("!I", body)[0]
    if parsed.code == CANCEL_REQUEST:
        assert parsed.cancel_key == struct.unpack_from("!II", body, 4)
    else:
        assert all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in parsed.params.items()
        )
        if parsed.code not in (SSL_REQUEST, GSSENC_REQUEST):
            assert b"\x00" in body[4:]  # a packet with parameters needs its terminator


def _startup_outcome(read: Callable[[bytes], StartupPacket], body: bytes) -> object:
    try:
        parsed = read(body)
    except ProtocolViolation as exc:
        return str(exc)
    return parsed.code, parsed.params, parsed.cancel_key


@FUZZ
@given(
    code=st.one_of(st.just(0x30000), codes, st.sampled_from([SSL_REQUEST, CANCEL_REQUEST])),
    params=params_st,
    data=st.data(),
)
def test_parse_startup_reads_as_the_pure_reading(
    code: int, params: dict[str, str], data: st.DataObject
) -> None:
    # the compiled build's parse_startup reads the usual message in C (native/_startup.c)
    # and leaves any other to read_startup: the same parameters, or the same error
    body = data.draw(st.one_of(st.just(startup_body(code, params)), garbled_startups(code, params)))
    assert _startup_outcome(parse_startup, body) == _startup_outcome(read_startup, body)


def test_parse_startup_reads_texts_seen_before_as_sent() -> None:
    # the C reading keeps the short texts it saw last by a hash of their bytes: texts again,
    # texts that share a slot, texts of the same length, and one past the kept size
    texts = [f"v{i}" for i in range(300)] + ["x" * 64, "x" * 65, "é", "e", "", "v1"]
    for _ in range(2):
        for i, text in enumerate(texts):
            params = {"user": text, "database": texts[-i - 1], "application_name": "app"}
            assert parse_startup(startup_body(0x30000, params)).params == params


# --- regressions found by the properties above ---------------------------------------------


def test_regression_scanner_stays_failed_after_a_bad_length() -> None:
    # After a bad length found mid-chunk, the next chunk used to be scanned as if it began a
    # message.
    scanner = MessageScanner(frozenset(b"Z"), max_size=100)
    with pytest.raises(ProtocolViolation):
        scanner.feed(build.SYNC + b"D\xff\xff\xff\xff")
    with pytest.raises(ProtocolViolation):
        scanner.feed(build.ready_for_query(b"I"))
    assert len(scanner._buf) == 5


def test_regression_startup_reader_does_not_buffer_after_a_bad_length() -> None:
    reader = StartupReader(max_size=100)
    with pytest.raises(ProtocolViolation):
        reader.feed(b"\x00\x00\x00\x04")
    for _ in range(3):
        with pytest.raises(ProtocolViolation):
            reader.feed(b"x" * 100_000)
    assert len(reader._buf) == 4
