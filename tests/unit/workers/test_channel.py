"""workers/channel.py: a channel sees the other process go, even when it went with bytes of
ours unread, right behind a last message (uvloop's reader reports that reset only once)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop

from pgtarn.workers.channel import Channel
from pgtarn.workers.wire import Message, encode

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


@pytest.mark.parametrize("loop_kind", sorted(LOOPS))
def test_a_peer_gone_behind_its_last_message_closes_the_channel(loop_kind: str) -> None:
    ours, theirs = socket.socketpair()
    got: list[Message] = []
    closed: list[Channel] = []

    async def main() -> None:
        channel = Channel(ours, lambda _c, message, _fds: got.append(message), closed.append)
        channel.send({"kind": "never read"})  # left unread: the peer's close is a reset
        await asyncio.sleep(0.02)
        theirs.sendall(encode({"kind": "last words"}))
        theirs.close()
        for _ in range(200):
            if closed:
                return
            await asyncio.sleep(0.005)

    loop = LOOPS[loop_kind]()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert got == [{"kind": "last words"}]
    assert len(closed) == 1
