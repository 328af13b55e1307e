"""Each timeout and lifetime firing, and the error (SQLSTATE and severity) its client sees.

query_timeout, transaction_timeout and idle_transaction_timeout are PgBouncer's: the client
is closed with PgBouncer's words and SQLSTATE (FATAL 08P01 "query timeout", "transaction
timeout", "idle transaction timeout"), and the log line says the same.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .faultproxy import FaultProxy
from .pgstat import backend_pids, make_table, rows, superuser_connect, wait_until
from .rawpg import RawClient, error_fields
from .test_admin import admin, pool_row, show
from .test_reload import reload

pytestmark = pytest.mark.integration

#: A DO block that swallows every cancel: only closing its server stops it.
UNCANCELLABLE = (
    "DO $$ BEGIN LOOP BEGIN PERFORM pg_sleep(10); "
    "EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP; END $$"
)


#: A query only a timeout ends (pgtarn's CancelRequest stops it: see still_running).
LONG_SLEEP = "select pg_sleep(60) -- ended by a timeout"


def still_running(cluster: TempCluster, sql: str = LONG_SLEEP) -> bool:
    """Whether a backend still runs sql: a server closed mid-query goes with a CancelRequest
    for it, since PostgreSQL notices a closed connection only when it next writes to it."""
    return (
        cluster.psql(f"SELECT count(*) FROM pg_stat_activity WHERE query = '{sql}'").strip() != "0"
    )


def closed_in_log(proc: PgtarnProcess, name: str, reason: str) -> None:
    """Wait until the log says that a client and a server of app/app were closed for
    reason (the client's close is logged once its socket is gone)."""
    for kind in ("C", "S"):
        line = re.compile(rf"{kind}-\d+: app/{name}@\S+ closing because: {re.escape(reason)}")

        def logged(pattern: re.Pattern[str] = line) -> bool:
            return pattern.search(proc.log_text()) is not None

        wait_until(logged, what=f"{kind} closed for {reason}")


def raw_login(
    proc: PgtarnProcess, user: str = "app", password: str = "app_pass", dbname: str = "app"
) -> RawClient:
    """A logged-in raw client (up to its first ReadyForQuery)."""
    raw = RawClient(proc.host, proc.port)
    login = ServerAuth(user, password)
    raw.send(build.startup_message({"user": user, "database": dbname}))
    while not login.done:
        msg_type, body = raw.read_message()
        reply = login.feed(ord(msg_type), body)
        if reply:
            raw.send(reply)
    return raw


def query(raw: RawClient, sql: str) -> bytes:
    """Run a simple query that must succeed; the transaction status after it."""
    raw.send(build.query(sql))
    messages = raw.read_until("Z")
    assert messages[-1][0] == "Z", error_fields(messages[-1][1])
    return messages[-1][1]


def final_error(raw: RawClient) -> dict[str, str]:
    """The fields of the ErrorResponse that ends the connection, which must then close."""
    while True:
        msg_type, body = raw.read_message()
        if msg_type == "E":
            break
        assert msg_type in ("N", "S"), (msg_type, body)  # nothing else may come unasked
    with pytest.raises(ConnectionError):
        raw.read_message()
    raw.close()
    return error_fields(body)


def pid_of(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("select pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def server_pids(proc: PgtarnProcess) -> set[int]:
    """Backend pids of the servers pgtarn holds now (SHOW SERVERS)."""
    with admin(proc) as console:
        return {int(r["remote_pid"]) for r in show(console, "SERVERS")}


# --- servers --------------------------------------------------------------------------------


def test_server_lifetime_per_database_replaces_servers_but_never_mid_transaction(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        databases={"short": f"{base} server_lifetime=0.5", "app": base},
        settings={"default_pool_size": 1},
    )
    with (
        connect(proc, dbname="short", autocommit=True) as short,
        connect(proc, autocommit=True) as long,
    ):
        first_short, first_long = pid_of(short), pid_of(long)
        time.sleep(1.0)
        second_short = pid_of(short)
        assert second_short != first_short  # past its lifetime: replaced
        assert pid_of(long) == first_long  # the global server_lifetime (3600 s) still holds
        with short.transaction():
            assert pid_of(short) == second_short
            time.sleep(1.0)  # the lifetime passes while the transaction is open
            assert pid_of(short) == second_short  # still the same server: not cut off
        assert pid_of(short) != second_short  # closed once it came back


def test_server_lifetime_zero_uses_each_server_once(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1, "server_lifetime": 0})
    with connect(proc, autocommit=True) as conn:
        pids = [pid_of(conn) for _ in range(3)]
    assert len(set(pids)) == 3


def test_server_idle_timeout_closes_idle_servers_down_to_min_pool_size(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 3, "server_idle_timeout": 0.5})
    with superuser_connect(pg_cluster) as su, admin(proc) as console:
        conns = [connect(proc) for _ in range(3)]
        pids = {pid_of(c) for c in conns}  # three transactions: three servers
        for c in conns:
            c.commit()
            c.close()
        assert len(pids) == 3
        wait_until(lambda: not backend_pids(su) & pids, what="idle servers closed")
        assert [r for r in show(console, "SERVERS") if r["database"] == "app"] == []
    assert proc.log_text().count("server_idle_timeout") >= 3


def test_server_whose_reset_is_never_answered_is_closed_after_server_connect_timeout(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    proc = pgtarn_factory(
        databases={"app": f"host={fault_proxy.host} port={fault_proxy.port} dbname=app"},
        settings={"pool_mode": "session", "server_connect_timeout": 1},
    )
    with admin(proc) as console:
        with connect(proc, autocommit=True) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            fault_proxy.blackhole()  # the reset (DISCARD ALL) after the client leaves vanishes
        try:
            wait_until(
                lambda: (
                    [r["state"] for r in show(console, "SERVERS") if r["database"] == "app"]
                    in (["tested"], [])
                ),
                what="server resetting",
            )
            wait_until(
                lambda: not [r for r in show(console, "SERVERS") if r["database"] == "app"],
                what="stuck server closed",
            )
        finally:
            fault_proxy.blackhole(False)
    assert "reset or check not answered" in proc.log_text()
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 2").fetchone() == (2,)


# --- clients --------------------------------------------------------------------------------


def test_client_login_timeout_ends_silent_and_half_logged_in_clients_only(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"client_login_timeout": 1})
    silent = RawClient(proc.host, proc.port)  # connects, sends nothing
    no_password = RawClient(proc.host, proc.port)
    no_password.startup(user="app", database="app")
    msg_type, _ = no_password.read_message()
    assert msg_type == "R"  # asked for SCRAM, never answers
    trickle = RawClient(proc.host, proc.port)  # sends its startup packet a byte at a time
    packet = build.startup_message({"user": "app", "database": "app"})
    with connect(proc, autocommit=True) as fine:
        for byte in packet[:6]:  # each byte in time, the login as a whole not
            trickle.send(bytes((byte,)))
            time.sleep(0.1)
        for raw in (silent, no_password, trickle):
            fields = final_error(raw)
            assert (fields["S"], fields["C"]) == ("FATAL", "08P01")
            assert "client_login_timeout" in fields["M"]
        assert fine.execute("select 1").fetchone() == (1,)  # logged in: never timed out


def test_client_idle_timeout_per_user(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(users={"app": "client_idle_timeout=0.5"})
    idle = raw_login(proc)
    other = raw_login(proc, "scram_user", "scram_pass")  # no timeout of its own
    assert query(idle, "select 1") == b"I"
    fields = final_error(idle)
    assert (fields["S"], fields["C"]) == ("FATAL", "57P05")
    assert "client_idle_timeout" in fields["M"]
    assert query(other, "select 1") == b"I"  # idle as long, still served
    other.close()


def test_idle_transaction_timeout_rolls_back(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "idle_tx_")
    proc = pgtarn_factory(settings={"idle_transaction_timeout": 0.5, "default_pool_size": 1})
    raw = raw_login(proc)
    assert query(raw, f"begin; insert into {table} values (1)") == b"T"
    fields = final_error(raw)
    assert (fields["S"], fields["C"], fields["M"]) == (
        "FATAL",
        "08P01",
        "idle transaction timeout (idle_transaction_timeout = 0.5 s)",
    )
    line = r"C-\d+: app/app@\S+ closing because: idle transaction timeout \("
    wait_until(lambda: re.search(line, proc.log_text()) is not None, what="the close logged")
    with connect(proc, autocommit=True) as conn:  # the pool's one server is usable again
        conn.execute(f"insert into {table} values (2)")
    assert rows(pg_cluster, table) == [2]  # the abandoned insert was rolled back


def _ended_by_transaction_timeout(raw: RawClient, pg_cluster: TempCluster, table: str) -> None:
    """raw, in a transaction that inserted into table, sleeps past transaction_timeout (1 s):
    it is closed with FATAL 08P01 "transaction timeout", its query cancelled and its insert
    rolled back."""
    raw.send(build.query(LONG_SLEEP))  # no query_timeout: only the age ends it
    fields = final_error(raw)
    assert (fields["S"], fields["C"], fields["M"]) == (
        "FATAL",
        "08P01",
        "transaction timeout (transaction_timeout = 1 s)",
    )
    wait_until(lambda: not still_running(pg_cluster), what="the query cancelled")
    assert rows(pg_cluster, table) == []


def test_transaction_timeout_ends_a_long_transaction(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "tx_timeout_")
    proc = pgtarn_factory(settings={"transaction_timeout": 1})
    raw = raw_login(proc)
    assert query(raw, "begin") == b"T"
    assert query(raw, f"insert into {table} values (1)") == b"T"
    _ended_by_transaction_timeout(raw, pg_cluster, table)
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


@pytest.mark.parametrize("prepare", [False, True], ids=["unnamed", "prepared"])
def test_query_timeout_closes_the_client_and_its_server_and_cancels_the_query(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, prepare: bool
) -> None:
    """As PgBouncer: FATAL 08P01 "query timeout", the client and its server closed, both
    logged "closing because: query timeout"; the query is cancelled besides, so that it does
    not run on in PostgreSQL. Another user's query as long is not touched."""
    proc = pgtarn_factory(users={"app": "query_timeout=0.5"})
    with (
        connect(proc, autocommit=True) as conn,
        connect(proc, "scram_user", "scram_pass", autocommit=True) as other,
    ):
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute(LONG_SLEEP, prepare=prepare)
        assert (info.value.sqlstate, info.value.diag.severity) == ("08P01", "FATAL")
        assert info.value.diag.message_primary == "query timeout (query_timeout = 0.5 s)"
        assert conn.closed
        wait_until(lambda: not still_running(pg_cluster), what="the query cancelled")
        assert other.execute("select 1 from pg_sleep(1)").fetchone() == (1,)
    closed_in_log(proc, "app", "query timeout (query_timeout = 0.5 s)")


def test_query_timeout_closes_a_server_whose_query_ignores_the_cancel(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"query_timeout": 0.5, "default_pool_size": 2})
    with (
        superuser_connect(pg_cluster) as su,
        connect(proc, autocommit=True) as victim,
        connect(proc, autocommit=True) as bystander,
    ):
        pid = pid_of(victim)
        with pytest.raises(psycopg.OperationalError) as info:
            victim.execute(UNCANCELLABLE)
        assert info.value.sqlstate == "08P01"
        assert "query timeout" in str(info.value)
        assert pid_of(bystander) != pid  # that server is gone from the pool
        assert pid not in server_pids(proc)
        # PostgreSQL itself notices the closed connection only when it next writes (or with
        # client_connection_check_interval): end the loop here
        su.execute("select pg_terminate_backend(%s)", (pid,))


def test_query_wait_timeout_per_database(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(databases={"app": f"{base} pool_size=1 query_wait_timeout=0.5"})
    with connect(proc) as holder:
        holder.execute("select 1")  # a transaction holds the only server
        with connect(proc, autocommit=True) as waiter:
            with pytest.raises(psycopg.OperationalError) as info:
                waiter.execute("select 2")
            assert info.value.sqlstate == "08P01"
            assert "query_wait_timeout" in str(info.value)
        holder.commit()
    with connect(proc, autocommit=True) as later:
        assert later.execute("select 3").fetchone() == (3,)


def test_query_wait_timeout_per_user(pgtarn_factory: PgtarnFactory) -> None:
    """[users] query_wait_timeout (PgBouncer 1.25) over the global one: app's client waiting
    for its pool's one server is closed after 1 s, while scram_user's (the global 0) waits
    as long and on, and is served once its pool's server comes free."""
    proc = pgtarn_factory(
        settings={"default_pool_size": 1, "query_wait_timeout": 0},
        users={"app": "query_wait_timeout=1"},
    )
    with connect(proc) as holder, connect(proc, "scram_user", "scram_pass") as other_holder:
        holder.execute("select 1")  # transactions hold each pool's only server
        other_holder.execute("select 1")
        other_waiter = raw_login(proc, "scram_user", "scram_pass")
        other_waiter.send(build.query("select 2"))
        with connect(proc, autocommit=True) as waiter:
            with pytest.raises(psycopg.OperationalError) as info:
                waiter.execute("select 2")
            assert (info.value.sqlstate, info.value.diag.severity) == ("08P01", "FATAL")
            assert "query_wait_timeout" in str(info.value)
        with admin(proc) as console:
            assert pool_row(console, "app", "scram_user")["cl_waiting"] == 1
        other_holder.commit()
        assert other_waiter.read_until("Z")[-1] == ("Z", b"I")
        other_waiter.close()
        holder.commit()


def test_transaction_timeout_per_user_applies_on_reload(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """[users] transaction_timeout (PgBouncer 1.25), added by a RELOAD: app's transaction is
    ended after 1 s, scram_user's (the global 0) as old goes on."""
    table = make_table(pg_cluster, "user_tx_timeout_")
    proc = pgtarn_factory()
    text = Path(proc.ini_path).read_text(encoding="utf-8")
    reload(proc, text + "\n[users]\napp = transaction_timeout=1\n")
    raw = raw_login(proc)
    other = raw_login(proc, "scram_user", "scram_pass")
    assert query(other, "begin") == b"T"
    assert query(raw, "begin") == b"T"
    assert query(raw, f"insert into {table} values (1)") == b"T"
    _ended_by_transaction_timeout(raw, pg_cluster, table)
    assert query(other, "select 1") == b"T"  # its transaction, as old, is still open
    assert query(other, "commit") == b"I"
    other.close()


@pytest.mark.parametrize(
    "limits",
    [
        {"cancel_wait_timeout": 0.3},
        # 0 is no timeout of its own, yet still bounded: server_connect_timeout's
        {"cancel_wait_timeout": 0, "server_connect_timeout": 0.3},
    ],
    ids=["own", "zero"],
)
def test_cancel_wait_timeout_when_the_cancel_cannot_connect(
    pgtarn_factory: PgtarnFactory,
    fault_proxy: FaultProxy,
    pg_cluster: TempCluster,
    limits: dict[str, float],
) -> None:
    proc = pgtarn_factory(
        databases={"app": f"host={fault_proxy.host} port={fault_proxy.port} dbname=app"},
        settings={"query_timeout": 1, "default_pool_size": 1, **limits},
    )
    with superuser_connect(pg_cluster) as su, connect(proc, autocommit=True) as conn:
        pid = pid_of(conn)
        fault_proxy.stall_connects()  # the query's server connection carries on
        try:
            with pytest.raises(psycopg.OperationalError) as info:
                conn.execute("select pg_sleep(60)")
            # closed at query_timeout; the cancel sent for its query cannot connect: given
            # up after cancel_wait_timeout (or server_connect_timeout), not waited on for ever
            assert info.value.sqlstate == "08P01"
            wait_until(
                lambda: "failed: cancel_wait_timeout" in proc.log_text(), what="the cancel given up"
            )
        finally:
            fault_proxy.stall_connects(False)
        assert pid not in server_pids(proc)
        su.execute("select pg_terminate_backend(%s)", (pid,))


def test_autodb_idle_timeout_forgets_an_unused_automatic_database(
    pgtarn_factory: PgtarnFactory,
) -> None:
    timeout = 1.0
    proc = pgtarn_factory(settings={"autodb_idle_timeout": timeout})
    with admin(proc) as console:
        with connect(proc, dbname="postgres", autocommit=True) as conn:
            conn.execute("select 1")
            assert any(r["name"] == "postgres" for r in show(console, "DATABASES"))
            time.sleep(1.5 * timeout)  # in use, though its last query was long ago: kept
            assert any(r["database"] == "postgres" for r in show(console, "POOLS"))
            left = time.monotonic()
        wait_until(
            lambda: not any(r["name"] == "postgres" for r in show(console, "DATABASES")),
            what="automatic database forgotten",
        )
        # idle time counts from the last client leaving (less one janitor interval), never
        # from the last query: forgetting it sooner is the timeout firing early
        assert time.monotonic() - left >= timeout - 0.2
        assert not any(r["database"] == "postgres" for r in show(console, "POOLS"))
        assert any(r["name"] == "app" for r in show(console, "DATABASES"))  # configured: kept
    with connect(proc, dbname="postgres", autocommit=True) as conn:  # and made again on demand
        assert conn.execute("select 4").fetchone() == (4,)
