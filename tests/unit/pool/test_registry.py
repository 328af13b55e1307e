"""Registry: each pool gets the timeouts its database and user are configured with."""

from __future__ import annotations

from pgtarn.configfile import parse_config
from pgtarn.pool.pool import ClientTimeouts
from pgtarn.pool.registry import Registry

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
    registry: Registry[object] = Registry(config)
    short = registry.get_pool(config.databases["short"], "alice")
    plain = registry.get_pool(config.databases["plain"], "bob")
    assert (short.lifetime, short.wait_timeout) == (5.0, 2.0)
    assert (plain.lifetime, plain.wait_timeout) == (100.0, 30.0)
    assert short.idle_timeout == plain.idle_timeout == 50.0
    assert short.client_timeouts == ClientTimeouts(
        query=3.0, transaction=10.0, idle_transaction=4.0, idle=6.0)
    assert plain.client_timeouts == ClientTimeouts(
        query=7.0, transaction=10.0, idle_transaction=8.0, idle=9.0)
    assert short.retry_cap == 0.3  # server_login_retry below 1 s caps the backoff


def test_server_login_retry_above_a_second_still_retries_within_a_second() -> None:
    config = parse_config(
        "[databases]\napp = host=127.0.0.1\n[pgbouncer]\nserver_login_retry = 15\n")
    pool = Registry[object](config).get_pool(config.databases["app"], "u")
    assert pool.retry_cap == 1.0
    assert not pool.auto
