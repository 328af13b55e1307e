"""Registry: each pool's timeouts, and connection limits that count listener connections."""

from __future__ import annotations

from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.pool.channels import ChannelBoard
from pgtarn.pool.pool import ClientTimeouts, Pool, PooledServer
from pgtarn.pool.registry import Registry

from .fakes import FakeLink, FakeSubscriber

INI = """
[databases]
short = host=127.0.0.1 dbname=app server_lifetime=5 query_wait_timeout=2
plain = host=127.0.0.1 dbname=app

[users]
alice = query_timeout=3 idle_transaction_timeout=4 client_idle_timeout=6

[pgbouncer]
server_lifetime = 100
server_idle_timeout = 50
query_wait_timeout = 30
query_timeout = 7
idle_transaction_timeout = 8
client_idle_timeout = 9
transaction_timeout = 10
server_login_retry = 0.3
"""


def test_timeouts_per_database_and_per_user_over_the_global_ones() -> None:
    config = parse_config(INI)
    registry: Registry[PooledServer] = Registry(config)
    short = registry.get_pool(config.databases["short"], "alice")
    plain = registry.get_pool(config.databases["plain"], "bob")
    assert (short.lifetime, short.wait_timeout) == (5.0, 2.0)
    assert (plain.lifetime, plain.wait_timeout) == (100.0, 30.0)
    assert short.idle_timeout == plain.idle_timeout == 50.0
    assert short.client_timeouts == ClientTimeouts(
        query=3.0, transaction=10.0, idle_transaction=4.0, idle=6.0
    )
    assert plain.client_timeouts == ClientTimeouts(
        query=7.0, transaction=10.0, idle_transaction=8.0, idle=9.0
    )
    assert short.retry_cap == 0.3  # server_login_retry below 1 s caps the backoff


def test_query_wait_timeout_and_transaction_timeout_per_user() -> None:
    """[users]: the user's query_wait_timeout over the database's over the global one (as
    PgBouncer); the user's transaction_timeout over the global one, 0 turning it off; a
    reload applies changed values to the pools there are."""
    text = INI.replace("[users]\n", "[users]\ncarol = query_wait_timeout=1 transaction_timeout=0\n")
    config = parse_config(text)
    registry: Registry[PooledServer] = Registry(config)
    short_carol = registry.get_pool(config.databases["short"], "carol")
    plain_carol = registry.get_pool(config.databases["plain"], "carol")
    short_bob = registry.get_pool(config.databases["short"], "bob")
    assert (short_carol.wait_timeout, plain_carol.wait_timeout) == (1.0, 1.0)
    assert short_bob.wait_timeout == 2.0
    assert short_carol.client_timeouts == ClientTimeouts(
        query=7.0, transaction=0.0, idle_transaction=8.0, idle=9.0
    )
    assert short_bob.client_timeouts.transaction == 10.0
    registry.apply(
        parse_config(
            text.replace(
                "query_wait_timeout=1 transaction_timeout=0",
                "query_wait_timeout=0 transaction_timeout=3",
            )
        )
    )
    assert (short_carol.wait_timeout, short_carol.client_timeouts.transaction) == (0.0, 3.0)
    assert short_bob.client_timeouts.transaction == 10.0


def test_server_login_retry_above_a_second_still_retries_within_a_second() -> None:
    config = parse_config(
        "[databases]\napp = host=127.0.0.1\n[pgbouncer]\nserver_login_retry = 15\n"
    )
    pool = Registry[PooledServer](config).get_pool(config.databases["app"], "u")
    assert pool.retry_cap == 1.0
    assert not pool.auto


LIMITS = """
[databases]
one = host=127.0.0.1 dbname=app max_db_connections=2
two = host=127.0.0.1 dbname=app
[users]
alice = max_user_connections=2
[pgbouncer]
default_pool_size = 5
"""


class FakeServer(PooledServer):
    """A pool's server as the registry counts and evicts it."""

    def __init__(self) -> None:
        self.closed = ""
        self.connstr = ""
        self.created_at = self.last_used = 0.0
        self.close_needed = False

    def close(self, reason: str, wait: bool = False) -> None:
        self.closed = reason


def registry_with_listeners() -> tuple[Registry[FakeServer], list[tuple[object, str]]]:
    """A registry whose listener connections are FakeLinks; each open is noted as
    (pool, database entry name)."""
    registry: Registry[FakeServer] = Registry(parse_config(LIMITS))
    opened: list[tuple[object, str]] = []

    def open_listener(pool: object, db: DatabaseEntry, board: ChannelBoard) -> FakeLink:
        opened.append((pool, db.name))
        return FakeLink(board)

    registry.open_listener = open_listener
    return registry, opened


def listen(pool: Pool[FakeServer]) -> None:
    """A client of pool listens to a channel: the board opens its link."""
    assert pool.board is not None
    pool.board.update(FakeSubscriber("c"), frozenset(), frozenset({"ch"}), 1.0)
    assert pool.board.open_links == 1


def test_the_listener_counts_against_max_db_connections() -> None:
    registry, opened = registry_with_listeners()
    config = registry.config
    pool = registry.get_pool(config.databases["one"], "bob")
    pool.active.add(FakeServer())
    assert registry.may_open(pool)  # 1 of 2
    listen(pool)
    assert opened == [(pool, "one")]
    assert not registry.may_open(pool)  # the listener holds the last slot
    assert registry.may_open_listener(pool)  # the listener itself may connect
    pool.active.add(FakeServer())
    assert not registry.may_open_listener(pool)  # servers took every slot meanwhile


def test_the_listener_counts_against_max_user_connections_across_pools() -> None:
    registry, _opened = registry_with_listeners()
    config = registry.config
    first = registry.get_pool(config.databases["two"], "alice")
    second = registry.get_pool(config.databases["one"], "alice")
    first.active.add(FakeServer())
    listen(second)  # alice: one server of first, the listener of second
    assert not registry.may_open(first) and not registry.may_open(second)
    assert registry.may_open_listener(second)
    assert first.board is not None and first.board.open_links == 0


def test_an_idle_server_of_another_pool_makes_room_for_a_listener() -> None:
    registry, _opened = registry_with_listeners()
    config = registry.config
    first = registry.get_pool(config.databases["two"], "alice")
    second = registry.get_pool(config.databases["one"], "alice")
    idle, busy = FakeServer(), FakeServer()
    first.idle.append(idle)
    first.active.add(busy)
    listen(second)  # alice: two servers and the listener, over max_user_connections
    assert registry.may_open_listener(second)
    assert idle.closed and not busy.closed and not first.idle


def test_a_closed_listener_frees_its_slot() -> None:
    registry, _opened = registry_with_listeners()
    pool = registry.get_pool(registry.config.databases["one"], "bob")
    pool.active.add(FakeServer())
    listen(pool)
    assert pool.board is not None
    pool.board.close("no client listens any more")
    assert registry.may_open(pool)


def test_a_freed_pool_closes_its_listener_connection() -> None:
    registry, _opened = registry_with_listeners()
    pool = registry.get_pool(registry.config.databases["one"], "bob")
    board = pool.board
    assert board is not None
    client = FakeSubscriber("c")
    board.update(client, frozenset(), frozenset({"ch"}), 1.0)
    board.update(client, frozenset({"ch"}), frozenset(), 2.0)  # the client left
    link = board.link
    assert isinstance(link, FakeLink)
    registry.free(pool)
    assert link.closes and board.open_links == 0


SPLIT = """
[databases]
app = host=a,b dbname=app read_write_split=explicit {opts}
[pgbouncer]
autodb_idle_timeout = 60
"""


def test_a_reload_applies_the_split_keys_without_closing_servers() -> None:
    """read_write_split and its keys are not part of what a server is: a RELOAD that changes
    them hands the pools' entries the new values and keeps their servers."""
    registry: Registry[FakeServer] = Registry(parse_config(SPLIT.format(opts="")))
    config = registry.config
    app_ro = config.find_database("app_ro")
    assert app_ro is not None
    pools = [registry.get_pool(config.databases["app"], "u"), registry.get_pool(app_ro, "u")]
    servers = [FakeServer(), FakeServer()]
    for pool, server in zip(pools, servers, strict=True):
        pool.idle.append(server)
    registry.apply(
        parse_config(
            SPLIT.format(
                opts=(
                    "max_replica_lag=2s primary_reads=off read_your_writes=off "
                    "health_check_period=3"
                )
            )
        )
    )
    for name in ("app", "app_ro"):
        db = registry.databases[name]
        assert (
            db.max_replica_lag_seconds,
            db.primary_reads,
            db.read_your_writes,
            db.health_check_period,
        ) == (2.0, False, False, 3.0)
    assert registry.databases["app_ro"].reads_only
    assert not any(s.closed or getattr(s, "close_needed", False) for s in servers)
    assert all(len(pool.idle) == 1 for pool in pools)


def test_the_ro_alias_pool_is_not_an_auto_database() -> None:
    """autodb_idle_timeout frees pools made from `*`, not those of NAME_ro."""
    config = parse_config(SPLIT.format(opts=""))
    app_ro = config.find_database("app_ro")
    assert app_ro is not None
    assert not Registry[FakeServer](config).get_pool(app_ro, "u").auto


def test_the_reset_query_of_every_transaction_follows_the_config_and_reloads() -> None:
    """server_reset_query_always: the pool holds the query the client runs at each unlink
    (read there on the hot path), and a RELOAD changes it."""
    ini = INI + "server_reset_query = DISCARD ALL\nserver_reset_query_always = {always}\n"
    registry: Registry[PooledServer] = Registry(parse_config(ini.format(always=1)))
    pool = registry.get_pool(registry.config.databases["plain"], "bob")
    assert pool.reset_query_always == "DISCARD ALL"
    registry.apply(parse_config(ini.format(always=0)))
    assert pool.reset_query_always is None
    registry.apply(parse_config(ini.format(always=1)))
    assert pool.reset_query_always == "DISCARD ALL"
