"""Tests for pgtarn.pool: containers, FIFO waiting, reserve, failing pools, checks, limits."""

from __future__ import annotations

from typing import Any

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.errors import PgtarnError
from pgtarn.pool.pool import Pool, PooledServer, Waiter
from pgtarn.pool.registry import Registry


class FakeServer(PooledServer):
    def __init__(self, pool: Pool[FakeServer], now: float) -> None:
        self.pool = pool
        self.connstr = pool.connstr
        self.created_at = now
        self.last_used = now
        self.close_needed = False
        self.in_read = False
        self.handoff_at = 0.0
        self.closed: str | None = None
        self.checks = 0

    def close(self, reason: str, wait: bool = False) -> None:
        self.closed = reason
        self.handoff_at = 0.0  # (as a server connection: it goes to nobody)
        self.pool.server_closed(self)

    def start_check(self) -> None:
        self.checks += 1
        self.last_used = self.pool.clock()  # as the real server: the check's start


class FakeClient(Waiter[FakeServer]):
    def __init__(self, name: str = "") -> None:
        self.name = name
        self.server: FakeServer | None = None
        self.error: PgtarnError | None = None
        self.welcomed = False
        self.notices = 0

    def server_assigned(self, server: FakeServer) -> None:
        self.server = server

    def server_unavailable(self, error: PgtarnError) -> None:
        self.error = error

    def welcome_ready(self) -> None:
        self.welcomed = True

    def waiting_too_long(self) -> None:
        self.notices += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_pool(
    pool_size: int = 2, **kwargs: Any
) -> tuple[Pool[FakeServer], Clock, list[FakeServer]]:
    clock = Clock()
    launched: list[FakeServer] = []

    def launch(pool: Pool[FakeServer]) -> FakeServer:
        server = FakeServer(pool, clock.now)
        launched.append(server)
        return server

    pool: Pool[FakeServer] = Pool(
        "db", "user", pool_size=pool_size, pool_mode="transaction", launch=launch, **kwargs
    )
    pool.clock = clock
    return pool, clock, launched


def ready(pool: Pool[FakeServer], server: FakeServer) -> None:
    pool.server_ready(server, {"server_version": "15"})


REFUSED = PgtarnError("could not connect to server: refused", sqlstate="08006")


def test_waiters_are_served_first_come_first_served() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    clients = [FakeClient(str(i)) for i in range(4)]
    for c in clients:
        assert pool.acquire(c) is None
    assert len(launched) == 1  # never more than pool_size
    ready(pool, launched[0])
    order = []
    for _ in clients:
        holder = next(c for c in clients if c.server is not None and c.name not in order)
        order.append(holder.name)
        server = holder.server
        assert server is not None
        pool.release(server)
    assert order == ["0", "1", "2", "3"]
    assert list(pool.idle) == launched and not pool.waiting and not pool.wait_since


def test_idle_server_is_lent_at_once_and_lifo() -> None:
    pool, clock, launched = make_pool(pool_size=2)
    a, b = FakeClient(), FakeClient()
    pool.acquire(a)
    pool.acquire(b)
    for s in launched:
        ready(pool, s)
    assert {a.server, b.server} == set(launched)
    assert a.server is not None and b.server is not None
    pool.release(a.server)
    clock.now += 1
    pool.release(b.server)
    c = FakeClient()
    assert pool.acquire(c) is b.server  # the most recently used one
    assert pool.active == {b.server}


def test_a_preferred_idle_server_is_lent_before_the_most_recent_one() -> None:
    """A client with session settings gets the server it left them on, if that one is idle
    (its SETs need not be replayed); otherwise the usual most recent one."""
    pool, _clock, launched = make_pool(pool_size=3)
    clients = [FakeClient() for _ in range(3)]
    for client in clients:
        pool.acquire(client)
    for s in launched:
        ready(pool, s)
    first, second, third = (c.server for c in clients)
    assert first is not None and second is not None and third is not None
    for server in (first, second, third):
        pool.release(server)
    assert pool.acquire(FakeClient(), prefer=first) is first
    assert pool.acquire(FakeClient(), prefer=first) is third  # busy now: the most recent
    assert list(pool.idle) == [second]


def test_a_new_client_queues_behind_waiting_ones_even_if_a_server_is_idle() -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    first, second = FakeClient(), FakeClient()
    pool.acquire(first)
    pool.waiting.append(second, 0.0)  # someone already waits
    pool.idle.append(FakeServer(pool, 0.0))
    assert pool.acquire(FakeClient()) is None


def test_reserve_pool_opens_after_reserve_pool_timeout_and_closes_when_unneeded() -> None:
    pool, clock, launched = make_pool(pool_size=1, reserve_pool_size=1, reserve_pool_timeout=5.0)
    holder, waiter = FakeClient(), FakeClient()
    pool.acquire(holder)
    ready(pool, launched[0])
    assert holder.server is launched[0]
    pool.acquire(waiter)
    clock.now += 4.9
    pool.tick(clock.now)
    assert len(launched) == 1
    clock.now += 0.2
    pool.tick(clock.now)
    assert len(launched) == 2
    ready(pool, launched[1])
    assert waiter.server is launched[1]
    pool.release(launched[1])  # nobody waits: the reserve server is closed
    assert launched[1].closed == "pool is over its size"
    assert pool.server_count == 1


def test_failing_pool_keeps_waiters_retries_with_backoff_then_fails_them() -> None:
    pool, clock, launched = make_pool(pool_size=3)
    pool.connect_timeout = 10.0
    pool.wait_timeout = 0.0  # (with one, they wait for it: test_waits.py)
    c = FakeClient()
    pool.acquire(c)
    assert len(launched) == 1
    pool.server_login_failed(launched[0], REFUSED, retry=True)
    assert c.error is None and list(pool.waiting) == [c]
    delays = []
    for _ in range(6):
        start = clock.now
        count = len(launched)
        while len(launched) == count:
            clock.now += 0.01
            pool.tick(clock.now)
        delays.append(round(clock.now - start, 2))
        assert len(pool.login) == 1  # one attempt at a time while failing
        pool.server_login_failed(launched[-1], REFUSED, retry=True)
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0], abs=0.011)  # capped
    since = pool.waiting.since(c)
    assert since is not None
    clock.now = since + 10.0
    pool.tick(clock.now)
    assert c.error is REFUSED and not pool.waiting


def test_failing_pool_serves_at_once_when_the_server_is_back() -> None:
    pool, clock, launched = make_pool(pool_size=3)
    c = FakeClient()
    pool.acquire(c)
    pool.server_login_failed(launched[0], REFUSED, retry=True)
    clock.now += 0.05
    pool.tick(clock.now)
    ready(pool, launched[1])
    assert c.server is launched[1]
    assert pool.failure is None and pool.failures == 0
    # healthy again: several waiters get several servers at once
    for _ in range(3):
        pool.acquire(FakeClient())
    assert len(pool.login) == 2


def test_login_error_that_will_not_pass_fails_waiters_at_once() -> None:
    pool, _clock, _launched = make_pool(pool_size=2)
    c, w = FakeClient(), FakeClient()
    pool.acquire(c)
    pool.wait_welcome(w)
    error = PgtarnError("password authentication failed", sqlstate="28P01")
    for server in list(pool.login):
        pool.server_login_failed(server, error, retry=False)
    assert c.error is error and w.error is error
    assert not pool.waiting and not pool.welcome_waiters and not pool.wait_since


def test_login_taking_longer_than_connect_timeout_is_closed() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.connect_timeout = 2.0
    pool.acquire(FakeClient())
    clock.now += 2.5
    pool.tick(clock.now)
    assert launched[0].closed == "connect timeout (server_connect_timeout = 2 s)"


def test_server_idle_past_check_delay_is_checked_before_reuse() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.check_delay = 30.0
    a = FakeClient()
    pool.acquire(a)
    ready(pool, launched[0])
    server = launched[0]
    pool.release(server)
    clock.now += 10
    b = FakeClient()
    assert pool.acquire(b) is server and server.checks == 0
    pool.release(server)
    clock.now += 31
    c = FakeClient()
    assert pool.acquire(c) is None
    assert server.checks == 1 and server in pool.tested
    assert len(launched) == 1  # the checked server is coming: no new one
    server.last_used = clock.now
    pool.release(server)  # check passed
    assert c.server is server
    # a check that fails closes the server; the waiter gets a new one
    pool.release(server)
    clock.now += 31
    d = FakeClient()
    pool.acquire(d)
    server.close("check failed")
    assert len(launched) == 2
    ready(pool, launched[1])
    assert d.server is launched[1]


def test_reset_or_check_unanswered_for_connect_timeout_closes_the_server() -> None:
    pool, clock, launched = make_pool(pool_size=2)
    pool.connect_timeout = 5.0
    pool.check_delay = 30.0
    first, second = FakeClient(), FakeClient()
    pool.acquire(first)
    pool.acquire(second)
    ready(pool, launched[0])
    ready(pool, launched[1])
    resetting, checked = launched
    pool.release(checked)
    clock.now += 31
    resetting.last_used = clock.now
    pool.begin_reset(resetting)  # its client left; the reset never answers
    waiter = FakeClient()
    assert pool.acquire(waiter) is None and checked in pool.tested  # its check never answers
    clock.now += 4.9
    pool.tick(clock.now)
    assert resetting.closed is None and checked.closed is None  # not early
    clock.now += 0.2
    pool.tick(clock.now)
    assert resetting.closed is not None and "server_connect_timeout" in resetting.closed
    assert checked.closed is not None and "server_connect_timeout" in checked.closed
    assert not pool.tested
    assert len(launched) == 3  # the waiter's replacement
    ready(pool, launched[2])
    assert waiter.server is launched[2]


def test_changed_connection_string_closes_servers_on_release() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    pool.connstr = "host=a"
    a = FakeClient()
    pool.acquire(a)
    launched[0].connstr = "host=a"
    ready(pool, launched[0])
    pool.connstr = "host=b"
    pool.release(launched[0])
    assert launched[0].closed == "connection string changed"


def test_pause_keeps_work_waiting_and_resume_serves_in_order() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    a = FakeClient()
    pool.acquire(a)
    ready(pool, launched[0])
    pool.pause()
    b, c = FakeClient("b"), FakeClient("c")
    pool.acquire(b)
    pool.acquire(c)
    pool.release(launched[0])
    assert b.server is None and list(pool.idle) == launched
    pool.resume()
    assert b.server is launched[0] and c.server is None


def test_min_pool_size_is_filled_by_the_janitor_and_refilled() -> None:
    pool, clock, launched = make_pool(pool_size=5, min_pool_size=3)
    pool.tick(clock.now)
    assert len(pool.login) == 3
    for s in launched:
        ready(pool, s)
    launched[0].close("died")
    pool.tick(clock.now)
    assert pool.server_count == 3 and len(launched) == 4


def test_cancelled_waiter_leaves_the_queue() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    a, b = FakeClient(), FakeClient()
    pool.acquire(a)
    pool.acquire(b)
    pool.cancel_wait(a)
    ready(pool, launched[0])
    assert a.server is None and b.server is launched[0] and not pool.wait_since


INI = """
[databases]
one = host=h dbname=one {db_opts}
two = host=h dbname=two
[pgbouncer]
default_pool_size = 5
{settings}
"""


def make_registry(
    db_opts: str = "", settings: str = ""
) -> tuple[Registry[FakeServer], list[FakeServer]]:
    config = parse_config(INI.format(db_opts=db_opts, settings=settings))
    registry: Registry[FakeServer] = Registry(config)
    launched: list[FakeServer] = []

    def launch(pool: Pool[FakeServer], db: object) -> FakeServer:
        server = FakeServer(pool, 0.0)
        launched.append(server)
        return server

    registry.launch = launch
    return registry, launched


def test_max_db_connections_spans_the_pools_of_a_database() -> None:
    registry, _launched = make_registry(db_opts="max_db_connections=3")
    config = registry.config
    p1 = registry.get_pool(config.databases["one"], "u1")
    p2 = registry.get_pool(config.databases["one"], "u2")
    for _ in range(3):
        p1.acquire(FakeClient())
    for _ in range(2):
        p2.acquire(FakeClient())
    assert p1.server_count == 3 and p2.server_count == 0
    # another database is not limited
    p3 = registry.get_pool(config.databases["two"], "u1")
    for _ in range(4):
        p3.acquire(FakeClient())
    assert p3.server_count == 4


def test_idle_server_of_another_pool_is_evicted_at_a_limit() -> None:
    registry, launched = make_registry(settings="max_user_connections = 2")
    config = registry.config
    p1 = registry.get_pool(config.databases["one"], "u")
    p2 = registry.get_pool(config.databases["two"], "u")
    a, b = FakeClient(), FakeClient()
    p1.acquire(a)
    p1.acquire(b)
    for s in list(p1.login):
        ready(p1, s)
    assert a.server is not None
    p1.release(a.server)  # one idle in p1, one active
    c = FakeClient()
    p2.acquire(c)
    assert p1.server_count == 1 and p2.server_count == 1
    assert sum(1 for s in launched if s.closed) == 1


def test_reload_applies_sizes_and_closes_surplus_idle() -> None:
    registry, _launched = make_registry()
    config = registry.config
    pool = registry.get_pool(config.databases["one"], "u")
    clients = [FakeClient() for _ in range(4)]
    for c in clients:
        pool.acquire(c)
    for s in list(pool.login):
        ready(pool, s)
    for c in clients:
        assert c.server is not None
        pool.release(c.server)
    assert len(pool.idle) == 4
    registry.apply(parse_config(INI.format(db_opts="pool_size=2 pool_mode=session", settings="")))
    assert pool.pool_size == 2 and pool.pool_mode == "session"
    assert len(pool.idle) == 2
    # a new host closes the idle servers
    registry.apply(
        parse_config(
            INI.format(db_opts="pool_size=2", settings="").replace(
                "one = host=h", "one = host=other"
            )
        )
    )
    assert len(pool.idle) == 0


@pytest.mark.parametrize("query,expected", [("<empty>", 30.0), ("", None)])
def test_server_check_query_empty_turns_checks_off(query: str, expected: float | None) -> None:
    registry, _ = make_registry(settings=f"server_check_query = {query}")
    pool = registry.get_pool(registry.config.databases["one"], "u")
    assert pool.check_delay == expected


def test_reload_applies_cross_pool_limits() -> None:
    registry, _launched = make_registry()
    pool = registry.get_pool(registry.config.databases["one"], "u")
    for _ in range(4):
        pool.acquire(FakeClient())
    assert pool.server_count == 4
    registry.apply(parse_config(INI.format(db_opts="max_db_connections=5", settings="")))
    other = registry.get_pool(registry.config.databases["one"], "v")
    for _ in range(3):
        other.acquire(FakeClient())
    assert other.server_count == 1  # 4 + 1 = max_db_connections


def test_failed_extra_server_does_not_fail_clients_waiting_for_running_ones() -> None:
    pool, clock, launched = make_pool(pool_size=2)
    pool.connect_timeout = 10.0
    holder, waiter = FakeClient(), FakeClient()
    pool.acquire(holder)
    ready(pool, launched[0])
    pool.acquire(waiter)  # a second server is opened for it, and fails
    pool.server_login_failed(launched[1], REFUSED, retry=True)
    clock.now += 11
    pool.tick(clock.now)
    assert waiter.error is None
    assert holder.server is not None
    pool.release(holder.server)
    assert waiter.server is launched[0]


def test_clients_queued_longer_than_query_wait_notify_are_told_oldest_first() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.wait_notify = 5.0
    holder, first, second = FakeClient("holder"), FakeClient("first"), FakeClient("second")
    pool.acquire(holder)
    ready(pool, launched[0])
    assert holder.server is launched[0]
    pool.acquire(first)
    clock.now += 3
    pool.acquire(second)
    pool.tick(clock.now)
    assert (first.notices, second.notices) == (0, 0)
    clock.now += 2.5  # first waited 5.5 s, second 2.5 s
    pool.tick(clock.now)
    assert (first.notices, second.notices) == (1, 0)
    pool.release(launched[0])  # first is served, second still waits
    assert first.server is launched[0]
    clock.now += 3
    pool.tick(clock.now)
    assert second.notices == 1


def test_server_assignments_and_wait_times_are_counted() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    a, b = FakeClient("a"), FakeClient("b")
    pool.acquire(a)
    clock.now += 0.02  # a waited for the login
    ready(pool, launched[0])
    pool.acquire(b)
    clock.now += 0.5
    pool.release(launched[0])
    assert pool.stats.server_assignments == 2
    assert abs(pool.stats.wait_times.total - 0.52) < 1e-9
    counts = dict(pool.stats.wait_times.cumulative())
    assert counts[0.025] == 1 and counts[0.5] == 2


def test_a_paused_pool_does_not_fail_its_waiters_for_a_login_that_failed() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.connect_timeout = 15.0
    waiter = FakeClient()
    pool.acquire(waiter)
    pool.pause(close_servers=True)
    pool.server_login_failed(launched[0], PgtarnError("killed", sqlstate="08006"), retry=True)
    clock.now += 60
    pool.tick(clock.now)
    assert waiter.error is None  # it waits for RESUME, not for the database


def test_max_wait_counts_clients_waiting_for_the_first_server() -> None:
    pool, clock, _launched = make_pool(pool_size=1)
    pool.wait_welcome(FakeClient("first"))
    clock.now += 7
    assert pool.max_wait(clock.now) == 7


def test_pause_closes_servers_as_they_are_released() -> None:
    pool, _clock, launched = make_pool(pool_size=2)
    a, b = FakeClient("a"), FakeClient("b")
    pool.acquire(a)
    pool.acquire(b)
    for server in launched:
        ready(pool, server)
    pool.release(launched[1])
    assert list(pool.idle) == [launched[1]]
    pool.pause(close_servers=True)
    assert launched[1].closed == "pool paused" and not pool.idle  # idle: at once
    assert pool.busy
    pool.release(launched[0])
    assert launched[0].closed == "pool paused" and not pool.busy


def test_global_resume_leaves_databases_paused_by_name() -> None:
    registry, _launched = make_registry()
    config = registry.config
    one = registry.get_pool(config.databases["one"], "u")
    two = registry.get_pool(config.databases["two"], "u")
    registry.pause("one", close_servers=True)
    registry.pause()
    registry.resume()
    assert one.paused and not two.paused
    registry.resume("one")
    assert not one.paused


def _serve_one(pool: Pool[FakeServer], clock: Clock, launched: list[FakeServer]) -> FakeServer:
    """One server logged in, lent to a client and released at clock.now."""
    client = FakeClient()
    assert pool.acquire(client) is None
    ready(pool, launched[-1])
    server = client.server
    assert server is not None
    server.last_used = clock.now
    pool.release(server)
    return server


def test_server_lifetime_closes_a_released_server_that_is_too_old() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.lifetime = 10.0
    young = _serve_one(pool, clock, launched)
    assert pool.acquire(FakeClient()) is young
    clock.now += 5
    young.last_used = clock.now
    pool.release(young)
    assert young.closed is None and list(pool.idle) == [young]
    client = FakeClient()
    assert pool.acquire(client) is young
    clock.now += 6  # 11 s since it connected
    young.last_used = clock.now
    pool.release(young)
    assert young.closed == "server_lifetime" and pool.server_count == 0


def test_server_lifetime_zero_serves_one_client_then_closes() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.lifetime = 0.0
    client = FakeClient()
    assert pool.acquire(client) is None
    ready(pool, launched[0])
    assert client.server is launched[0]  # logging in is not a use
    clock.now += 0.001
    launched[0].last_used = clock.now
    pool.release(launched[0])
    assert launched[0].closed == "server_lifetime"


def test_janitor_closes_idle_servers_past_lifetime_or_idle_timeout_but_keeps_min() -> None:
    pool, clock, launched = make_pool(pool_size=3)
    pool.lifetime, pool.idle_timeout, pool.min_pool_size = 100.0, 20.0, 1
    waiters = [FakeClient(str(i)) for i in range(3)]
    for waiter in waiters:
        pool.acquire(waiter)
    for server in launched:
        ready(pool, server)
    for waiter in waiters:
        assert waiter.server is not None
        pool.release(waiter.server)
    old = launched[0]
    clock.now += 10
    launched[1].last_used = launched[2].last_used = clock.now
    pool.tick(clock.now)
    assert pool.server_count == 3  # nothing expired yet
    clock.now += 15  # old unused for 25 s, the others for 15 s
    pool.tick(clock.now)
    assert old.closed == "server_idle_timeout" and pool.server_count == 2
    clock.now += 10  # both unused for 25 s: one goes, min_pool_size keeps the other
    pool.tick(clock.now)
    assert [s.closed for s in launched[1:]].count("server_idle_timeout") == 1
    assert pool.server_count == 1
    clock.now += 100  # past lifetime: closed even at min_pool_size, then replaced
    pool.tick(clock.now)
    assert [s.closed for s in launched[1:]].count("server_lifetime") == 1
    assert len(launched) == 4 and pool.login == {launched[3]}


def test_query_wait_timeout_closes_only_the_clients_that_waited_that_long() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.wait_timeout = 5.0
    holder = FakeClient()
    pool.acquire(holder)
    ready(pool, launched[0])
    old, young = FakeClient("old"), FakeClient("young")
    pool.acquire(old)
    clock.now += 3
    pool.acquire(young)
    clock.now += 2.5
    pool.tick(clock.now)
    assert old.error is not None and old.error.sqlstate == "08P01"
    assert "query_wait_timeout" in old.error.message and old.error.severity == "FATAL"
    assert young.error is None and list(pool.waiting) == [young]
    pool.wait_timeout = 0.0  # off: waits forever
    clock.now += 1000
    pool.tick(clock.now)
    assert young.error is None


def test_client_counts_follow_the_clients_and_the_containers() -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    early, first, second = FakeClient("early"), FakeClient("first"), FakeClient("second")
    pool.wait_welcome(early)  # logged in before any server: waits for the welcome
    assert (pool.client_count, pool.active_client_count, pool.waiting_client_count) == (1, 0, 1)
    server = next(iter(pool.login))
    pool.server_ready(server, {"server_version": "15"})
    assert early.welcomed and not pool.welcome_waiters
    for client in (early, first, second):
        pool.client_joined(client)
    assert pool.acquire(first) is server  # takes the one server
    assert pool.acquire(second) is None  # waits for it
    assert (pool.client_count, pool.active_client_count, pool.waiting_client_count) == (3, 2, 1)
    pool.client_left(second, True)
    assert (pool.client_count, pool.active_client_count, pool.waiting_client_count) == (2, 2, 0)
    pool.client_left(FakeClient("never joined"), False)  # (a login that failed)
    assert (pool.client_count, pool.active_client_count, pool.waiting_client_count) == (2, 2, 0)


SHUTTING_DOWN = PgtarnError("pgtarn is shutting down", sqlstate="57P01", severity="FATAL")


def test_refuse_waiting_fails_waiters_and_those_that_ask_later() -> None:
    registry, _launched = make_registry()
    config = registry.config
    one = registry.get_pool(config.databases["one"], "u")
    waiter = FakeClient("w")
    assert one.acquire(waiter) is None and one.waiting
    registry.pause()
    registry.refuse_waiting(SHUTTING_DOWN)
    assert waiter.error is SHUTTING_DOWN and not one.waiting and not one.wait_since
    later = FakeClient("later")
    assert one.acquire(later) is None
    assert later.error is SHUTTING_DOWN and not one.waiting
    two = registry.get_pool(config.databases["two"], "u")  # a pool made after it
    late = FakeClient("late")
    assert two.acquire(late) is None and late.error is SHUTTING_DOWN and not two.waiting


class SlowClosingServer(FakeServer):
    """A server whose close ends later (as a real one: its connection_lost comes after)."""

    def close(self, reason: str, wait: bool = False) -> None:
        self.closed = reason


@pytest.mark.parametrize("waiting", [False, True])
def test_a_server_closed_at_release_is_in_no_container_while_it_closes(waiting: bool) -> None:
    pool, _clock, _launched = make_pool(pool_size=1)
    server = SlowClosingServer(pool, pool.clock())
    pool.active.add(server)  # lent to a client
    if waiting:
        pool.acquire(FakeClient("b"))
    server.close_needed = True
    pool.release(server)
    assert server.closed == "reconnect requested"
    assert server not in pool.active and pool.server_count == 0


def test_a_server_lent_on_at_release_stays_active() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    a, b = FakeClient("a"), FakeClient("b")
    pool.acquire(a)
    ready(pool, launched[0])
    assert pool.acquire(b) is None
    pool.release(launched[0], clock.now)
    assert b.server is launched[0] and pool.active == {launched[0]} and not pool.waiting
    pool.release(launched[0], clock.now)
    assert pool.active == set() and list(pool.idle) == [launched[0]]
