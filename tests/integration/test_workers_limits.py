"""workers = N against a real cluster: one set of limits for the whole pgtarn.

Server limits are checked where they matter, in PostgreSQL's pg_stat_activity, sampled often
while clients of both workers are busy; client limits by logins landing on either worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import asyncpg
import pytest

from tests.support import PgtarnProcess, TempCluster
from tests.support.procs import tcp_clients, wait_children

from .conftest import PgtarnFactory
from .drivers import aconnect
from .pgstat import PeakBackends, backend_pids, superuser_connect, wait_quiet, wait_until

pytestmark = pytest.mark.integration

APP = ("app", "app_pass", "app")
SCRAM = ("scram_user", "scram_pass", "app")


def _direct(pg_cluster: TempCluster) -> str:
    return f"host={pg_cluster.host} port={pg_cluster.port}"


def _workers(proc: PgtarnProcess, count: int = 2) -> list[int]:
    pids = wait_children(proc.proc.pid, count)
    assert len(pids) == count, f"workers: {pids}"
    return pids


def _busy(
    proc: PgtarnProcess, logins: list[tuple[str, str, str]], rounds: int = 8
) -> tuple[set[int], list[int]]:
    """Every login runs rounds short transactions at once; the backend pids that served
    them, and how many of the clients each worker held."""
    pids = _workers(proc)

    async def scenario() -> tuple[set[int], list[int]]:
        clients = [await aconnect(proc, *login) for login in logins]
        spread = [tcp_clients(pid, proc.port) for pid in pids]

        async def one(c: asyncpg.Connection) -> set[int]:
            served = set()
            for _ in range(rounds):
                async with c.transaction():
                    served.add(await c.fetchval("select pg_backend_pid() from pg_sleep(0.01)"))
            return served

        results = await asyncio.gather(*(one(c) for c in clients))
        for c in clients:
            await c.close()
        return set().union(*results), spread

    return asyncio.run(scenario())


def test_pool_size_holds_for_all_workers_in_pg_stat_activity(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"workers": 2, "default_pool_size": 4, "max_client_conn": 100})
    wait_quiet(pg_cluster, ("app",), "app")
    with PeakBackends(pg_cluster, ("app",), "app") as peak:
        served, spread = _busy(proc, [APP] * 40)
    assert all(spread) and sum(spread) == 40, spread  # both workers had busy clients
    assert peak.samples > 0 and 1 <= peak.peak <= 4, peak.peak
    assert served


def test_max_db_connections_holds_for_all_workers(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(
        settings={"workers": 2, "max_client_conn": 100},
        databases={"app": f"{_direct(pg_cluster)} dbname=app max_db_connections=3"},
    )
    wait_quiet(pg_cluster, ("app", "scram_user"), "app")
    with PeakBackends(pg_cluster, ("app", "scram_user"), "app") as peak:
        _served, spread = _busy(proc, [APP] * 12 + [SCRAM] * 12)
    assert all(spread), spread
    assert peak.samples > 0 and 1 <= peak.peak <= 3, peak.peak


def test_max_user_connections_holds_for_all_workers(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(
        settings={"workers": 2, "max_client_conn": 100},
        users={"scram_user": "max_user_connections=2"},
    )
    logins = [SCRAM] * 10 + [("scram_user", "scram_pass", "postgres")] * 10
    wait_quiet(pg_cluster, ("scram_user",), None)
    with PeakBackends(pg_cluster, ("scram_user",), None) as peak:
        _served, spread = _busy(proc, logins)
    assert all(spread), spread
    assert peak.samples > 0 and 1 <= peak.peak <= 2, peak.peak


def test_max_client_conn_counts_the_clients_of_every_worker(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2, "max_client_conn": 10})
    pids = _workers(proc)

    async def scenario() -> tuple[list[int], list[str], int]:
        clients = [await aconnect(proc) for _ in range(10)]
        spread = [tcp_clients(pid, proc.port) for pid in pids]
        refusals, admitted = await _tries(proc, 8)
        for c in clients[:1]:
            await c.close()
        # one left: one more gets in
        again = await aconnect(proc)
        assert await again.fetchval("select 1") == 1
        await again.close()
        for c in clients[1:]:
            await c.close()
        return spread, refusals, admitted

    spread, refusals, admitted = asyncio.run(scenario())
    assert all(spread) and sum(spread) == 10, spread
    assert admitted == 0, "an 11th client got in"
    assert len(refusals) == 8
    assert all(r == "53300 no more connections allowed (max_client_conn)" for r in refusals), (
        refusals
    )


def test_max_client_conn_stays_exact_with_spare_places_in_every_worker(
    pgtarn_factory: PgtarnFactory,
) -> None:
    # each worker holds client places for logins to come (a lease): the limit must still be
    # exact, whichever worker holds the spare places and whichever gets the next client
    proc = pgtarn_factory(settings={"workers": 2, "max_client_conn": 6})
    first, second = _workers(proc)

    async def scenario() -> tuple[list[str], int]:
        for _ in range(12):  # logins on both workers, gone again: their places stay
            churn = await aconnect(proc)
            await churn.close()
        on_first = await _client_on(proc, first)
        on_second = await _client_on(proc, second)
        others = [await aconnect(proc) for _ in range(4)]
        refusals, _admitted = await _tries(proc, 8)
        await on_first.close()
        # the free place is the first worker's: a client of the second gets it, once the
        # first worker has seen its client leave (until then a refusal is right)
        deadline = time.monotonic() + 10
        while True:
            try:
                moved = await _client_on(proc, second)
                break
            except asyncpg.PostgresError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        answer = await moved.fetchval("select 1")
        try:
            extra = await aconnect(proc)
        except asyncpg.PostgresError as exc:
            refusals.append(f"{exc.sqlstate} {exc}")
        else:
            await extra.close()
        for c in [on_second, moved, *others]:
            await c.close()
        return refusals, answer

    refusals, answer = asyncio.run(scenario())
    assert answer == 1
    assert refusals == ["53300 no more connections allowed (max_client_conn)"] * 9


async def _client_on(
    proc: PgtarnProcess, pid: int, login: tuple[str, ...] = ()
) -> asyncpg.Connection:
    """A client (of login, else the default one) that the kernel gave to the worker pid."""
    for _ in range(100):
        before = tcp_clients(pid, proc.port)
        client = await aconnect(proc, *login)
        if tcp_clients(pid, proc.port) > before:
            return client
        await client.close()
    raise AssertionError(f"no client landed on worker {pid}")


async def _tries(
    proc: PgtarnProcess, count: int, login: tuple[str, ...] = ()
) -> tuple[list[str], int]:
    """count logins, each on whichever worker the kernel hands it to and closed at once if
    it gets in: the refusals ("SQLSTATE message") and how many got in."""
    refusals: list[str] = []
    admitted = 0
    for _ in range(count):
        try:
            extra = await aconnect(proc, *login)
        except asyncpg.PostgresError as exc:
            refusals.append(f"{exc.sqlstate} {exc}")
            continue
        await extra.close()
        admitted += 1
    return refusals, admitted


def test_a_waiting_client_gets_the_server_idle_in_the_other_worker(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"workers": 2, "default_pool_size": 1, "query_wait_timeout": 60})
    first, second = _workers(proc)
    admin = superuser_connect(pg_cluster)

    async def scenario() -> tuple[float, float]:
        a = await _client_on(proc, first)
        b = await _client_on(proc, second)
        pid_a = await a.fetchval("select pg_backend_pid()")  # its server, idle in `first`
        t0 = time.monotonic()
        pid_b = await asyncio.wait_for(b.fetchval("select pg_backend_pid()"), 30)
        idle_wait = time.monotonic() - t0
        assert pid_b != pid_a  # a new server, in the other worker
        # busy the other way round: b's worker holds the slot through transactions
        busy = asyncio.Event()

        async def keep_busy() -> None:
            while not busy.is_set():
                async with b.transaction():
                    await b.fetchval("select pg_sleep(0.05)")

        task = asyncio.ensure_future(keep_busy())
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        assert await asyncio.wait_for(a.fetchval("select 7"), 30) == 7
        busy_wait = time.monotonic() - t0
        busy.set()
        await task
        await a.close()
        await b.close()
        return idle_wait, busy_wait

    wait_quiet(pg_cluster, ("app",), "app")
    with PeakBackends(pg_cluster, ("app",), "app") as peak:
        idle_wait, busy_wait = asyncio.run(scenario())
    admin.close()
    print(
        f"\nwait for a server idle in the other worker: {idle_wait * 1000:.1f} ms; "
        f"busy in the other worker: {busy_wait * 1000:.1f} ms"
    )
    assert peak.peak == 1, peak.peak


def test_a_killed_workers_slots_come_back(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"workers": 2, "default_pool_size": 2, "query_wait_timeout": 60})
    victim, survivor = _workers(proc)
    admin = superuser_connect(pg_cluster)

    async def scenario() -> None:
        waiting = [await _client_on(proc, survivor) for _ in range(2)]
        held = [await _client_on(proc, victim) for _ in range(2)]
        for c in held:  # an open transaction holds its server
            await c.execute("begin; select 1")
        queries = [
            asyncio.ensure_future(c.fetchval("select pg_backend_pid() from pg_sleep(0.3)"))
            for c in waiting
        ]
        await asyncio.sleep(1.5)
        assert not any(q.done() for q in queries)  # the pool is full, in the other worker
        os.kill(victim, signal.SIGKILL)
        served = await asyncio.wait_for(asyncio.gather(*queries), 30)
        assert len(set(served)) == 2  # the whole pool, both servers, for the survivor
        for c in held:  # they died with their worker
            c.terminate()
        for c in waiting:
            await c.close()

    asyncio.run(scenario())
    wait_until(lambda: len(backend_pids(admin)) <= 2, 10, "the pool within its size")
    admin.close()
    assert "exited unexpectedly" in proc.log_text()


def test_the_admin_console_counts_every_workers_sessions(pgtarn_factory: PgtarnFactory) -> None:
    """The admin console is a database with the global max_db_client_connections, counted
    across the workers as any other (admin_users get past it)."""
    proc = pgtarn_factory(
        settings={"workers": 2, "max_db_client_connections": 2, "stats_users": "scram_user"}
    )
    pids = _workers(proc)
    console = ("scram_user", "scram_pass", "pgbouncer")

    async def scenario() -> list[str]:
        held = [await _client_on(proc, pids[0], console) for _ in range(2)]
        refusals, _admitted = await _tries(proc, 8, console)  # about half on the other worker
        admin = await aconnect(proc, *APP[:2], "pgbouncer")  # app is in admin_users
        await admin.close()
        for c in held:
            await c.close()
        return refusals

    refusals = asyncio.run(scenario())
    assert refusals == ["53300 client connections exceeded (max_db_client_connections)"] * 8
