"""Unit tests for the workers' listening sockets: one per worker and address."""

from __future__ import annotations

import socket

import pytest

from pgtarn.workers.sockets import tcp_listeners


@pytest.mark.parametrize("keepalive", [True, False])
def test_tcp_listeners_listen_with_tcp_keepalive(keepalive: bool) -> None:
    # set before listen(): a connection accepted at once has it too
    made = tcp_listeners(["127.0.0.1"], 0, 16, 2, keepalive)
    try:
        assert [len(socks) for socks in made] == [1, 1]
        for socks in made:
            assert socks[0].getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == keepalive
        port = made[0][0].getsockname()[1]
        made[0][0].settimeout(5)  # they are made non-blocking
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = made[0][0].accept()
            with accepted:
                assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == keepalive
    finally:
        for socks in made:
            for sock in socks:
                sock.close()


def test_a_single_process_listens_alone_and_a_taken_port_is_named() -> None:
    """Without reuse_port (one pgtarn, no workers) a second listener on the port fails, and
    says where."""
    first = tcp_listeners(["127.0.0.1"], 0, 16, 1, reuse_port=False)[0][0]
    try:
        assert not first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        port = first.getsockname()[1]
        with pytest.raises(
            OSError, match=f"could not listen on 127.0.0.1 port {port}: Address already in use"
        ):
            tcp_listeners(["127.0.0.1"], port, 16, 1, reuse_port=False)
    finally:
        first.close()
