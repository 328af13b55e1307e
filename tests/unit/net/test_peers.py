"""Tests for pgtarn.net.peers: which CancelRequests go to a peer, and at most pool_size at once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from pgtarn.config.settings import Config, PeerEntry
from pgtarn.net.peers import PeerCancels, PeerPool
from pgtarn.proto import build
from pgtarn.proto.cancelkey import forwarded, make_key


def _config(peer_id: int, peers: dict[int, PeerEntry]) -> Config:
    return replace(Config(), peer_id=peer_id, peers=MappingProxyType(peers))


def test_which_keys_are_forwarded() -> None:
    config = _config(1, {2: PeerEntry(2, "127.0.0.1", 1), 1: PeerEntry(1, "127.0.0.1", 1)})
    spawned: list[Coroutine[Any, Any, Any]] = []
    cancels = PeerCancels()
    key = make_key(2, None)
    assert cancels.forward(key, config, spawned.append)
    assert not cancels.forward(make_key(1, None), config, spawned.append)  # ours
    assert not cancels.forward(make_key(3, None), config, spawned.append)  # no such peer
    spent = forwarded(forwarded(forwarded(key)))
    assert not cancels.forward(spent, config, spawned.append)  # no TTL left
    assert len(spawned) == 1
    for coro in spawned:
        coro.close()


async def _held_server(received: list[bytes], release: asyncio.Event) -> asyncio.Server:
    """A peer that keeps each cancel connection open until release is set."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readexactly(16))
        await release.wait()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_pool_size_limits_cancels_in_flight() -> None:
    async def main() -> None:
        received: list[bytes] = []
        release = asyncio.Event()
        server = await _held_server(received, release)
        port = server.sockets[0].getsockname()[1]
        pool = PeerPool(2)
        requests = [build.cancel_request(7, n) for n in range(3)]
        tasks = [asyncio.create_task(pool.forward(("127.0.0.1", port), r, 1, 10)) for r in requests]
        while len(received) < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert (pool.sent, pool.connecting, pool.waiting) == (1, 0, 2)
        assert received == requests[:1]
        release.set()
        await asyncio.gather(*tasks)
        assert received == requests  # in order, one at a time
        assert (pool.sent, pool.connecting, pool.waiting) == (0, 0, 0)
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_forward_gives_up_after_the_timeout() -> None:
    async def main() -> None:
        received: list[bytes] = []
        release = asyncio.Event()  # set only once the forwards gave up
        server = await _held_server(received, release)
        port = server.sockets[0].getsockname()[1]
        pool = PeerPool(2)
        first = asyncio.create_task(pool.forward(("127.0.0.1", port), b"x" * 16, 1, 0.3))
        second = asyncio.create_task(pool.forward(("127.0.0.1", port), b"y" * 16, 1, 0.3))
        for task in (first, second):
            with pytest.raises(TimeoutError):
                await task
        assert (pool.sent, pool.connecting, pool.waiting) == (0, 0, 0)
        assert received == [b"x" * 16]
        release.set()
        await asyncio.sleep(0.05)  # the handler closes its side
        server.close()
        await server.wait_closed()

    asyncio.run(main())
