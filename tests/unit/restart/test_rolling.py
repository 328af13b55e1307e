"""rolling.spread: taken-over listening sockets become the new workers' sockets."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from pgtarn.restart.rolling import spread
from pgtarn.workers.sockets import tcp_listeners


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def _reuseport_pair(opened: list[socket.socket]) -> list[socket.socket]:
    first = tcp_listeners(["127.0.0.1"], 0, 16, 1)[0][0]
    port = first.getsockname()[1]
    second = tcp_listeners(["127.0.0.1"], port, 16, 1)[0][0]
    opened += [first, second]
    return [first, second]


def test_fewer_workers_serve_every_socket(opened: list[socket.socket]) -> None:
    socks = _reuseport_pair(opened)
    made, unix = spread(socks, 1, 16)
    assert made == [socks] and unix is None


def test_as_many_workers_get_one_socket_each(opened: list[socket.socket]) -> None:
    socks = _reuseport_pair(opened)
    made, _unix = spread(socks, 2, 16)
    assert made == [[socks[0]], [socks[1]]]


def test_more_workers_get_new_reuseport_sockets(opened: list[socket.socket]) -> None:
    socks = _reuseport_pair(opened)
    made, _unix = spread(socks, 3, 16)
    opened += made[2]
    assert made[:2] == [[socks[0]], [socks[1]]]
    assert len(made[2]) == 1 and made[2][0] not in socks
    assert made[2][0].getsockname() == socks[0].getsockname()


def test_more_workers_share_a_socket_without_reuseport(opened: list[socket.socket]) -> None:
    plain = socket.create_server(("127.0.0.1", 0))  # as a single process makes it
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    opened += [plain, unix]
    made, shared = spread([plain, unix], 2, 16)
    assert made == [[plain], [plain]] and shared is unix
