"""A pool's replication servers: counted in its pool_size, their clients queued when it is full.

A replication client (``replication=true`` or ``database``) gets a server of its own, never
lent to anyone else (server/replication.py). As in PgBouncer, that server still takes a place
of its pool: ``server_count`` counts it, so it counts in ``pool_size`` (and, through the
registry, in ``max_db_connections`` and ``max_user_connections``). When the pool has no room,
the least recently used idle server is closed ("evicted") to make one; with no idle server
the client waits, first come first served, until a server of the pool is gone. The janitor
gives up on it after ``query_wait_timeout``, or at once when the pool refuses waiting
clients (shutdown). While the pool is paused, waiting clients stay queued.

With ``workers = N`` the room is that of the worker's own pool: the slots the workers share
are asked for by waiting normal clients only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..errors import PgtarnError
from .pool import Pool, PooledServer
from .waits import WAIT_TIMEOUT

S = TypeVar("S", bound=PooledServer)


class ReplicationWaiter(Protocol):
    """A replication client waiting for room in its pool."""

    def server_unavailable(self, error: PgtarnError) -> None: ...


class ReplicationServers(Generic[S]):
    """The replication servers of one pool, and the replication clients waiting for room."""

    __slots__ = ("pool", "servers", "waiting")

    def __init__(self, pool: Pool[S]) -> None:
        self.pool = pool
        #: Logging in or streaming: each counts in the pool's server_count.
        self.servers: set[S] = set()
        #: (client, how to open its server, when it began to wait), oldest first; as long as
        #: the pool's clients (max_client_conn bounds it).
        self.waiting: deque[tuple[ReplicationWaiter, Callable[[], S], float]] = deque()

    def __len__(self) -> int:
        """Its servers (in its pool's server_count)."""
        return len(self.servers)

    def request(self, waiter: ReplicationWaiter, open_server: Callable[[], S]) -> None:
        """waiter logged in: its server is opened (open_server) now if there is room, else
        when some comes."""
        pool = self.pool
        if pool.refusal is not None:
            waiter.server_unavailable(pool.refusal)
            return
        self.waiting.append((waiter, open_server, pool.clock()))
        self.serve()

    def serve(self) -> None:
        """Open the servers of the waiting clients while there is room or an idle server to
        evict for it."""
        pool = self.pool
        while self.waiting and not pool.paused:
            if not self._room():
                if not pool.idle:
                    return
                # the least recently used one (PgBouncer's eviction for replication)
                pool.idle.pop(0).close("evicted", wait=pool.gate is not None)
                continue
            _waiter, open_server, _since = self.waiting.popleft()
            self.servers.add(open_server())

    def _room(self) -> bool:
        pool = self.pool
        if pool.server_count >= pool.pool_size:
            return False
        # max_db_connections / max_user_connections (the workers' slots are not for these)
        return pool.gate is not None or pool.may_open(pool)

    def gone(self, server: S) -> None:
        """One of its servers is gone (closed, or its login failed): room for the next."""
        if server in self.servers:
            self.servers.discard(server)
            self.serve()

    def cancel(self, waiter: object) -> None:
        """waiter left while waiting."""
        if self.waiting:
            self.waiting = deque(entry for entry in self.waiting if entry[0] is not waiter)

    def tick(self, now: float) -> None:
        """The janitor's visit: the pool's refusal or query_wait_timeout for those waiting,
        then room for the others (servers that went idle meanwhile can be evicted)."""
        if not self.waiting:
            return
        pool = self.pool
        error = pool.refusal
        limit = pool.wait_timeout
        if error is None and limit > 0 and now - self.waiting[0][2] > limit:
            error = PgtarnError(WAIT_TIMEOUT.format(limit), sqlstate="08P01", severity="FATAL")
        if error is not None:
            since = now - limit if pool.refusal is None else float("inf")
            while self.waiting and self.waiting[0][2] <= since:
                self.waiting.popleft()[0].server_unavailable(error)
        self.serve()


def replication_of(pool: Pool[S]) -> ReplicationServers[S]:
    """pool's replication servers (made at its first replication client)."""
    servers = pool.replication
    if isinstance(servers, ReplicationServers):  # (the pool holds it as a state.ReplicationLink)
        return servers
    made = ReplicationServers(pool)
    pool.replication = made
    return made
