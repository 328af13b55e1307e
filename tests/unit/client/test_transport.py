"""Unit tests for a client's transport: what connection_made reads of the socket."""

from __future__ import annotations

import socket
from typing import Any

from .test_connection import FakeTransport, connect, make_runtime


class CountingTransport(FakeTransport):
    """Counts what is asked of the socket, by name; keeps the options set on it."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        super().__init__(family)
        self.asked: list[str] = []
        self.options: list[tuple[int, ...]] = []
        self.socket.setsockopt = lambda *option: self.options.append(option)  # type: ignore

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        self.asked.append(name)
        return super().get_extra_info(name, default)


def test_local_addr_is_read_when_asked_not_at_connection() -> None:
    client, _ = connect(make_runtime())
    transport = CountingTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
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
    client.connection_made(transport)  # type: ignore[arg-type]
    assert transport.options == []  # SO_KEEPALIVE comes from the listener: nothing to set
    client, _ = connect(make_runtime(extra="tcp_keepidle = 77\ntcp_user_timeout = 2500"))
    transport = CountingTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    assert transport.options == [(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77),
                                 (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 2500)]
    unix = CountingTransport(socket.AF_UNIX)
    client.connection_made(unix)  # type: ignore[arg-type]
    assert unix.options == []
