"""Tests for pgtarn.pool.replication: replication servers in pool_size, queueing, eviction."""

from __future__ import annotations

from pgtarn.errors import PgtarnError
from pgtarn.pool.pool import Pool
from pgtarn.pool.replication import ReplicationServers, replication_of

from .test_pool import FakeClient, FakeServer, make_pool, ready


class ReplicationClient(FakeClient):
    """A replication client (a Waiter, as every client connection): keeps the server opened
    for it, or its error."""

    def __init__(self, pool: Pool[FakeServer]) -> None:
        super().__init__("replication")
        self.pool = pool

    def open_server(self) -> FakeServer:
        server = FakeServer(self.pool, self.pool.clock())
        self.server = server
        return server


def _request(replication: ReplicationServers[FakeServer]) -> ReplicationClient:
    client = ReplicationClient(replication.pool)
    replication.request(client, client.open_server)
    return client


def test_a_replication_server_counts_in_pool_size() -> None:
    pool, _clock, launched = make_pool(pool_size=2)
    replication = replication_of(pool)
    assert replication_of(pool) is replication
    first = _request(replication)
    assert first.server is not None and pool.server_count == 1
    # one place left for the pool's own servers
    waiters = [FakeClient("a"), FakeClient("b")]
    for waiter in waiters:
        assert pool.acquire(waiter) is None
    assert len(launched) == 1
    ready(pool, launched[0])
    assert waiters[0].server is launched[0] and pool.server_count == 2


def test_a_replication_client_waits_when_the_pool_is_full() -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    replication = replication_of(pool)
    first = _request(replication)
    second = _request(replication)
    assert first.server is not None and second.server is None
    assert pool.waiting_client_count == 1
    assert len(replication) == 1
    replication.gone(first.server)  # its connection is gone: the next one's turn
    assert second.server is not None and pool.server_count == 1
    assert pool.waiting_client_count == 0


def test_the_least_recently_used_idle_server_is_evicted() -> None:
    pool, clock, launched = make_pool(pool_size=2)
    clients = [FakeClient("a"), FakeClient("b")]
    for client in clients:
        pool.acquire(client)
    for server in launched:
        ready(pool, server)
    clock.now += 1
    pool.release(launched[1], clock.now)
    clock.now += 1
    pool.release(launched[0], clock.now)
    replication = replication_of(pool)
    walsender = _request(replication)
    assert launched[1].closed == "evicted" and launched[0].closed is None
    assert walsender.server is not None and pool.server_count == 2


def test_busy_servers_are_not_evicted() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    client = FakeClient()
    pool.acquire(client)
    ready(pool, launched[0])
    replication = replication_of(pool)
    walsender = _request(replication)
    assert walsender.server is None and launched[0].closed is None
    pool.release(launched[0])  # idle now: the janitor evicts it for the waiting client
    replication.tick(pool.clock())
    assert launched[0].closed == "evicted" and walsender.server is not None


def test_a_waiting_replication_client_gets_query_wait_timeout() -> None:
    pool, clock, _launched = make_pool(pool_size=1)
    pool.wait_timeout = 5.0
    replication = replication_of(pool)
    _request(replication)
    waiting = _request(replication)
    clock.now += 5.0
    replication.tick(clock.now)
    assert waiting.error is None
    clock.now += 0.5
    late = _request(replication)
    replication.tick(clock.now)
    assert waiting.error is not None and "query_wait_timeout" in waiting.error.message
    assert late.error is None and len(replication.waiting) == 1


def test_a_refusing_pool_fails_replication_clients() -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    replication = replication_of(pool)
    _request(replication)
    waiting = _request(replication)
    error = PgtarnError("pgtarn is shutting down", sqlstate="57P01")
    pool.refuse_waiting(error)
    replication.tick(pool.clock())
    assert waiting.error is error
    assert _request(replication).error is error


def test_a_paused_pool_keeps_replication_clients_waiting() -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    replication = replication_of(pool)
    pool.pause()
    client = _request(replication)
    replication.tick(pool.clock())
    assert client.server is None and client.error is None
    pool.resume()
    replication.tick(pool.clock())
    assert client.server is not None


def test_a_client_that_leaves_stops_waiting() -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    replication = replication_of(pool)
    first = _request(replication)
    gone = _request(replication)
    pool.client_left(gone, joined=False)
    assert first.server is not None
    replication.gone(first.server)
    assert gone.server is None and not replication.waiting
