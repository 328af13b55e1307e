"""Checks of the fault-injecting proxy itself, in front of the real cluster."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from .drivers import aconnect, connect
from .faultproxy import FaultProxy

QUICK: dict[str, Any] = {"connect_timeout": 2}


def _refused(proxy: FaultProxy) -> bool:
    try:
        with socket.create_connection((proxy.host, proxy.port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def _wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_query_through_proxy(fault_proxy: FaultProxy) -> None:
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        assert conn.execute("select count(*) from items").fetchone() == (3,)
        assert fault_proxy.active() == 1
        big = conn.execute("select repeat('x', 5000000)").fetchone()
        assert big is not None and len(big[0]) == 5_000_000
    assert fault_proxy.accepted == 1
    assert _wait_for(lambda: fault_proxy.active() == 0)


def test_cut_breaks_open_connection_only(fault_proxy: FaultProxy) -> None:
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert fault_proxy.cut() == 1
        assert fault_proxy.active() == 0
        with pytest.raises(psycopg.OperationalError):
            conn.execute("select 1")
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        assert conn.execute("select 2").fetchone() == (2,)
    assert _wait_for(lambda: fault_proxy.active() == 0)  # a clean close ends the pair
    assert fault_proxy.cut() == 0


def test_down_refuses_and_up_listens_on_same_port(fault_proxy: FaultProxy) -> None:
    port = fault_proxy.port
    conn = connect(fault_proxy, autocommit=True, **QUICK)
    with conn:
        fault_proxy.down()
        assert _refused(fault_proxy)
        with pytest.raises(psycopg.OperationalError, match=r"(?i)refused"):
            connect(fault_proxy, **QUICK)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("select 1")
    fault_proxy.up()
    fault_proxy.up()  # no-op when listening
    assert fault_proxy.port == port
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        assert conn.execute("select 3").fetchone() == (3,)


def test_blackhole_hangs_connects_until_lifted(fault_proxy: FaultProxy) -> None:
    fault_proxy.blackhole()
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        connect(fault_proxy, connect_timeout=1)
    assert time.monotonic() - started < 10
    assert fault_proxy.accepted >= 1
    fault_proxy.blackhole(False)
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        assert conn.execute("select 4").fetchone() == (4,)


def test_blackhole_stalls_open_connection_and_resumes(fault_proxy: FaultProxy) -> None:
    with (
        connect(fault_proxy, autocommit=True, **QUICK) as conn,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        fault_proxy.blackhole()
        future = pool.submit(lambda: conn.execute("select 5").fetchone())
        time.sleep(0.5)
        assert not future.done()
        assert fault_proxy.active() == 1
        fault_proxy.blackhole(False)
        assert future.result(timeout=5) == (5,)


def test_backpressure_bounds_buffering() -> None:
    """A client that does not read makes the upstream's sends block, not the proxy buffer."""
    total = 64 * 1024 * 1024
    chunk = b"x" * 65536
    sent = 0
    done = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(5)

        def serve() -> None:
            nonlocal sent
            peer, _ = listener.accept()
            with peer:
                peer.settimeout(10)
                while sent < total:
                    peer.sendall(chunk)
                    sent += len(chunk)
            done.set()

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        with (
            FaultProxy("127.0.0.1", listener.getsockname()[1]) as proxy,
            socket.create_connection((proxy.host, proxy.port), timeout=5) as client,
        ):
            time.sleep(0.5)
            assert not done.is_set()
            assert sent < total // 2  # kernel buffers plus the proxy's bounded buffer
            received = 0
            while received < total:
                data = client.recv(1 << 20)
                assert data
                received += len(data)
            assert client.recv(1) == b""  # the upstream's close reaches the client
        server.join(5)
        assert done.is_set() and sent == total == received


def test_asyncio_client_in_main_thread(fault_proxy: FaultProxy) -> None:
    async def run() -> object:
        conn = await aconnect(fault_proxy, timeout=2)
        try:
            return await conn.fetchval("select count(*) from items")
        finally:
            await conn.close()

    assert asyncio.run(run()) == 3
    assert _wait_for(lambda: fault_proxy.active() == 0)  # the proxy outlives that loop


def test_stall_connects_hangs_new_connects_and_keeps_open_ones(fault_proxy: FaultProxy) -> None:
    port = fault_proxy.port
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        fault_proxy.stall_connects()
        probe = socket.socket()
        probe.settimeout(0.5)
        with pytest.raises(TimeoutError):  # no answer at all: neither accepted nor refused
            probe.connect((fault_proxy.host, port))
        probe.close()
        assert conn.execute("select 4").fetchone() == (4,)  # the open pair still forwards
        fault_proxy.stall_connects(False)
    assert fault_proxy.port == port
    with connect(fault_proxy, autocommit=True, **QUICK) as conn:
        assert conn.execute("select 5").fetchone() == (5,)
