"""net.sockets: socket tuning, addresses, and the CancelRequest sent on a new connection."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable
from typing import Any

import pytest

from pgtarn.config import Config, DatabaseEntry
from pgtarn.net import sockets
from pgtarn.proto import build

from ..server.fakes import FakeTransport


class FakeSocket:
    def __init__(self, family: int) -> None:
        self.family = family
        self.options: list[tuple[int, int, int]] = []

    def setsockopt(self, level: int, name: int, value: int) -> None:
        self.options.append((level, name, value))


def test_tune_sets_nodelay_and_keepalive_on_tcp_only() -> None:
    transport = FakeTransport()
    tcp = FakeSocket(socket.AF_INET)
    transport.extra["socket"] = tcp
    assert sockets.tune(transport, keepalive=True)  # type: ignore[arg-type]
    assert tcp.options == [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
                           (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    unix = FakeSocket(socket.AF_UNIX)
    transport.extra["socket"] = unix
    assert not sockets.tune(transport, keepalive=True)  # type: ignore[arg-type]
    assert unix.options == []


def test_address() -> None:
    assert sockets.address(("10.0.0.1", 6432)) == "10.0.0.1:6432"
    assert sockets.address("/tmp/.s.PGSQL.5432") == "/tmp/.s.PGSQL.5432"
    assert sockets.address("") == "unix"
    assert sockets.address(None) == "unix"


def cancel(monkeypatch: pytest.MonkeyPatch, still_wanted: bool, fails: bool = False,
           **settings: Any) -> tuple[FakeTransport, list[float]]:
    """send_cancel_request with open_connection faked: the transport it got, the timeouts."""
    transport = FakeTransport()
    timeouts: list[float] = []

    async def fake_open(db: DatabaseEntry, factory: Callable[[], asyncio.Protocol],
                        timeout: float, socket_dir: str = "/tmp") -> None:
        timeouts.append(timeout)
        if fails:
            raise TimeoutError
        factory().connection_made(transport)  # type: ignore[arg-type]

    monkeypatch.setattr(sockets, "open_connection", fake_open)
    config = dataclasses.replace(Config(), **settings)
    db = DatabaseEntry(name="app", host="127.0.0.1", port=5432)
    asyncio.run(sockets.send_cancel_request(db, 11, 22, config, lambda: still_wanted))
    return transport, timeouts


def test_a_cancel_still_wanted_is_sent_once_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    transport, timeouts = cancel(monkeypatch, True, cancel_wait_timeout=3.0)
    assert transport.take() == build.cancel_request(11, 22) and transport.closing
    assert timeouts == [3.0]


def test_a_cancel_no_longer_wanted_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    transport, _ = cancel(monkeypatch, False)
    assert transport.take() == b"" and transport.closing


def test_a_cancel_that_cannot_connect_is_logged_with_its_timeout(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pgtarn.server"):
        _, timeouts = cancel(monkeypatch, True, fails=True, cancel_wait_timeout=0.0,
                             server_connect_timeout=7.0)
    assert timeouts == [7.0]
    assert "cancel_wait_timeout (0: server_connect_timeout, 7 s)" in caplog.text
