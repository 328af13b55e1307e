"""A server's reply too long to hold, taken in pieces (server/longreply.py): its head decides
whether it goes on or is dropped as it comes; other types are gathered whole."""

from __future__ import annotations

import pytest

from pgtarn.proto import build
from pgtarn.proto.framing import HEAD_SIZE
from pgtarn.server.longreply import LongReply

LONG = 300_000
ERROR = build.error_response("P0001", "z" * LONG)
AFTER = build.ready_for_query(b"I")


def run(message: bytes, size: int, replacement: bytes | None) -> tuple[bytes, bytes, list[bytes]]:
    """Feed message + AFTER in chunks of size: (what went to the client, the bytes left to
    relay as usual, the heads decided on)."""
    heads: list[bytes] = []

    def decide(msg_type: int, body: bytes) -> bytes | None:
        assert msg_type == message[0]
        heads.append(body)
        return replacement

    data = message + AFTER
    long_reply = LongReply(data[:5], decide)
    out = bytearray()
    rest = b""
    at = 0
    while not long_reply.done:
        sent, rest = long_reply.feed(data[at : at + size])
        out += sent
        at += size
    return bytes(out), rest + data[at:], heads


@pytest.mark.parametrize("size", [1, 5, 8197, 8198, 65536, LONG * 2])
def test_a_head_passed_on_the_message_goes_on_whole_and_what_follows_is_left(size: int) -> None:
    out, rest, heads = run(ERROR, size, None)
    assert out == ERROR and rest == AFTER
    assert heads == [ERROR[5 : 5 + HEAD_SIZE]]


@pytest.mark.parametrize("size", [1, 8197, 65536, LONG * 2])
def test_a_head_replaced_drops_the_rest_as_it_comes(size: int) -> None:
    out, rest, heads = run(ERROR, size, b"E-in-its-place")
    assert out == b"E-in-its-place" and rest == AFTER and len(heads) == 1


@pytest.mark.parametrize("size", [1, 65536, LONG * 2])
def test_another_type_is_gathered_whole_and_relayed_as_usual(size: int) -> None:
    """(A ParameterDescription of 65535 parameters is longer than the smallest buffer.)"""
    description = build.message(b"t", (2).to_bytes(2, "big") + b"\x00" * LONG)
    out, rest, heads = run(description, size, None)
    assert out == b"" and rest == description + AFTER and heads == []
