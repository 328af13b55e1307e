"""read_write_split against a real primary and two streaming standbys: reads spread over the
replicas, writes on the primary, read-only transactions on replicas, auto mode refusing what it
cannot prove read-only, a lagging replica skipped while read-your-writes holds, a replica
stopped and started again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, free_port
from tests.support.cluster import PrimaryCluster, StandbyCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect, scalar
from .pgstat import wait_for
from .test_metrics import scrape, value

pytestmark = pytest.mark.integration

PORT = "select current_setting('port')::int"


class Trio:
    def __init__(self) -> None:
        self.primary = PrimaryCluster()
        self.primary.start()
        self.standbys: list[StandbyCluster] = []

    def entry(self, split: str, **keys: object) -> str:
        clusters = [self.primary, *self.standbys]
        extra = " ".join(f"{k}={v}" for k, v in keys.items())
        return (
            f"host={','.join(c.host for c in clusters)} "
            f"port={','.join(str(c.port) for c in clusters)} dbname=app "
            f"read_write_split={split} health_check_period=0.2 {extra}"
        ).strip()

    def caught_up(self) -> None:
        """Every standby replayed what the primary wrote so far."""
        lsn = self.primary.psql("select pg_current_wal_insert_lsn()").strip()
        for standby in self.standbys:

            def replayed(s: StandbyCluster = standby) -> bool:
                return s.psql(f"select pg_last_wal_replay_lsn() >= '{lsn}'").strip() == "t"

            wait_for(replayed, timeout=20)


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    trio = Trio()
    try:
        trio.primary.create_role("app", "app_pass")
        trio.primary.psql("CREATE DATABASE app OWNER app;")
        trio.primary.psql(
            "CREATE TABLE items (id serial PRIMARY KEY, v int);ALTER TABLE items OWNER TO app;",
            dbname="app",
        )
        for _ in range(2):
            standby = StandbyCluster(trio.primary)
            trio.standbys.append(standby)
            standby.start()
        trio.caught_up()
        yield trio
    finally:
        for standby in trio.standbys:
            standby.cleanup()
        trio.primary.cleanup()


def _start(pgtarn_factory: PgtarnFactory, trio: Trio, split: str, **keys: object) -> Any:
    proc = pgtarn_factory(
        databases={"app": trio.entry(split, **keys)}, settings={"default_pool_size": 4}
    )
    # the first checks have run once the replicas serve reads
    how = "auto" if split == "auto" else "explicit"
    wait_for(lambda: _ports(proc, how, 12) & _standby_ports(trio) != set(), timeout=20)
    return proc


def _standby_ports(trio: Trio) -> set[int]:
    return {s.port for s in trio.standbys}


def _ports(proc: PgtarnProcess, how: str, count: int, dbname: str = "app") -> set[int]:
    """The servers' ports of count read transactions (auto: a plain SELECT; explicit: in
    BEGIN READ ONLY), from several clients at once."""
    seen: set[int] = set()
    lock = threading.Lock()

    def reader() -> None:
        with connect(proc, dbname=dbname, autocommit=True) as conn:
            for _ in range(count):
                if how == "auto":
                    port = scalar(conn.execute(PORT))
                else:
                    conn.execute("BEGIN READ ONLY")
                    port = scalar(conn.execute(PORT))
                    conn.execute("COMMIT")
                with lock:
                    seen.add(port)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def test_reads_spread_over_replicas_and_writes_stay_on_the_primary(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    proc = _start(pgtarn_factory, trio, "auto", primary_reads="off")
    assert wait_for(lambda: _ports(proc, "auto", 25) == _standby_ports(trio), timeout=20)
    with connect(proc, autocommit=True) as conn:
        conn.execute("insert into items (v) values (1)")  # a replica would refuse it
        with conn.transaction():  # a transaction that may write: on the primary
            assert scalar(conn.execute(PORT)) == trio.primary.port
        assert (
            scalar(conn.execute("select nextval('items_id_seq') > 0, " + PORT[7:]), 1)
            == trio.primary.port
        )


def test_primary_reads_on_spread_over_every_server(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    metrics_port = free_port()
    proc = pgtarn_factory(
        databases={"app": trio.entry("auto")},
        settings={"default_pool_size": 4, "metrics_port": metrics_port},
    )
    every = {trio.primary.port, *_standby_ports(trio)}
    assert wait_for(lambda: _ports(proc, "auto", 25) == every, timeout=20)
    # what each server is and how many transactions went there: SHOW HOSTS, the metrics
    with connect(proc, dbname="pgbouncer", autocommit=True) as admin:
        cur = admin.execute("SHOW HOSTS")
        names = [d.name for d in cur.description or ()]
        rows = {int(r[names.index("port")]): dict(zip(names, r, strict=True)) for r in cur}
    assert {port: row["role"] for port, row in rows.items()} == {
        trio.primary.port: "primary",
        **{port: "replica" for port in _standby_ports(trio)},
    }
    assert all(row["state"] == "up" and int(row["routed"]) > 0 for row in rows.values())
    samples = scrape(metrics_port)
    for port, row in rows.items():
        labels = {"database": "app", "host": "127.0.0.1", "port": str(port)}
        assert value(samples, "pgtarn_host_up", role=row["role"], **labels) == 1
        assert value(samples, "pgtarn_host_transactions_routed_total", **labels) > 0


def test_explicit_sends_read_only_transactions_to_replicas(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    proc = _start(pgtarn_factory, trio, "explicit", primary_reads="off")
    assert _ports(proc, "explicit", 10) <= _standby_ports(trio), proc.log_text()[-3000:]
    assert _ports(proc, "auto", 10) == {trio.primary.port}  # a plain SELECT: not explicit
    with connect(proc, autocommit=True) as conn:
        conn.execute("START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        assert scalar(conn.execute(PORT)) in _standby_ports(trio)
        conn.execute("COMMIT")
        # SET TRANSACTION READ ONLY right after a BEGIN of its own
        conn.execute("BEGIN")
        conn.execute("SET TRANSACTION READ ONLY")
        assert scalar(conn.execute(PORT)) in _standby_ports(trio)
        conn.execute("COMMIT")
        conn.execute("BEGIN")
        conn.execute("insert into items (v) values (2)")
        assert scalar(conn.execute(PORT)) == trio.primary.port
        conn.execute("COMMIT")
        # default_transaction_read_only set by the client: every transaction reads (on the
        # primary until a replica replayed the client's insert: read-your-writes)
        conn.execute("SET default_transaction_read_only = on")
        standbys = _standby_ports(trio)
        assert wait_for(lambda: scalar(conn.execute(PORT)) in standbys, timeout=20)
        conn.execute("RESET default_transaction_read_only")
        assert scalar(conn.execute(PORT)) == trio.primary.port
    # the NAME_ro database: every transaction on a replica
    assert _ports(proc, "auto", 10, dbname="app_ro") <= _standby_ports(trio)


def test_auto_sends_what_it_cannot_prove_read_only_to_the_primary(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    proc = _start(pgtarn_factory, trio, "auto", primary_reads="off")
    with connect(proc, autocommit=True) as conn:
        assert scalar(conn.execute(PORT)) in _standby_ports(trio)
        for sql in [
            f"select random(), {PORT[7:]}",  # volatile
            f"select {PORT[7:]} from items limit 1 for update",  # locks rows
            f"select {PORT[7:]} from (select * from items for share) s limit 1",
            f"with d as (delete from items where v = -1 returning *) select {PORT[7:]}",
            f"select pg_advisory_xact_lock(7), {PORT[7:]}",
        ]:
            conn.execute("insert into items (v) values (3)")
            row = conn.execute(sql).fetchone()
            assert row is not None and row[-1] == trio.primary.port, sql


def test_prepared_statements_and_settings_work_on_every_server(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    proc = _start(pgtarn_factory, trio, "auto")
    with connect(proc, autocommit=True, prepare_threshold=0) as conn:
        conn.execute("SET application_name = 'split-test'")
        seen = set()
        for _ in range(30):
            row = conn.execute(
                "select current_setting('port')::int, current_setting('application_name')"
            ).fetchone()
            assert row is not None
            port, name = row
            assert name == "split-test"
            seen.add(port)
        assert len(seen) >= 2

    async def with_asyncpg() -> set[int]:
        conn = await aconnect(proc, statement_cache_size=100)
        try:
            stmt = await conn.prepare("select current_setting('port')::int + $1::int")
            return {await stmt.fetchval(0) for _ in range(30)}
        finally:
            await conn.close()

    import asyncio

    assert len(asyncio.run(with_asyncpg())) >= 2


def test_a_lagging_replica_gets_no_reads_and_read_your_writes_holds(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    paused, other = trio.standbys
    proc = _start(pgtarn_factory, trio, "auto", primary_reads="off", max_replica_lag="64kB")
    paused.psql("select pg_wal_replay_pause()")
    try:
        trio.primary.psql(
            "insert into items (v) select 0 from generate_series(1, 3000)", dbname="app"
        )
        wait_for(lambda: _ports(proc, "auto", 8) == {other.port}, timeout=20)
        assert _ports(proc, "auto", 20) == {other.port}
        # read-your-writes: each read sees the client's own write, wherever it runs
        with connect(proc, autocommit=True) as conn:
            for n in range(1, 60):
                conn.execute("insert into items (v) values (%s)", (1000 + n,))
                seen = scalar(conn.execute("select max(v) from items where v > 1000 and v < 2000"))
                assert seen is not None and seen >= 1000 + n
        # replicas serve the reads of a client that did not write just now
        assert other.port in _ports(proc, "auto", 10)
    finally:
        paused.psql("select pg_wal_replay_resume()")
        trio.primary.psql("delete from items where v >= 1000", dbname="app")
    trio.caught_up()
    assert wait_for(lambda: _ports(proc, "auto", 20) == _standby_ports(trio), timeout=20)


def test_a_stopped_replica_is_skipped_and_serves_again_once_back(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    gone, other = trio.standbys
    proc = _start(pgtarn_factory, trio, "auto", primary_reads="off")
    assert wait_for(lambda: _ports(proc, "auto", 20) == _standby_ports(trio), timeout=20)
    gone.stop()
    try:
        # reads in flight on it may fail; new ones go elsewhere within a check or two
        wait_for(lambda: _safe_ports(proc) == {other.port}, timeout=20)
        assert _ports(proc, "auto", 20) == {other.port}
        assert "banned" in proc.log_text()
    finally:
        gone.start()
    assert wait_for(lambda: _ports(proc, "auto", 20) == _standby_ports(trio), timeout=20)


def _safe_ports(proc: PgtarnProcess) -> set[int]:
    try:
        return _ports(proc, "auto", 8)
    except psycopg.Error:
        return set()


def test_listen_and_notify_go_through_the_primary(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    # the listener connection LISTENs on the primary (a standby refuses LISTEN), whatever
    # server the notifying transaction or the listening client's reads run on
    proc = _start(pgtarn_factory, trio, "auto")
    with connect(proc, autocommit=True) as listener, connect(proc, autocommit=True) as other:
        listener.execute("LISTEN split_channel")
        for n in range(3):
            assert listener.execute(PORT).fetchone() is not None  # reads on any server
            other.execute("select pg_notify('split_channel', %s)", (str(n),))
        got: list[str] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)]
        assert got == ["0", "1", "2"], proc.log_text()[-4000:]
    primary_backends = trio.primary.psql(
        "select count(*) from pg_stat_activity where application_name = 'pgtarn listener'"
    )
    assert primary_backends.strip() != "0"


def test_session_mode_keeps_every_client_on_the_primary(
    pgtarn_factory: PgtarnFactory, trio: Trio
) -> None:
    proc = pgtarn_factory(
        databases={"app": trio.entry("auto", pool_mode="session", primary_reads="off")},
        settings={"default_pool_size": 4},
    )
    assert _ports(proc, "auto", 10) == {trio.primary.port}
    assert _ports(proc, "explicit", 5) == {trio.primary.port}
