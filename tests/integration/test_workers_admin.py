"""workers = N: one admin console and one metrics endpoint for the whole pgtarn."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, free_port
from tests.support.procs import tcp_clients, wait_children

from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_for, wait_until
from .test_admin import Waiter, admin, pool_row, show
from .test_metrics import scrape, value

pytestmark = pytest.mark.integration


def _spread(proc: PgtarnProcess, count: int) -> list[psycopg.Connection[Any]]:
    """count autocommit clients, held by both workers (the kernel spreads them; when it
    gave them all to one, one more is opened in place of one of that worker's)."""
    pids = wait_children(proc.proc.pid, 2)
    assert len(pids) == 2, pids
    clients = [connect(proc, autocommit=True) for _ in range(count)]
    for _ in range(50):
        held = [tcp_clients(pid, proc.port) for pid in pids]
        if all(held):
            break
        clients.pop(0).close()
        clients.append(connect(proc, autocommit=True))
    deadline = time.monotonic() + 5  # a client closed above may take a moment to go
    while True:
        held = [tcp_clients(pid, proc.port) for pid in pids]
        if sum(held) == count or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sum(held) == count and all(held), held
    return clients


def _worker_of(conn: psycopg.Connection[Any], name: str) -> int:
    """The worker an admin session named name (its application_name) is served by."""
    rows = [r for r in show(conn, "CLIENTS") if r["application_name"] == name]
    assert len(rows) == 1, rows
    return int(rows[0]["worker"])


def _admins(proc: PgtarnProcess) -> dict[int, psycopg.Connection[Any]]:
    """An admin session on each worker."""
    found: dict[int, psycopg.Connection[Any]] = {}
    for attempt in range(60):
        name = f"console{attempt}"
        conn = admin(proc, application_name=name)
        worker = _worker_of(conn, name)
        if worker in found:
            conn.close()
        else:
            found[worker] = conn
        if len(found) == 2:
            return found
    raise AssertionError(f"no admin session reached both workers: {sorted(found)}")


def _config(conn: psycopg.Connection[Any], key: str) -> str:
    return str(next(r["value"] for r in show(conn, "CONFIG") if r["key"] == key))


def test_show_lists_and_sums_the_clients_and_stats_of_every_worker(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    clients = _spread(proc, 12)
    for c in clients:
        for _ in range(3):
            c.execute("select 1")
    held = sorted(tcp_clients(pid, proc.port) for pid in wait_children(proc.proc.pid, 2))
    with admin(proc) as a:
        rows = [r for r in show(a, "CLIENTS") if r["database"] == "app"]
        assert len(rows) == 12
        per_worker = [sum(1 for r in rows if r["worker"] == w) for w in (0, 1)]
        assert sorted(per_worker) == held
        assert len({r["id"] for r in rows}) == 12  # ids unique across workers
        assert pool_row(a)["cl_active"] == 12
        servers = show(a, "SERVERS")
        assert {r["worker"] for r in servers} == {0, 1}
        assert wait_for(
            lambda: (
                next(r["xact_count"] for r in show(a, "STATS_TOTALS") if r["database"] == "app")
                == 36
            )
        )
        stats = next(r for r in show(a, "STATS") if r["database"] == "app")
        assert stats["total_xact_count"] == 36 and stats["total_query_count"] == 36
        lists = {r["list"]: r["items"] for r in show(a, "LISTS")}
        assert lists["used_clients"] == 13  # the console too
        database = next(r for r in show(a, "DATABASES") if r["name"] == "app")
        assert database["current_client_connections"] == 12
    for c in clients:
        c.close()


def test_kill_client_reaches_a_client_of_the_other_worker(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    clients = _spread(proc, 8)
    for i, c in enumerate(clients):
        c.execute(f"set application_name = 'c{i}'")
    with admin(proc, application_name="killer") as a:
        here = _worker_of(a, "killer")
        victim = next(
            r for r in show(a, "CLIENTS") if r["database"] == "app" and r["worker"] != here
        )
        a.execute(f"KILL_CLIENT {victim['id']}")
        index = int(victim["application_name"][1:])
        with pytest.raises(psycopg.OperationalError):
            clients[index].execute("select 1")
        assert len([r for r in show(a, "CLIENTS") if r["database"] == "app"]) == 7
    for c in clients:
        c.close()


def test_pause_on_one_worker_pauses_the_other_workers_clients(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    clients = _spread(proc, 6)
    for c in clients:
        c.close()
    consoles = _admins(proc)
    consoles[0].execute("PAUSE app")
    for conn in consoles.values():
        assert next(r["paused"] for r in show(conn, "DATABASES") if r["name"] == "app") == 1
    waiters = [Waiter(proc, "select 5") for _ in range(8)]
    pids = wait_children(proc.proc.pid, 2)
    # clients waiting in both workers (each also holds one console)
    assert all(tcp_clients(pid, proc.port) > 1 for pid in pids)
    for w in waiters:
        w.start()
    wait_until(lambda: pool_row(consoles[1])["cl_waiting"] == 8, what="8 clients waiting")
    assert all(w.is_alive() for w in waiters)
    consoles[1].execute("RESUME app")
    for w in waiters:
        w.join(15)
        assert w.error is None and w.result == [(5,)]
        w.conn.close()
    for conn in consoles.values():
        conn.close()


def test_reload_set_and_sighup_reach_every_worker(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2, "default_pool_size": 5})
    consoles = _admins(proc)
    consoles[1].execute("SET default_pool_size = 7")
    for conn in consoles.values():
        assert _config(conn, "default_pool_size") == "7"
    ini = Path(proc.ini_path)
    ini.write_text(
        re.sub(
            r"(?m)^default_pool_size\s*=.*$",
            "default_pool_size = 9",
            ini.read_text(encoding="utf-8"),
        ),
        encoding="utf-8",
    )
    consoles[0].execute("RELOAD")
    for conn in consoles.values():
        assert _config(conn, "default_pool_size") == "9"
    ini.write_text(
        re.sub(
            r"(?m)^default_pool_size\s*=.*$",
            "default_pool_size = 11",
            ini.read_text(encoding="utf-8"),
        ),
        encoding="utf-8",
    )
    proc.send_signal(signal.SIGHUP)
    for conn in consoles.values():

        def reloaded(console: psycopg.Connection[Any] = conn) -> bool:
            return _config(console, "default_pool_size") == "11"

        assert wait_for(reloaded)
    for conn in consoles.values():
        conn.close()


def test_shutdown_on_one_worker_stops_the_whole_pgtarn(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = wait_children(proc.proc.pid, 2)
    a = admin(proc)
    with pytest.raises(psycopg.OperationalError):
        a.execute("SHUTDOWN")
    assert proc.proc.wait(timeout=15) == 0
    assert not any(
        Path(f"/proc/{pid}/status").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text()
        for pid in pids
    )
    assert "exited unexpectedly" not in proc.log_text()


def test_the_metrics_endpoint_counts_every_workers_clients(pgtarn_factory: PgtarnFactory) -> None:
    port = free_port()
    proc = pgtarn_factory(settings={"workers": 2, "metrics_port": port})
    clients = _spread(proc, 10)
    for c in clients:
        c.execute("select 1")
    assert wait_for(
        lambda: (
            value(scrape(port), "pgtarn_stats_sql_transactions_pooled_total", database="app") == 10
        )
    )
    samples = scrape(port)
    assert (
        value(samples, "pgtarn_pools_client_active_connections", database="app", user="app") == 10
    )
    per_worker = [value(samples, "pgtarn_worker_client_connections", worker=str(w)) for w in (0, 1)]
    held = sorted(tcp_clients(pid, proc.port) for pid in wait_children(proc.proc.pid, 2))
    assert sorted(per_worker) == held
    assert all(value(samples, "pgtarn_worker_cpu_seconds_total", worker=str(w)) > 0 for w in (0, 1))
    for c in clients:
        c.close()


def test_signals_reach_every_worker(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = wait_children(proc.proc.pid, 2)
    consoles = _admins(proc)

    def state(conn: psycopg.Connection[Any]) -> str:
        return str(next(r["value"] for r in show(conn, "STATE") if r["key"] == "paused"))

    proc.send_signal(signal.SIGUSR1)
    # the merged STATE says "yes" only when every worker has paused
    wait_until(lambda: state(consoles[0]) == "yes", what="every worker paused")
    proc.send_signal(signal.SIGUSR2)
    wait_until(lambda: state(consoles[1]) == "no", what="every worker resumed")
    for conn in consoles.values():
        conn.close()
    proc.send_signal(signal.SIGINT)
    assert proc.proc.wait(timeout=15) == 0
    assert not any(
        Path(f"/proc/{pid}/status").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text()
        for pid in pids
    )


def test_wait_close_waits_for_the_servers_of_every_worker(pgtarn_factory: PgtarnFactory) -> None:
    # a server for each of the 6 clients (the pool size holds for both workers together)
    proc = pgtarn_factory(settings={"workers": 2, "default_pool_size": 10})
    clients = _spread(proc, 6)
    for i, c in enumerate(clients):
        c.execute(f"set application_name = 'c{i}'")
        c.execute("begin")
        c.execute("select 1")  # a server each, held in the transaction
    with admin(proc, application_name="waiter") as a:
        here = _worker_of(a, "waiter")
        by_worker: dict[int, list[int]] = {0: [], 1: []}
        for row in show(a, "CLIENTS"):
            if row["database"] == "app":
                by_worker[int(row["worker"])].append(int(row["application_name"][1:]))
        a.execute("RECONNECT app")
        done: list[str] = []
        t = threading.Thread(
            target=lambda: done.append(a.execute("WAIT_CLOSE app").statusmessage or ""), daemon=True
        )
        t.start()
        t.join(0.5)
        assert t.is_alive()
        for i in by_worker[here]:
            clients[i].execute("commit")
        t.join(0.5)
        assert t.is_alive()  # the other worker's servers are still in their transactions
        for i in by_worker[1 - here]:
            clients[i].execute("commit")
        t.join(15)
        assert done == ["WAIT_CLOSE"]
    for c in clients:
        c.close()
