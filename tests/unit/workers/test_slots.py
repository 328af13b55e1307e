"""A worker's side of the shared limits: no server without a slot, slots given back."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.errors import PgtarnError
from pgtarn.pool.pool import Pool, PooledServer, Waiter
from pgtarn.pool.registry import Registry
from pgtarn.workers.link import WorkerLink
from pgtarn.workers.slots import LEASE, LEASE_KEEP, SharedLimits

INI = (
    "[databases]\napp = host=127.0.0.1 dbname=app max_db_connections=5\n"
    "[pgbouncer]\ndefault_pool_size = 3\n"
)


class Server(PooledServer):
    def __init__(self, pool: Pool[Server]) -> None:
        self.pool = pool
        self.connstr = pool.connstr
        self.created_at = self.last_used = pool.clock()
        self.close_needed = False
        self.closed: str | None = None

    def close(self, reason: str, wait: bool = False) -> None:
        assert wait or "given back" not in reason
        self.closed = reason
        self.pool.server_closed(self)

    def start_check(self) -> None:
        raise AssertionError("no checks here")


class Client(Waiter[Server]):
    def __init__(self) -> None:
        self.server: Server | None = None

    def server_assigned(self, server: Server) -> None:
        self.server = server

    def server_unavailable(self, error: PgtarnError) -> None:
        raise AssertionError(error)

    def welcome_ready(self) -> None:
        pass

    def waiting_too_long(self) -> None:
        pass


class Link:
    """The supervisor link as SharedLimits uses it: index, count, handle and send."""

    index, count = 1, 2

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.handlers: dict[str, Any] = {}
        self.replies: list[dict[str, Any]] = []

    def handle(self, kind: str, handler: Any) -> None:
        self.handlers[kind] = handler

    def send(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        self.sent.append(message)

    async def request(self, message: dict[str, Any], timeout: float) -> tuple[Any, list[int]]:
        self.sent.append(message)
        return self.replies.pop(0), []

    def kinds(self) -> list[str]:
        sent, self.sent = self.sent, []
        return [m["kind"] for m in sent]

    def deliver(self, kind: str) -> None:
        self.handlers[kind]({"kind": kind, "database": "app", "user": "app"}, [])


def setup() -> tuple[Link, SharedLimits, Pool[Server], list[Server]]:
    config = parse_config(INI)
    registry: Registry[Server] = Registry(config)
    launched: list[Server] = []

    def launch(pool: Pool[Server], db: DatabaseEntry) -> Server:
        launched.append(Server(pool))
        return launched[-1]

    registry.launch = launch
    link = Link()
    limits = SharedLimits(cast(WorkerLink, link), registry)  # (what SharedLimits uses of it)
    registry.gate = limits
    pool = registry.get_pool(config.databases["app"], "app")
    pool.welcome = {}
    return link, limits, pool, launched


def test_a_server_opens_only_with_a_slot_from_the_supervisor() -> None:
    link, limits, pool, launched = setup()
    assert pool.acquire(Client()) is None
    assert not launched
    [ask] = link.sent
    assert ask == {
        "kind": "limits_ask",
        "database": "app",
        "user": "app",
        "pool_limit": 3,
        "max_db": 5,
        "max_user": 0,
    }
    assert pool.acquire(Client()) is None
    assert link.kinds() == ["limits_ask", "limits_ask"]  # one per waiting client
    link.deliver("limits_grant")
    assert len(launched) == 1 and limits.held[("app", "app")] == 1
    assert link.kinds() == []


def test_a_slot_goes_back_when_its_server_is_gone_and_nobody_waits() -> None:
    link, limits, pool, launched = setup()
    client = Client()
    pool.acquire(client)
    link.deliver("limits_grant")
    pool.server_ready(launched[0], {})
    assert client.server is launched[0]
    link.kinds()
    waiting = Client()
    pool.acquire(waiting)
    assert link.kinds() == ["limits_ask"]
    launched[0].close("server_lifetime")  # a client waits: the slot serves it
    assert link.kinds() == [] and len(launched) == 2
    pool.server_ready(launched[1], {})
    assert waiting.server is launched[1]
    pool.release(launched[1])
    launched[1].close("server_idle_timeout")
    assert link.kinds() == ["limits_release"]
    assert not limits.held


def test_a_give_back_closes_an_idle_server_and_the_slot_goes_when_it_is_gone() -> None:
    link, limits, pool, launched = setup()
    pool.acquire(Client())
    link.deliver("limits_grant")
    pool.server_ready(launched[0], {})
    pool.release(launched[0])
    link.kinds()
    link.deliver("limits_reclaim")
    assert launched[0].closed == "given back for another worker's clients"
    assert link.kinds() == ["limits_release"] and not limits.held


def test_a_busy_server_is_given_back_when_released_then_a_grant_ends_what_is_owed() -> None:
    link, _limits, pool, launched = setup()
    first, second = Client(), Client()
    for client in (first, second):
        pool.acquire(client)
    link.deliver("limits_grant")
    pool.server_ready(launched[0], {})
    link.kinds()
    link.deliver("limits_reclaim")
    assert launched[0].closed is None  # busy: it goes when released
    pool.release(launched[0])  # second waits, but the slot was asked for elsewhere
    assert launched[0].closed == "given back for another worker's clients"
    assert second.server is None
    assert link.kinds() == ["limits_release"]
    link.deliver("limits_reclaim")  # owed twice: ...
    link.deliver("limits_grant")  # ... but a grant to this worker ends that
    pool.server_ready(launched[1], {})
    assert second.server is launched[1]
    pool.release(launched[1])
    assert launched[1].closed is None


def test_min_pool_size_is_shared_out_between_the_workers() -> None:
    _link, limits, _pool, _launched = setup()
    assert [limits.share(n) for n in (0, 1, 2, 3, 5)] == [0, 0, 1, 1, 2]  # worker 1 of 2


def test_a_release_asks_the_gate_only_while_the_pool_owes_a_server() -> None:
    link, limits, pool, launched = setup()
    asked: list[bool] = []
    gives_back = limits.gives_back

    def counted(pool: Pool[Any], server: PooledServer) -> bool:
        asked.append(gives_back(pool, server))
        return asked[-1]

    limits.gives_back = counted  # type: ignore[method-assign]
    client = Client()
    pool.acquire(client)
    link.deliver("limits_grant")
    pool.server_ready(launched[0], {})
    for _ in range(3):  # the hot path: a transaction's release calls nothing of the gate
        pool.release(launched[0])
        pool.acquire(client)
    assert asked == [] and pool.owed == 0
    link.deliver("limits_reclaim")  # busy: owed, and given back at its release
    assert pool.owed == 1
    pool.release(launched[0])
    assert asked == [True] and pool.owed == 0
    assert launched[0].closed == "given back for another worker's clients"


FREE = [100, 0, 0, 1, 0, 0]  # max_client_conn 100, no limit by database or user


def test_logins_take_spare_places_of_the_lease_without_a_message() -> None:
    link, limits, _pool, _launched = setup()
    clients = [object() for _ in range(LEASE + 2)]
    assert not limits.take(clients[0], "app", "app", False, FREE)  # no place yet
    link.replies.append({"refused": None, "places": 1 + LEASE})
    assert asyncio.run(limits.admit(clients[0], "app", "app", False, FREE)) is None
    [ask] = link.sent
    assert (ask["kind"], ask["need"], ask["lease"]) == ("limits_admit", 1, LEASE)
    link.sent.clear()
    assert all(limits.take(c, "app", "app", False, FREE) for c in clients[1 : LEASE + 1])
    assert link.sent == [] and limits.used == limits.places == LEASE + 1
    assert not limits.take(clients[-1], "app", "app", False, FREE)  # the lease is used up
    for client in clients[: LEASE + 1]:
        limits.left(client)
    # the places stay, but those beyond LEASE_KEEP spare ones
    assert limits.used == 0 and limits.places == LEASE + 1
    assert link.sent == []


def test_a_client_limited_by_database_or_user_is_asked_about_and_told_of() -> None:
    link, limits, _pool, _launched = setup()
    limited = [100, 5, 0, 1, 1, 0]  # max_db_client_connections 5
    limits.places = 3
    client = object()
    assert not limits.take(client, "app", "app", False, limited)
    link.replies.append({"refused": None, "places": 0})
    assert asyncio.run(limits.admit(client, "app", "app", False, limited)) is None
    assert link.sent[0]["need"] == 0  # in a spare place of its worker's
    assert limits.used == 1
    link.sent.clear()
    limits.left(client)
    assert link.sent == [{"kind": "limits_left", "database": "app", "user": "app", "admin": False}]
    link.sent.clear()
    link.replies.append({"refused": "max_db_client_connections", "places": 0})
    refused = asyncio.run(limits.admit(client, "app", "app", False, limited))
    assert refused == "max_db_client_connections"
    assert limits.used == 0 and not limits.admitted(client)


def test_spare_places_go_back_when_asked_and_beyond_what_a_worker_keeps() -> None:
    link, limits, _pool, _launched = setup()
    limits.places = 5
    assert limits.take(object(), "app", "app", False, FREE)
    link.deliver("limits_spare")
    assert link.sent == [{"kind": "limits_returned", "count": 4, "asked": True}]
    assert limits.places == limits.used == 1
    link.sent.clear()
    link.deliver("limits_spare")  # nothing spare: the answer is due all the same
    assert link.sent == [{"kind": "limits_returned", "count": 0, "asked": True}]
    link.sent.clear()
    clients = [object() for _ in range(LEASE_KEEP + 1)]
    limits.places = len(clients) + 1
    for c in clients:
        assert limits.take(c, "app", "app", False, FREE)
    for c in clients:
        limits.left(c)
    assert link.sent == [{"kind": "limits_returned", "count": LEASE_KEEP + 1 - LEASE}]
    assert limits.places - limits.used == LEASE


def test_a_slot_granted_after_its_client_was_served_opens_a_server_all_the_same() -> None:
    # a single process opens a server when a client waits, though another may be released
    # first; giving the slot back instead made each such wait a round trip and a release
    link, limits, pool, launched = setup()
    first, second = Client(), Client()
    pool.acquire(first)
    link.deliver("limits_grant")
    pool.server_ready(launched[0], {})
    link.kinds()
    pool.acquire(second)  # waits: a slot is asked for
    assert link.kinds() == ["limits_ask"]
    pool.release(launched[0])  # ... and the released server serves it first
    assert second.server is launched[0]
    link.deliver("limits_grant")
    assert len(launched) == 2 and limits.held[("app", "app")] == 2
    pool.server_ready(launched[1], {})
    limits.tick()
    assert link.kinds() == []  # kept: it is the pool's second server
