"""workers = N against a real cluster: one port served by several processes, faults."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from pathlib import Path

import psycopg
import pytest

from pgtarn.errors import PgtarnError
from pgtarn.process.supervisor import Supervisor
from pgtarn.proto import build
from pgtarn.proto.cancelkey import worker_of
from tests.support import PgtarnProcess, free_port
from tests.support.procs import children, holder_of, tcp_clients, wait_children

from .conftest import PgtarnFactory
from .drivers import connect
from .faultproxy import FaultProxy
from .pgstat import wait_until
from .rawpg import AsyncRawClient
from .test_admin import admin, pool_row
from .test_peers import _wait_running

pytestmark = pytest.mark.integration


def _workers(proc: PgtarnProcess, count: int = 2) -> list[int]:
    pids = wait_children(proc.proc.pid, count)
    assert len(pids) == count, f"workers: {pids}"
    return pids


def test_workers_share_the_tcp_port_and_the_unix_socket(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    clients = [connect(proc, autocommit=True) for _ in range(24)]
    for c in clients:
        assert c.execute("select 1").fetchone() == (1,)
    # the kernel spread the TCP clients over both workers (SO_REUSEPORT)
    held = [tcp_clients(pid, proc.port) for pid in pids]
    assert sum(held) == 24 and all(held), held
    unix = [
        psycopg.connect(
            host=proc.socket_dir,
            port=proc.port,
            dbname="app",
            user="app",
            password="app_pass",
            autocommit=True,
        )
        for _ in range(4)
    ]
    for c in unix:
        assert c.execute("select 2").fetchone() == (2,)
    for c in clients + unix:
        c.close()
    assert proc.proc.poll() is None


def _shared_dirty_kb(pid: int) -> int:
    """Pages a process has written and still shares with another: after a fork, the
    parent's heap until one of them writes to it (an exec'd process shares none of those)."""
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            if line.startswith("Shared_Dirty:"):
                return int(line.split()[1])
    raise AssertionError(f"no Shared_Dirty for {pid}")


def test_workers_are_forked_and_share_the_supervisors_pages(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    with connect(proc) as c:
        assert c.execute("select 1").fetchone() == (1,)
    # the imported code, several MB, is in the supervisor's heap once, not once per worker
    shared = [_shared_dirty_kb(pid) for pid in pids]
    assert all(kb > 2048 for kb in shared), shared


def test_without_a_worker_entry_the_workers_are_started_as_python_m_pgtarn(
    tmp_path: Path,
) -> None:
    """The start that remains where forking is not safe: each worker a process of its own."""
    (tmp_path / "userlist.txt").write_text('"app" "app_pass"\n', encoding="utf-8")
    ini = tmp_path / "pgtarn.ini"
    ini.write_text(
        "[databases]\napp = host=127.0.0.1 port=1 dbname=app\n\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {free_port()}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {tmp_path / 'userlist.txt'}\nworkers = 2\n",
        encoding="utf-8",
    )
    logger = logging.getLogger("pgtarn")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate

    async def supervise() -> list[str]:
        supervisor = Supervisor(str(ini), quiet=True)
        running = asyncio.ensure_future(supervisor.run())
        pids = await asyncio.to_thread(wait_children, os.getpid(), 2)
        argv = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in pids]
        supervisor.stop(signal.SIGTERM)
        assert await asyncio.wait_for(running, 15) == 0
        return [" ".join(a.decode() for a in args) for args in argv]

    try:
        commands = asyncio.run(supervise())
    finally:
        # (the supervisor set up pgtarn's logging in this process; the tests after it log)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
    assert len(commands) == 2 and all("-m pgtarn --worker" in c for c in commands), commands


def test_a_killed_worker_is_restarted_and_the_others_go_on(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    clients = [connect(proc, autocommit=True) for _ in range(16)]
    victim = pids[0]
    on_victim = tcp_clients(victim, proc.port)
    assert 0 < on_victim < 16
    os.kill(victim, signal.SIGKILL)
    new = wait_children(proc.proc.pid, 2, exclude=(victim,))
    assert len(new) == 2 and victim not in new, new
    # the restarted worker is forked too (after the others: their pages still shared)
    restarted = next(pid for pid in new if pid not in pids)
    assert _shared_dirty_kb(restarted) > 2048
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


def test_sigterm_stops_the_supervisor_and_every_worker(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    proc.send_signal(signal.SIGTERM)
    proc.proc.wait(timeout=15)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def test_without_its_supervisor_a_worker_drains_its_clients_then_exits(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)
    clients = [connect(proc, autocommit=True) for _ in range(8)]
    # The premise: each worker holds clients. The kernel spreads them (SO_REUSEPORT) and
    # may put all 8 on one worker; the other would then exit at once, as it should.
    while not all(tcp_clients(pid, proc.port) for pid in pids) and len(clients) < 64:
        clients.append(connect(proc, autocommit=True))
    held = [tcp_clients(pid, proc.port) for pid in pids]
    assert all(held), held
    proc.proc.kill()  # the supervisor, without a chance to stop its workers
    proc.proc.wait(timeout=5)
    time.sleep(0.5)
    # the workers still serve the clients they have...
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and not _zombie(pid)]
    assert alive == pids, (alive, pids, held)
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
        os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in pids
    ):
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


def _connection_to(proc: PgtarnProcess, pids: list[int], worker_pid: int) -> socket.socket:
    """A TCP connection to proc that the kernel gave to the worker worker_pid."""
    for _ in range(200):
        sock = socket.create_connection((proc.host, proc.port))
        deadline = time.monotonic() + 2
        holder = None
        while holder is None and time.monotonic() < deadline:
            holder = holder_of(pids, proc.port, sock.getsockname()[1])
        if holder == worker_pid:
            return sock
        sock.close()
    raise AssertionError(f"no connection landed on {worker_pid}")


def test_a_cancel_that_lands_on_another_worker_reaches_the_client(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)

    async def scenario() -> tuple[str | None, float, int, int]:
        client = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
        try:
            owner = holder_of(pids, proc.port, client.writer.get_extra_info("sockname")[1])
            assert owner in pids
            other = next(pid for pid in pids if pid != owner)
            tag = f"workers-{time.monotonic_ns()}"
            started = time.monotonic()
            running = asyncio.create_task(client.query(f"select '{tag}' from pg_sleep(30)"))
            await _wait_running(pg_dsn, tag)
            sock = await asyncio.to_thread(_connection_to, proc, pids, other)
            sock.sendall(build.cancel_request(*client.backend_key))
            sock.settimeout(10)
            assert sock.recv(1) == b""  # closed once handled
            sock.close()
            try:
                await running
            except PgtarnError as exc:
                return exc.sqlstate, time.monotonic() - started, owner, other
            return None, time.monotonic() - started, owner, other
        finally:
            await client.close()

    sqlstate, took, owner, other = asyncio.run(scenario())
    assert sqlstate == "57014" and took < 20, (sqlstate, took)
    assert owner != other


def test_a_cancel_sent_on_to_another_worker_closes_when_that_workers_cancel_ends(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy, pg_dsn: str
) -> None:
    """The client's cancel connection, on the other worker, stays open while the owner's
    cancel to PostgreSQL is under way (here it cannot connect: the proxy takes no new
    connections), and closes when that cancel gives up."""
    proc = pgtarn_factory(
        databases={"app": f"host={fault_proxy.host} port={fault_proxy.port} dbname=app"},
        settings={"workers": 2, "cancel_wait_timeout": 2},
    )
    pids = _workers(proc)

    def in_flight() -> int:
        with admin(proc) as console:
            return int(pool_row(console)["sv_active_cancel"])

    async def scenario() -> tuple[list[list[str | None]], bytes]:
        client = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
        try:
            owner = holder_of(pids, proc.port, client.writer.get_extra_info("sockname")[1])
            other = next(pid for pid in pids if pid != owner)
            tag = f"workers-{time.monotonic_ns()}"
            running = asyncio.create_task(client.query(f"select '{tag}' from pg_sleep(1)"))
            await _wait_running(pg_dsn, tag)
            sock = await asyncio.to_thread(_connection_to, proc, pids, other)
            fault_proxy.stall_connects()
            try:
                sock.sendall(build.cancel_request(*client.backend_key))
                await asyncio.to_thread(
                    wait_until, lambda: in_flight() == 1, 10.0, "the owner's cancel"
                )
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):  # still open: the cancel is under way
                    sock.recv(1)
                sock.setblocking(True)
                sock.settimeout(10)
                closed = await asyncio.to_thread(sock.recv, 1)
            finally:
                fault_proxy.stall_connects(False)
                sock.close()
            return await running, closed
        finally:
            await client.close()

    rows, closed = asyncio.run(scenario())
    assert closed == b""
    assert rows[0][0] is not None and rows[0][0].startswith("workers-")  # not cancelled


def test_keys_name_the_worker_that_owns_the_client(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"workers": 2})
    pids = _workers(proc)

    async def keys() -> dict[int, set[int]]:
        seen: dict[int, set[int]] = {}
        for _ in range(12):
            client = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
            owner = holder_of(pids, proc.port, client.writer.get_extra_info("sockname")[1])
            assert owner is not None
            seen.setdefault(owner, set()).add(worker_of(client.backend_key))
            await client.close()
        return seen

    seen = asyncio.run(keys())
    # each worker puts its own index (0 or 1) in its keys, and the two differ
    assert all(len(indexes) == 1 and indexes <= {0, 1} for indexes in seen.values()), seen
    if len(seen) == 2:
        assert len(set.union(*seen.values())) == 2
