"""workers = N against a real cluster: one port served by several processes, faults."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

from tests.support.procs import children, tcp_clients, wait_children

from .drivers import connect

pytestmark = pytest.mark.integration


def _workers(proc, count: int = 2) -> list[int]:  # type: ignore[no-untyped-def]
    pids = wait_children(proc.proc.pid, count)
    assert len(pids) == count, f"workers: {pids}"
    return pids


def test_workers_share_the_tcp_port_and_the_unix_socket(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    clients = [connect(proc, autocommit=True) for _ in range(24)]
    for c in clients:
        assert c.execute("select 1").fetchone() == (1,)
    # the kernel spread the TCP clients over both workers (SO_REUSEPORT)
    held = [tcp_clients(pid, proc.port) for pid in pids]
    assert sum(held) == 24 and all(held), held
    unix = [psycopg.connect(host=proc.socket_dir, port=proc.port, dbname="app", user="app",
                            password="app_pass", autocommit=True) for _ in range(4)]
    for c in unix:
        assert c.execute("select 2").fetchone() == (2,)
    for c in clients + unix:
        c.close()
    assert proc.proc.poll() is None


def test_a_killed_worker_is_restarted_and_the_others_go_on(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    clients = [connect(proc, autocommit=True) for _ in range(16)]
    victim = pids[0]
    on_victim = tcp_clients(victim, proc.port)
    assert 0 < on_victim < 16
    os.kill(victim, signal.SIGKILL)
    new = wait_children(proc.proc.pid, 2, exclude=(victim,))
    assert len(new) == 2 and victim not in new, new
    lost = kept = 0
    for c in clients:
        try:
            c.execute("select 1")
            kept += 1
        except psycopg.OperationalError:
            lost += 1
    assert (lost, kept) == (on_victim, 16 - on_victim)  # the dead worker's clients only
    for _ in range(10):  # new clients are served, by both workers
        with connect(proc) as c:
            assert c.execute("select 3").fetchone() == (3,)
    assert "worker 0 (pid" in proc.log_text() or "worker 1 (pid" in proc.log_text()
    assert "exited unexpectedly" in proc.log_text()
    for c in clients:
        c.close()


def test_sigterm_stops_the_supervisor_and_every_worker(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    proc.send_signal(signal.SIGTERM)
    proc.proc.wait(timeout=15)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def test_without_its_supervisor_a_worker_drains_its_clients_then_exits(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    clients = [connect(proc, autocommit=True) for _ in range(8)]
    proc.proc.kill()  # the supervisor, without a chance to stop its workers
    proc.proc.wait(timeout=5)
    time.sleep(0.5)
    # the workers still serve the clients they have...
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and not _zombie(pid)]
    assert alive == pids
    for c in clients:
        assert c.execute("select 4").fetchone() == (4,)
    # ...take no new ones...
    with pytest.raises(psycopg.OperationalError):
        connect(proc, connect_timeout=2)
    # ...and exit when those are gone
    for c in clients:
        c.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
            os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in pids):
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in pids)
    assert children(proc.proc.pid) == []


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"
