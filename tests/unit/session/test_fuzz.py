"""Property-based fuzzing of ClientFramer: any stream, cut anywhere, comes out the same."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.session.framer import SYNC_MARK, ClientFramer, Part
from pgtarn.session.sqlnames import may_name_statements

FUZZ = settings(max_examples=150, deadline=None, database=None)
MAX_SIZE = 600

Message = tuple[int, bytes]
#: One item of a framer's output, bytes split into single bytes so outputs compare as prefixes.
Token = int | tuple[int, bytes] | str

SQL = [
    b"select 1",
    b"PREPARE s AS select $1",
    b"EXECUTE s(1)",
    b"DEALLOCATE s",
    b"DEALLOCATE ALL",
    b"select 1; execute s",
    b"explain execute s",
    b"/* x */ prepare t as",
    b"create table t()",
    b"begin",
    b"",
    b"select ';execute s'",
]

query_bodies = st.one_of(
    st.sampled_from(SQL), st.binary(max_size=40).map(lambda b: b.replace(b"\x00", b""))
).map(lambda sql: sql + b"\x00")
statement_bodies = st.binary(max_size=80)
plain_types = st.sampled_from(list(b"EHSdcfFp"))

message = st.one_of(
    st.tuples(st.sampled_from(list(b"PBDC")), statement_bodies),
    st.tuples(st.just(ord("Q")), query_bodies),
    st.tuples(st.just(ord("S")), st.just(b"")),
    st.tuples(plain_types, st.binary(max_size=MAX_SIZE - 4)),
)
streams = st.lists(message, max_size=25)
cuts = st.lists(st.integers(0, 20_000), max_size=15)


def chunked(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(marks)] or [b""]


def encode(msgs: list[Message]) -> bytes:
    return b"".join(build.message(bytes((t,)), body) for t, body in msgs)


def reencode(parts: list[Part]) -> bytes:
    return b"".join(
        build.message(bytes((p[0],)), p[1]) if isinstance(p, tuple) else p
        for p in parts
        if not isinstance(p, int)
    )


class Run:
    """Feeds a framer chunk by chunk and checks what must hold after every feed."""

    def __init__(self, max_size: int = MAX_SIZE) -> None:
        self.framer = ClientFramer(max_size)
        self.tokens: list[Token] = []
        self.syncs = 0
        self.fed = 0
        self.stream = bytearray()  # everything fed so far
        self.out_len = 0  # bytes given out: raw, or whole messages re-encoded
        self.error: ProtocolViolation | None = None

    def feed_all(self, chunks: list[bytes]) -> Run:
        for chunk in chunks:
            if self.framer.terminated:
                break  # the connection closes at a Terminate
            try:
                parts, syncs = self.framer.feed(chunk)
            except ProtocolViolation as error:
                self.error = error
                break
            self.check(chunk, parts, syncs)
        return self

    def check(self, chunk: bytes, parts: list[Part], syncs: int) -> None:
        framer = self.framer
        self.fed += len(chunk)
        self.stream += chunk
        assert syncs == sum(1 for p in parts if isinstance(p, int)) + sum(
            1 for p in parts if isinstance(p, tuple) and p[0] == ord("Q")
        )
        self.syncs += syncs
        if framer.whole:
            assert reencode(parts) == chunk
        assert framer.plain == all(not isinstance(p, tuple) for p in parts)
        for part in parts:
            if isinstance(part, int):
                assert part == SYNC_MARK
                self.tokens.append("sync")
            elif isinstance(part, tuple):
                assert part[0] in b"PBDCQ"
                self.tokens.append(part)
                self.out_len += 5 + len(part[1])
            else:
                assert part, "an empty bytes part"
                self.tokens.extend(part)
                self.out_len += len(part)
        # bounded: at most one incomplete message, its type byte and length included
        assert framer.held <= framer.max_size + 1
        if framer.held >= 5:  # a whole header is in: only a watched message is held back
            assert self.stream[-framer.held] in b"PBDCQSX"
        if not framer.terminated:
            assert self.out_len + framer.held == self.fed

    def output(self) -> bytes:
        out = bytearray()
        for t in self.tokens:
            if isinstance(t, int):
                out.append(t)
            elif isinstance(t, tuple):
                out += build.message(bytes((t[0],)), t[1])
        return bytes(out)


def expected_tokens(msgs: list[Message]) -> list[Token]:
    """What a framer must produce for whole messages, whatever the chunking."""
    tokens: list[Token] = []
    for t, body in msgs:
        if t == ord("X"):
            break
        if t in b"PBDC" or (t == ord("Q") and may_name_statements(body)):
            tokens.append((t, body))
            continue
        tokens.extend(build.message(bytes((t,)), body))
        if t in b"SQ":
            tokens.append("sync")
    return tokens


@FUZZ
@given(msgs=streams, terminate=st.booleans(), after=streams, cuts_a=cuts, cuts_b=cuts)
def test_valid_streams_come_out_the_same_for_any_two_cuttings(
    msgs: list[Message],
    terminate: bool,
    after: list[Message],
    cuts_a: list[int],
    cuts_b: list[int],
) -> None:
    stream_msgs = msgs + ([(ord("X"), b""), *after] if terminate else [])
    stream = encode(stream_msgs)
    a = Run().feed_all(chunked(stream, cuts_a))
    b = Run().feed_all(chunked(stream, cuts_b))
    assert a.error is None and b.error is None
    assert a.tokens == b.tokens == expected_tokens(stream_msgs)
    assert a.syncs == b.syncs == sum(1 for t, _ in msgs if t in b"SQ")
    assert a.output() == stream[: len(encode(msgs))]
    assert a.framer.terminated == terminate and a.framer.idle == (not terminate)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(out)))
        kind = draw(st.sampled_from(["flip", "cut", "insert", "length", "type", "truncate"]))
        if kind == "flip" and pos < len(out):
            out[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del out[pos : pos + draw(st.integers(1, 8))]
        elif kind == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=6))
        elif kind == "length":
            out[pos : pos + 4] = draw(
                st.one_of(st.integers(0, 2**32 - 1), st.integers(0, MAX_SIZE + 8))
            ).to_bytes(4, "big")
        elif kind == "type" and pos < len(out):
            out[pos] = draw(st.sampled_from(list(b"PBDCQSXEHd")))
        else:
            del out[pos:]
    return bytes(out)


@FUZZ
@given(data=st.data(), msgs=streams.filter(bool), points=cuts)
def test_garbled_streams_raise_only_protocol_violation_and_agree_with_a_byte_by_byte_run(
    data: st.DataObject, msgs: list[Message], points: list[int]
) -> None:
    stream = data.draw(mutated(encode(msgs)))
    reference = Run().feed_all([stream[i : i + 1] for i in range(len(stream))])
    run = Run().feed_all(chunked(stream, points))  # anything but ProtocolViolation escapes
    assert (run.error is None) == (reference.error is None)
    assert run.framer.terminated == reference.framer.terminated
    if run.error is None:
        assert run.tokens == reference.tokens
    else:  # the parts of the feed that failed are lost
        assert run.tokens == reference.tokens[: len(run.tokens)]
    assert stream.startswith(run.output())


def bad_lengths() -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, 3),
        st.integers(MAX_SIZE + 1, 2**32 - 1),
        st.sampled_from([MAX_SIZE + 1, 2**31, 2**32 - 1]),
    )


@FUZZ
@given(
    msgs=streams,
    bad_type=st.sampled_from(list(b"PBDCQSEHdX")),
    length=bad_lengths(),
    tail=st.binary(max_size=30),
    points=cuts,
)
def test_a_bad_length_is_refused_once_its_header_is_in_and_the_framer_stays_failed(
    msgs: list[Message], bad_type: int, length: int, tail: bytes, points: list[int]
) -> None:
    prefix = encode(msgs)
    stream = prefix + bytes((bad_type,)) + length.to_bytes(4, "big") + tail
    header_end = len(prefix) + 5
    run = Run()
    for chunk in chunked(stream, points):
        before = run.fed
        run.feed_all([chunk])
        if run.error is not None:
            assert before < header_end <= before + len(chunk)
            break
        assert run.fed < header_end, "a bad length went unnoticed"
    assert run.error is not None
    assert run.tokens == expected_tokens(msgs)[: len(run.tokens)]
    for more in (b"S", tail or b"x", encode(msgs) or b"Q"):
        with pytest.raises(ProtocolViolation):
            run.framer.feed(more)
        assert run.framer.held <= 5


def test_regression_framer_stays_failed_after_a_bad_length() -> None:
    # The next chunk used to be framed as if it began a message.
    framer = ClientFramer(100)
    with pytest.raises(ProtocolViolation):
        framer.feed(build.SYNC + b"d\x00\x00\x10\x00")
    with pytest.raises(ProtocolViolation):
        framer.feed(build.query("select 1"))
    assert framer.held == 5
