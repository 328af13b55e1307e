"""Control message framing: whole messages out of any cut, descriptors in order, bad input."""

from __future__ import annotations

import pytest

from pgtarn.workers.wire import MAX_MESSAGE, MessageReader, WireError, encode


def test_messages_come_out_whole_whatever_the_cuts() -> None:
    data = encode({"kind": "a", "n": 1}) + encode({"kind": "b", "text": "é" * 100})
    for cut in range(len(data) + 1):
        reader = MessageReader()
        out = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [m for m, _ in out] == [{"kind": "a", "n": 1}, {"kind": "b", "text": "é" * 100}]


def test_descriptors_go_to_their_messages_in_order() -> None:
    reader = MessageReader()
    out = reader.feed(
        encode({"kind": "x", "fds": 2}) + encode({"kind": "y"}) + encode({"kind": "z", "fds": 1}),
        [7, 8, 9],
    )
    assert [(m["kind"], fds) for m, fds in out] == [("x", [7, 8]), ("y", []), ("z", [9])]


def test_a_message_naming_descriptors_that_did_not_come_is_an_error() -> None:
    with pytest.raises(WireError):
        MessageReader().feed(encode({"kind": "x", "fds": 1}))


@pytest.mark.parametrize(
    "data",
    [
        (MAX_MESSAGE + 1).to_bytes(4, "big"),
        (3).to_bytes(4, "big") + b"{{{",
        (2).to_bytes(4, "big") + b"[]",
    ],
)
def test_bad_input_is_an_error(data: bytes) -> None:
    with pytest.raises(WireError):
        MessageReader().feed(data)


def test_pending_descriptors_are_closed_when_the_channel_ends() -> None:
    reader = MessageReader()
    reader.feed(b"", [3, 4])
    closed: list[int] = []
    reader.close_pending(closed.append)
    assert closed == [3, 4]
