"""Host lists in [databases]: load_balance_hosts round-robin and disable, hosts that cannot
be reached skipped, cancels sent to the host a server is on."""

from __future__ import annotations

import re
import socket
import threading

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .test_admin import admin, show


def _refused_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_addrs(proc: PgtarnProcess) -> list[str]:
    with admin(proc) as console:
        return [str(row["addr"]) for row in show(console, "SERVERS")]


def _entry(hosts: str, ports: str, load_balance: str | None = None) -> dict[str, str]:
    line = f"host={hosts} port={ports} dbname=app"
    if load_balance:
        line += f" load_balance_hosts={load_balance}"
    return {"app": line}


@pytest.mark.parametrize("load_balance", [None, "disable"])
def test_hosts_that_cannot_be_reached_are_skipped(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    load_balance: str | None,
) -> None:
    """A refusing host and an unresolvable one come first in the list: every client is
    served by the one that works, with no error, in either load_balance_hosts mode."""
    port = pg_cluster.port
    proc = pgtarn_factory(
        databases=_entry(
            f"127.0.0.1,no-such-host.invalid,{pg_cluster.host}",
            f"{_refused_port()},{port},{port}",
            load_balance,
        ),
        settings={"default_pool_size": 3, "server_lifetime": 0},
    )
    for _ in range(6):  # server_lifetime 0: a new server each time, each through the list
        with connect(proc, autocommit=True) as conn:
            assert conn.execute("select 1").fetchone() == (1,)


def test_hosts_skipped_are_logged_in_pgbouncers_words(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """Each host given up on is logged with PgBouncer's phrase for it ("server DNS lookup
    failed", "connect failed"), naming that host, once per server that tried it; the same
    server goes on to the next host (no error for the client)."""
    port, refused = pg_cluster.port, _refused_port()
    proc = pgtarn_factory(
        databases=_entry(
            f"no-such-host.invalid,127.0.0.1,{pg_cluster.host}",
            f"{port},{refused},{port}",
            "disable",
        ),
        settings={"default_pool_size": 1},
    )
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    text = proc.log_text()
    dns = re.findall(
        r"S-\d+: app/app@no-such-host\.invalid:\d+ closing because: server DNS "
        r"lookup failed \(.*\); trying the next host",
        text,
    )
    refusals = re.findall(
        rf"S-\d+: app/app@127\.0\.0\.1:{refused} closing because: connect "
        r"failed \(.*\); trying the next host",
        text,
    )
    # (log_text() holds the logfile and stderr, which both carry every line)
    assert len(set(dns)) == 1 and len(set(refusals)) == 1, text
    assert re.search(rf"S-\d+: app/app@127\.0\.0\.1:{port} new connection to server", text)


def test_round_robin_spreads_servers_over_the_hosts(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """The cluster on two addresses (127.0.0.1 and ::1): round-robin opens servers on both
    in turn; disable keeps the first, which works."""
    if not pg_cluster.ipv6:
        pytest.skip("the cluster does not listen on ::1")
    port = pg_cluster.port
    for load_balance, expected in ((None, {"127.0.0.1", "::1"}), ("disable", {"127.0.0.1"})):
        proc = pgtarn_factory(
            databases=_entry("127.0.0.1,::1", f"{port},{port}", load_balance),
            settings={"default_pool_size": 4},
        )
        clients = [connect(proc) for _ in range(4)]
        try:
            for conn in clients:  # in a transaction each: four servers at once
                conn.execute("select 1")
            hosts = set(_server_addrs(proc))
        finally:
            for conn in clients:
                conn.close()
        assert hosts == expected, (load_balance, hosts)
        proc.stop()


def test_a_cancel_goes_to_the_host_its_server_is_on(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """With a refusing host first in the list, a cancel still reaches the query's backend."""
    port = pg_cluster.port
    proc = pgtarn_factory(
        databases=_entry(f"127.0.0.1,{pg_cluster.host}", f"{_refused_port()},{port}"),
        settings={"default_pool_size": 2},
    )
    with connect(proc, autocommit=True) as conn:
        timer = threading.Timer(0.5, conn.cancel)
        timer.start()
        try:
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("select pg_sleep(30)")
        finally:
            timer.cancel()
