"""CancelRequests for another pgtarn of [peers]: sent on to it, at most pool_size at once.

Several pgtarn (or PgBouncer) instances behind one load balancer each hand out keys that
name their peer_id (proto/cancelkey.py). A client's CancelRequest opens a new connection,
which the balancer may give to another instance: that one sends the request on to the
instance the key names, over a new connection, with the key's TTL one less. The peer
closes the connection once it has dealt with the request; until then (or
cancel_wait_timeout) the forward counts as in flight, and a peer has at most its
pool_size of them: the rest wait their turn (SHOW PEER_POOLS). The client's own cancel
connection closes when the forward is over, as one to PostgreSQL does.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from time import monotonic
from typing import Any, cast

from ..config.settings import Config, PeerEntry
from ..proto import build
from ..proto.cancelkey import Key, forwarded, peer_of, ttl_of
from .sockets import Target, connect_to

log = logging.getLogger("pgtarn")

Spawn = Callable[[Coroutine[Any, Any, Any]], object]


class _ForwardOnce(asyncio.Protocol):
    """Sends one CancelRequest when connected; done when the peer closes."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


class PeerPool:
    """The cancels in flight to one peer, as SHOW PEER_POOLS counts them."""

    def __init__(self, peer_id: int) -> None:
        self.peer_id = peer_id
        self.waiting = 0  # waiting for a free slot (pool_size in flight already)
        self.connecting = 0  # connecting to the peer (sv_login)
        self.sent = 0  # sent, waiting for the peer to close (sv_active_cancel)
        self._turns: deque[asyncio.Future[None]] = deque()

    @property
    def in_flight(self) -> int:
        return self.connecting + self.sent

    async def forward(self, target: Target, request: bytes, size: int, timeout: float) -> None:
        """Send request to the peer at target, after waiting for a slot; all within timeout."""
        deadline = monotonic() + timeout
        while self.in_flight >= size:
            await self._wait_turn(deadline)
        self.connecting += 1
        forwarder = _ForwardOnce(request)
        try:
            await connect_to(target, lambda: forwarder, max(deadline - monotonic(), 0.001))
        except BaseException:
            self.connecting -= 1
            self._next()
            raise
        self.connecting -= 1
        self.sent += 1
        try:
            await asyncio.wait_for(forwarder.done, max(deadline - monotonic(), 0.001))
        finally:
            self.sent -= 1
            if forwarder.transport is not None:
                forwarder.transport.close()
            self._next()

    async def _wait_turn(self, deadline: float) -> None:
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        self.waiting += 1
        try:
            await asyncio.wait_for(turn, max(deadline - monotonic(), 0))
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._next()  # the turn came too late for this one: the next one's
            elif turn in self._turns:
                self._turns.remove(turn)
            raise
        finally:
            self.waiting -= 1

    def _next(self) -> None:
        """A slot is free: the first waiting forward goes."""
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(None)
                return


def _nothing() -> None:
    """A forward nobody waits for."""


class PeerCancels:
    """The peer pools of this pgtarn, by peer_id (made at a peer's first forward)."""

    def __init__(self) -> None:
        self.pools: dict[int, PeerPool] = {}

    def pool(self, peer_id: int) -> PeerPool:
        pool = self.pools.get(peer_id)
        if pool is None:
            pool = self.pools[peer_id] = PeerPool(peer_id)
        return pool

    def forward(
        self, key: Key, config: Config, spawn: Spawn, done: Callable[[], None] = _nothing
    ) -> bool:
        """A CancelRequest with a key that is not one of ours: send it on to the peer the
        key names, if that is a peer of [peers] other than us and the key may travel on
        (TTL > 0). False: dropped, as a key nobody knows. done is called when the forward is
        over (the peer closed, or it failed), at once when dropped."""
        peer_id = peer_of(key)
        peer = config.peers.get(peer_id)
        if peer is None or peer_id == config.peer_id or ttl_of(key) == 0:
            log.debug("cancel request for peer %d (TTL %d) dropped", peer_id, ttl_of(key))
            done()
            return False
        log.debug("cancel request for peer %d (TTL %d) forwarded", peer_id, ttl_of(key))
        spawn(self._forward(peer, forwarded(key), config, done))
        return True

    async def _forward(
        self, peer: PeerEntry, key: Key, config: Config, done: Callable[[], None]
    ) -> None:
        target = (peer.host or config.unix_socket_dir or "/tmp", peer.port)
        timeout = config.cancel_wait_timeout or config.server_connect_timeout
        try:
            await self.pool(peer.peer_id).forward(
                target, build.cancel_request(*key), config.peer_pool_size_for(peer), timeout
            )
        except (TimeoutError, OSError) as exc:
            log.warning(
                "cancel request to peer %d (%s:%s) failed: %s",
                peer.peer_id,
                *target,
                exc or f"cancel_wait_timeout ({timeout:g} s)",
            )
        finally:
            done()
