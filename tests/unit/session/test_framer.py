"""ClientFramer: statement messages come out whole, everything else passes as it arrives."""

from __future__ import annotations

import pytest

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.session.framer import SYNC_MARK, ClientFramer
from pgtarn.session.tracking import SessionState, SessionTracker

from .test_prepared import SYNC, bind, close, describe, parse


def test_client_framer_keeps_the_stream_for_every_cut() -> None:
    msgs = [
        parse("a", "select 1"),
        bind("a"),
        (0x45, b"\x00\x00\x00\x00\x00"),
        SYNC,
        (0x51, b"select 2\x00"),
        (0x64, b"copydata" * 4),
        describe("a"),
        close("a"),
        SYNC,
    ]
    stream = b"".join(build.message(bytes((t,)), b) for t, b in msgs)
    for cut1 in range(len(stream) + 1):
        for cut2 in range(cut1, len(stream) + 1, 3):
            framer = ClientFramer(10000)
            out = bytearray()
            syncs = marks = 0
            whole: list[tuple[int, bytes]] = []
            for chunk in (stream[:cut1], stream[cut1:cut2], stream[cut2:]):
                parts, n = framer.feed(chunk)
                syncs += n
                for part in parts:
                    if isinstance(part, int):
                        assert part == SYNC_MARK
                        marks += 1
                    elif isinstance(part, tuple):
                        whole.append(part)
                        out += build.message(bytes((part[0],)), part[1])
                    else:
                        out += part
            assert bytes(out) == stream, (cut1, cut2)
            assert syncs == marks == 3
            assert [t for t, _ in whole] == [0x50, 0x42, 0x44, 0x43]
    framer = ClientFramer(10000)
    parts, _ = framer.feed(build.query("select 1") + build.TERMINATE + b"junk")
    assert framer.terminated and parts[-1] == SYNC_MARK


def test_nothing_after_a_terminate_is_read_even_a_bad_length_in_the_same_chunk() -> None:
    framer = ClientFramer(100)
    parts, syncs = framer.feed(build.SYNC + build.TERMINATE + b"d\xff\xff\xff\xff")
    assert framer.terminated and not framer.whole
    assert parts == [build.SYNC, SYNC_MARK] and syncs == 1


def test_a_large_passed_on_message_is_never_held_while_a_split_parse_is() -> None:
    framer = ClientFramer(100_000)
    copy_data = build.message(b"d", b"x" * 50_000)
    parts, _ = framer.feed(copy_data[:1000])
    assert parts == [copy_data[:1000]] and framer.held == 0 and framer.whole
    parts, _ = framer.feed(copy_data[1000:])
    assert parts == [copy_data[1000:]] and framer.idle
    msg = build.message(b"P", parse("a", "select 1")[1])
    parts, _ = framer.feed(msg[:7])
    assert parts == [] and framer.held == 7 and not framer.whole
    parts, _ = framer.feed(msg[7:])
    assert parts == [parse("a", "select 1")] and framer.idle


def test_a_bad_length_fails_this_feed_and_every_later_one() -> None:
    framer = ClientFramer(100)
    with pytest.raises(ProtocolViolation, match="invalid message length 2 for message type 'P'"):
        framer.feed(b"P\x00\x00\x00\x02")
    with pytest.raises(ProtocolViolation):
        framer.feed(build.SYNC)


class ListenHook:
    """The session-state hook of a client whose LISTENs pgtarn answers: each is dropped."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bytes, int]] = []

    def __call__(self, msg_type: int, body: bytes, replies_ahead: int) -> bytes | None:
        self.calls.append((msg_type, body, replies_ahead))
        return b"" if body.startswith(b"LISTEN") else None


def watched_framer() -> tuple[ClientFramer, ListenHook]:
    framer = ClientFramer(10000)
    hook = ListenHook()
    framer.watch(SessionTracker(SessionState()), hook)
    return framer, hook


def test_a_query_the_hook_answers_is_dropped_and_counts_one_ready_for_query() -> None:
    framer, hook = watched_framer()
    listen = build.query("LISTEN a")
    data = build.query("select 1") + listen + build.parse("s", "select 2") + build.SYNC
    parts, syncs = framer.feed(data, 2)
    assert parts == [
        build.query("select 1"),
        SYNC_MARK,
        parse("s", "select 2"),
        build.SYNC,
        SYNC_MARK,
    ]
    assert syncs == 3  # the LISTEN's ReadyForQuery comes from pgtarn, in its place
    # the hook heard of the LISTEN with the ReadyForQuery owed before its own
    assert hook.calls == [(0x51, listen[5:], 3)]
    assert not framer.whole and framer.idle


def test_a_dropped_query_split_across_chunks() -> None:
    framer, hook = watched_framer()
    listen = build.query("LISTEN a")
    parts, syncs = framer.feed(build.SYNC + listen[:7])
    assert parts == [build.SYNC, SYNC_MARK] and syncs == 1 and hook.calls == []
    parts, syncs = framer.feed(listen[7:] + build.SYNC, 1)
    assert parts == [build.SYNC, SYNC_MARK] and syncs == 2
    assert hook.calls == [(0x51, listen[5:], 1)]
    assert not framer.whole


def test_a_chunk_of_only_a_dropped_query_gives_no_parts() -> None:
    framer, _hook = watched_framer()
    parts, syncs = framer.feed(build.query("LISTEN a"))
    assert parts == [] and syncs == 1 and framer.plain
