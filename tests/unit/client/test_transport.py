"""Unit tests for a client's transport: what connection_made reads of the socket."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest

from pgtarn.client.connection import ClientConnection
from pgtarn.errors import PgtarnError

from .test_connection import FakeSocket, FakeTransport, connect, make_runtime


class OptionsSocket(FakeSocket):
    """A fake socket that keeps the options set on it."""

    def __init__(self, family: socket.AddressFamily) -> None:
        super().__init__(family)
        self.options: list[tuple[int, ...]] = []

    def setsockopt(self, *option: Any) -> None:
        self.options.append(option)


class CountingTransport(FakeTransport):
    """Counts what is asked of the socket, by name; keeps the options set on it."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        super().__init__(family)
        self.asked: list[str] = []
        self.socket = OptionsSocket(family)
        self.options = self.socket.options

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        self.asked.append(name)
        return super().get_extra_info(name, default)


def test_local_addr_is_read_when_asked_not_at_connection() -> None:
    client, _ = connect(make_runtime())
    transport = CountingTransport()
    client.connection_made(transport)
    assert "sockname" not in transport.asked  # a system call a login does not need
    assert client.addr == "127.0.0.1:40000"
    assert client.local_addr == "127.0.0.1:6432"
    assert transport.asked.count("sockname") == 1


def test_local_addr_of_a_unix_socket_client_is_empty() -> None:
    client, _ = connect(make_runtime(), socket.AF_UNIX)
    assert client.addr == "unix"
    assert client.local_addr == ""


def test_a_client_gets_the_tcp_options_and_no_keepalive_call() -> None:
    client, _ = connect(make_runtime())
    transport = CountingTransport()
    client.connection_made(transport)
    assert transport.options == []  # SO_KEEPALIVE comes from the listener: nothing to set
    client, _ = connect(make_runtime(extra="tcp_keepidle = 77\ntcp_user_timeout = 2500"))
    transport = CountingTransport()
    client.connection_made(transport)
    assert transport.options == [
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77),
        (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2500),
    ]
    unix = CountingTransport(socket.AF_UNIX)
    client.connection_made(unix)
    assert unix.options == []


class LogWatchingTransport(FakeTransport):
    """Keeps, at each write, the "closing because" lines logged so far."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        super().__init__()
        self.caplog = caplog
        self.seen_at_write: list[list[str]] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.seen_at_write.append(closing_lines(self.caplog))
        super().write(data)


def closing_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "closing because" in r.getMessage()]


def test_the_closing_line_is_logged_before_the_client_gets_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pgtarn")
    client = ClientConnection(make_runtime())
    transport = LogWatchingTransport(caplog)
    client.connection_made(transport)
    client.close(PgtarnError("no such database: nodb", sqlstate="3D000"))
    # a log reader that sees the error in the client must find the line already written
    assert len(transport.seen_at_write) == 1
    assert transport.seen_at_write[0] == [
        f"{client!r} closing because: no such database: nodb (age=0s)"
    ]
    client.connection_lost(None)
    assert len(closing_lines(caplog)) == 1  # and not a second time when the socket is gone


def test_a_close_without_an_error_logs_its_reason_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pgtarn")
    client, transport = connect(make_runtime())
    client.close(reason="server shutting down")
    assert transport.out == b""  # nothing sent: the connection just closes
    assert transport.closing
    client.connection_lost(None)
    assert [line.split(" ", 2)[2] for line in closing_lines(caplog)] == [
        "closing because: server shutting down (age=0s)"
    ]


def test_a_client_that_leaves_gets_its_closing_line_when_the_socket_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pgtarn")
    client, _ = connect(make_runtime())
    client.close_reason = "TLS failed: handshake"  # (the transport fails on its own)
    client.connection_lost(None)
    assert [line.split(" ", 2)[2] for line in closing_lines(caplog)] == [
        "closing because: TLS failed: handshake (age=0s)"
    ]
