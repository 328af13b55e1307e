"""Pool limits against a real cluster: FIFO waiting, 2,000 clients, reserve, min and max sizes."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest

from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import PeakBackends, backend_pids, superuser_connect, wait_quiet, wait_until
from .rawpg import AsyncRawClient

pytestmark = pytest.mark.integration


def _direct(pg_cluster: TempCluster) -> str:
    return f"host={pg_cluster.host} port={pg_cluster.port}"


def test_waiting_clients_are_served_first_come_first_served(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    pg_cluster.psql(
        "DROP SEQUENCE IF EXISTS fifo_seq; CREATE SEQUENCE fifo_seq;"
        " GRANT ALL ON SEQUENCE fifo_seq TO PUBLIC;",
        dbname="app",
    )
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def scenario() -> list[int]:
        holder = await aconnect(proc)
        clients = [await aconnect(proc) for _ in range(6)]
        tx = holder.transaction()
        await tx.start()
        await holder.execute("select 1")  # holds the only server
        tasks = []
        for c in clients:  # they queue in this order
            tasks.append(asyncio.ensure_future(c.fetchval("select nextval('fifo_seq')")))
            await asyncio.sleep(0.1)
        assert not any(t.done() for t in tasks)
        await tx.commit()
        values = [await t for t in tasks]
        for c in [holder, *clients]:
            await c.close()
        return values

    values = asyncio.run(scenario())
    assert values == sorted(values) and len(set(values)) == 6


#: pgtarn's debug line (-v, which the fixture passes) for a server lent to a client inside
#: that server's own read (ServerConnection.link).
LENT_INSIDE_ITS_READ = "inside its own read"


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"max_prepared_statements": 100},  # the relay of prepared statements
        {"server_reset_query": "DISCARD ALL", "server_reset_query_always": 1},  # after a reset
        {"server_lifetime": 0},  # closed when released: a new server, after its login
    ],
    ids=["plain", "prepared", "reset", "login"],
)
def test_a_released_server_goes_to_a_waiting_client_after_its_read(
    pgtarn_factory: PgtarnFactory, settings: dict[str, object]
) -> None:
    """A server released while clients wait (its ReadyForQuery, the end of a reset or of its
    login, all read from its socket) is lent to the first of them once that read is over:
    the next client's bytes are not written to it while its reply to the last one is still
    being relayed. Every client's transactions are served all the same."""
    proc = pgtarn_factory(settings={"default_pool_size": 1, **settings})
    cache = 100 if "max_prepared_statements" in settings else 0

    async def scenario() -> list[set[int]]:
        clients = [await aconnect(proc, statement_cache_size=cache) for _ in range(6)]

        async def run(client: Any) -> set[int]:
            return {await client.fetchval("select pg_backend_pid()") for _ in range(20)}

        try:
            return list(await asyncio.gather(*(run(c) for c in clients)))
        finally:
            for client in clients:
                await client.close()

    served = asyncio.run(scenario())
    assert all(served)
    with connect(proc, dbname="pgbouncer", autocommit=True) as admin:
        cur = admin.execute("SHOW STATS")
        names = [d.name for d in cur.description or ()]
        stats = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    assert next(r["total_wait_time"] for r in stats if r["database"] == "app") > 0  # waited
    assert LENT_INSIDE_ITS_READ not in proc.log_text()


def test_2000_clients_on_pool_size_10_are_all_served(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    n_clients, pool_size = 2000, 10
    proc = pgtarn_factory(
        settings={
            "default_pool_size": pool_size,
            "max_client_conn": n_clients + 10,
            "auth_type": "md5",
            "log_connections": 0,
            "log_disconnections": 0,
        }
    )

    async def scenario() -> tuple[list[float], set[str], int]:
        clients: list[AsyncRawClient] = []
        sem = asyncio.Semaphore(100)

        async def open_one() -> AsyncRawClient:
            async with sem:
                return await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")

        clients = list(await asyncio.gather(*(open_one() for _ in range(n_clients))))
        start = asyncio.Event()

        async def one(c: AsyncRawClient) -> tuple[float, list[list[str | None]]]:
            await start.wait()
            t0 = time.monotonic()
            rows = await c.query("select pg_backend_pid(), 42 from pg_sleep(0.002)")
            return time.monotonic() - t0, rows

        tasks = [asyncio.ensure_future(one(c)) for c in clients]
        await asyncio.sleep(0)
        start.set()
        results = await asyncio.gather(*tasks)
        for c in clients:
            await c.close()
        waits = [w for w, _ in results]
        pids = {rows[0][0] or "" for _, rows in results}
        answered = sum(1 for _, rows in results if len(rows) == 1 and rows[0][1] == "42")
        return waits, pids, answered

    waits, pids, answered = asyncio.run(scenario())
    assert answered == n_clients
    assert 1 <= len(pids) <= pool_size
    with capsys.disabled():
        print(
            f"\n{n_clients} clients on pool_size {pool_size}: wait median "
            f"{statistics.median(waits) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms"
        )


def test_reserve_pool_serves_a_client_that_waited_reserve_pool_timeout(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(
        settings={"default_pool_size": 1, "reserve_pool_size": 1, "reserve_pool_timeout": 0.3}
    )
    with connect(proc) as holder, connect(proc, autocommit=True) as late:
        holder_pid = holder.execute("select pg_backend_pid()").fetchone()
        # holder keeps the only regular server in its open transaction
        late_pid = late.execute("select pg_backend_pid()").fetchone()
        assert late_pid != holder_pid
        holder.commit()


def test_without_reserve_a_client_waits_for_the_server(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1, "reserve_pool_timeout": 0.1})

    async def scenario() -> tuple[bool, int, int]:
        holder, late = await aconnect(proc), await aconnect(proc)
        tx = holder.transaction()
        await tx.start()
        holder_pid = await holder.fetchval("select pg_backend_pid()")
        task = asyncio.ensure_future(late.fetchval("select pg_backend_pid()"))
        await asyncio.sleep(0.5)
        waited = not task.done()
        await tx.commit()
        late_pid = await task
        await holder.close()
        await late.close()
        return waited, holder_pid, late_pid

    waited, holder_pid, late_pid = asyncio.run(scenario())
    assert waited and holder_pid == late_pid


def test_min_pool_size_opens_servers_ahead_and_refills(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(databases={"app": f"{_direct(pg_cluster)} dbname=app min_pool_size=3"})
    with superuser_connect(pg_cluster) as watch:
        with connect(proc, autocommit=True) as c:
            assert c.execute("select 1").fetchone() == (1,)
        wait_until(lambda: len(backend_pids(watch)) == 3, what="3 servers")
        first = backend_pids(watch)
        watch.execute("select pg_terminate_backend(pid) from unnest(%s::int[]) pid", (list(first),))
        wait_until(lambda: len(backend_pids(watch) - first) == 3, what="3 new servers")


def test_forced_user_database_opens_min_pool_size_at_start(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    with superuser_connect(pg_cluster) as watch:
        pgtarn_factory(
            databases={
                "forced": f"{_direct(pg_cluster)} dbname=app user=scram_user min_pool_size=2",
            }
        )
        wait_until(
            lambda: len(backend_pids(watch, ("scram_user",))) == 2,
            what="2 servers without any client",
        )


def _run_load(proc: PgtarnProcess, users: list[tuple[str, str, str]], rounds: int = 4) -> list[int]:
    """Concurrent queries from (user, password, dbname) clients; their backend pids."""

    async def scenario() -> list[int]:
        conns = [await aconnect(proc, user=u, password=p, dbname=d) for u, p, d in users]
        pids: list[int] = []
        for _ in range(rounds):
            pids += await asyncio.gather(
                *(c.fetchval("select pg_backend_pid() from pg_sleep(0.05)") for c in conns)
            )
        for c in conns:
            await c.close()
        return pids

    return asyncio.run(scenario())


def test_max_db_connections_spans_users(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(
        databases={"app": f"{_direct(pg_cluster)} dbname=app max_db_connections=2"}
    )
    users = [("app", "app_pass", "app")] * 4 + [("scram_user", "scram_pass", "app")] * 4
    wait_quiet(pg_cluster, ("app", "scram_user"), "app")
    with PeakBackends(pg_cluster, ("app", "scram_user"), "app") as peak:
        pids = _run_load(proc, users)
    assert len(pids) == 32
    assert peak.samples > 0 and peak.peak == 2


def test_max_user_connections_spans_databases(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(users={"scram_user": "max_user_connections=2"})
    users = [("scram_user", "scram_pass", "app")] * 4 + [
        ("scram_user", "scram_pass", "postgres")
    ] * 4
    wait_quiet(pg_cluster, ("scram_user",), None)
    with PeakBackends(pg_cluster, ("scram_user",), None) as peak:
        pids = _run_load(proc, users)
    assert len(pids) == 32
    assert peak.samples > 0 and peak.peak == 2


def test_pool_size_per_database_and_per_user(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(
        databases={"app": f"{_direct(pg_cluster)} dbname=app pool_size=3"},
        users={"scram_user": "pool_size=1"},
    )
    app_pids = _run_load(proc, [("app", "app_pass", "app")] * 6)
    scram_pids = _run_load(proc, [("scram_user", "scram_pass", "app")] * 6)
    assert 1 <= len(set(app_pids)) <= 3
    assert len(set(scram_pids)) == 1
