"""Servers that die, a PostgreSQL that is down or unreachable, and the pool coming back."""

from __future__ import annotations

import re
import time

import psycopg
import pytest

from pgtarn.proto import build
from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .faultproxy import FaultProxy
from .pgstat import backend_pids, superuser_connect, wait_until
from .test_auth import login_error
from .test_timeouts import final_error, raw_login

pytestmark = pytest.mark.integration

# "S-7: app/app@127.0.0.1:5432 closing because: server connection lost" -> "S-7"
LOST_SERVER = re.compile(r"\b(S-\d+): \S* closing because: server connection lost")


def _via_proxy(fault_proxy: FaultProxy, extra: str = "") -> dict[str, str]:
    return {"app": f"host={fault_proxy.host} port={fault_proxy.port} dbname=app {extra}"}


def test_server_cut_mid_transaction_gives_its_client_08006(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    proc = pgtarn_factory(databases=_via_proxy(fault_proxy), settings={"default_pool_size": 2})
    with connect(proc) as victim, connect(proc, autocommit=True) as bystander:
        victim.execute("select 1")  # in a transaction: the server is linked to victim
        assert fault_proxy.active() == 1
        assert fault_proxy.cut() == 1
        with pytest.raises(psycopg.OperationalError) as info:
            victim.execute("select 2")
        assert info.value.sqlstate == "08006"
        assert "server connection crashed" in str(info.value)
        # the dead server was dropped; others are served on a new one
        assert bystander.execute("select 3").fetchone() == (3,)
    log = proc.log_text()
    assert "server connection lost" in log


def test_terminated_backend_mid_transaction(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory()
    with connect(proc) as victim, superuser_connect(pg_cluster) as su:
        pid = victim.execute("select pg_backend_pid()").fetchone()
        assert pid is not None
        su.execute("select pg_terminate_backend(%s)", pid)
        with pytest.raises(psycopg.OperationalError) as info:
            victim.execute("select 2")
        assert info.value.sqlstate == "57P01"  # PostgreSQL's own FATAL, relayed
    with connect(proc, autocommit=True) as fresh:
        assert fresh.execute("select pg_backend_pid()").fetchone() != pid


def test_a_fatal_from_postgresql_is_the_only_error_its_client_gets(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"pool_mode": "session"})
    raw = raw_login(proc)
    raw.send(build.query("select pg_backend_pid()"))
    pid = int(next(body for kind, body in raw.read_until("Z") if kind == "D")[6:])
    with superuser_connect(pg_cluster) as su:
        su.execute("select pg_terminate_backend(%s)", (pid,))
    fields = final_error(raw)  # one ErrorResponse, then the connection closes
    assert (fields["S"], fields["C"]) == ("FATAL", "57P01")
    assert "terminating connection" in fields["M"]
    assert "server sent FATAL 57P01" in proc.log_text()


def test_idle_servers_that_died_are_not_reused(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 3})
    with superuser_connect(pg_cluster) as su:
        conns = [connect(proc) for _ in range(3)]
        old = {c.execute("select pg_backend_pid()").fetchone() for c in conns}
        for c in conns:
            c.commit()  # servers go back to the pool, idle
        assert len(old) == 3
        su.execute(
            "select pg_terminate_backend(pid) from unnest(%s::int[]) pid",
            ([p[0] for p in old if p],),
        )
        wait_until(lambda: not backend_pids(su) & {p[0] for p in old if p}, what="backends gone")
        # pgtarn has read the end of each of the three (a query racing a death it has not read
        # yet would fail, as through any pooler: that is server_check_delay's job). Servers
        # are counted by name, not lines: log_text() holds the logfile and stderr, which
        # both carry every line, so two deaths would already make four lines.
        wait_until(
            lambda: len(set(LOST_SERVER.findall(proc.log_text()))) == 3,
            what="pgtarn saw the three servers close",
        )
        try:
            for c in conns:  # every client is served on a live server, none sees an error
                assert c.execute("select pg_backend_pid()").fetchone() not in old
                c.commit()
        finally:
            for c in conns:
                c.close()


def test_idle_server_is_checked_after_server_check_delay(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    proc = pgtarn_factory(
        databases=_via_proxy(fault_proxy),
        settings={
            "default_pool_size": 1,
            "server_check_delay": 0,
            "server_check_query": "select 1",
        },
    )
    with connect(proc, autocommit=True) as c:
        pids = {c.execute("select pg_backend_pid()").fetchone() for _ in range(5)}
        assert len(pids) == 1  # checks pass: the same server is reused
    assert fault_proxy.accepted == 1


def test_postgres_down_waiters_wait_for_query_wait_timeout_told_the_last_error(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    """As PgBouncer: a refused connect does not end the waiting clients (the pool retries;
    server_connect_timeout is only each attempt's limit): they end at query_wait_timeout,
    told why no server came."""
    proc = pgtarn_factory(
        databases=_via_proxy(fault_proxy),
        settings={"server_connect_timeout": 0.5, "query_wait_timeout": 2, "server_login_retry": 15},
    )
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 1").fetchone() == (1,)
    fault_proxy.down()  # refuses connections, cuts the idle server
    with connect(proc, autocommit=True) as c:  # logs in: the pool knows the server params
        with pytest.raises(psycopg.OperationalError) as info:
            c.execute("select 1")
    assert (info.value.sqlstate, info.value.diag.severity) == ("08P01", "FATAL")
    assert str(info.value).startswith(
        "query_wait_timeout: no server connection became free in 2 s (last error: could not "
        "connect to server: connect failed ("
    ), str(info.value)
    # PostgreSQL back: the next client is served, no lockout for server_login_retry
    fault_proxy.up()
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 2").fetchone() == (2,)


def test_first_client_waits_through_a_short_outage(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    proc = pgtarn_factory(
        databases=_via_proxy(fault_proxy), settings={"server_connect_timeout": 10}
    )
    fault_proxy.down()
    import threading

    threading.Timer(0.7, fault_proxy.up).start()
    # no server has logged in yet: the client waits in login while the pool retries
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 1").fetchone() == (1,)
    text = proc.log_text()
    assert "could not connect to server" in text
    # each refused attempt, in PgBouncer's words, naming the server and where it went
    assert re.search(
        rf"S-\d+: app/app@{fault_proxy.host}:{fault_proxy.port} closing because: "
        r"connect failed \(",
        text,
    ), text


def test_unanswered_logins_end_at_server_connect_timeout_and_are_retried(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    """A login never answered is given up on after server_connect_timeout ("closing
    because: connect timeout", PgBouncer's words) and tried again; the waiting client ends
    at query_timeout (which covers a wait for a server too, as with PgBouncer)."""
    proc = pgtarn_factory(
        databases=_via_proxy(fault_proxy),
        settings={"server_connect_timeout": 0.5, "query_timeout": 2},
    )
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 1").fetchone() == (1,)
    fault_proxy.cut()
    fault_proxy.blackhole()  # connects are accepted but never answered
    with connect(proc, autocommit=True) as c:
        with pytest.raises(psycopg.OperationalError) as info:
            c.execute("select 1")
    assert (info.value.sqlstate, info.value.diag.severity) == ("08P01", "FATAL")
    assert str(info.value).startswith(
        "query_timeout: no server connection in 2 s (last error: could not log in to server: "
        "connect timeout (server_connect_timeout = 0.5 s))"
    ), str(info.value)
    gave_up = re.findall(
        r"\b(S-\d+): \S+ closing because: connect timeout "
        r"\(server_connect_timeout = 0\.5 s\)",
        proc.log_text(),
    )
    assert len(set(gave_up)) >= 2  # given up on, tried again, given up on
    fault_proxy.blackhole(False)
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 2").fetchone() == (2,)


def test_a_login_waiting_for_the_first_server_ends_at_query_timeout(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    """PgBouncer's test_server_connect_timeout_establish: no server has logged in yet, each
    login attempt goes unanswered past server_connect_timeout (2 s); the client, waiting in
    its login for the first server, ends at query_timeout (3 s), in PgBouncer's word."""
    proc = pgtarn_factory(
        databases=_via_proxy(fault_proxy),
        settings={"server_connect_timeout": 2, "query_timeout": 3},
    )
    fault_proxy.blackhole()  # connects are accepted but never answered
    try:
        sqlstate, message = login_error(proc, "app", "app_pass")
    finally:
        fault_proxy.blackhole(False)
    assert sqlstate == "08P01"
    assert message.startswith(
        "query_timeout: no server connection in 3 s (last error: could "
        "not log in to server: connect timeout"
    ), message
    assert "closing because: connect timeout (server_connect_timeout = 2 s)" in proc.log_text()


def test_pool_refills_to_min_pool_size_after_an_outage(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(databases=_via_proxy(fault_proxy, "min_pool_size=2"))
    with superuser_connect(pg_cluster) as su:
        with connect(proc, autocommit=True) as c:
            assert c.execute("select 1").fetchone() == (1,)
        wait_until(lambda: len(backend_pids(su)) == 2, what="min_pool_size servers")
        before = backend_pids(su)
        fault_proxy.down()
        wait_until(lambda: not backend_pids(su), what="servers gone in the outage")
        time.sleep(0.5)  # the pool retries meanwhile
        fault_proxy.up()
        wait_until(lambda: len(backend_pids(su)) == 2, what="pool refilled")
        assert not backend_pids(su) & before


def test_postgres_restart_mid_transaction(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    port = pg_cluster.port
    with connect(proc) as victim:
        victim.execute("select 1")  # in a transaction on its server
        pg_cluster.stop()  # fast shutdown: PostgreSQL ends every backend
        try:
            with pytest.raises(psycopg.OperationalError) as info:
                victim.execute("select 2")
            assert info.value.sqlstate in ("57P01", "08006")
        finally:
            pg_cluster.start()
    assert pg_cluster.port == port
    # the dead servers were dropped: new clients are served by the restarted PostgreSQL
    with connect(proc, autocommit=True) as fresh:
        assert fresh.execute("select 3").fetchone() == (3,)
