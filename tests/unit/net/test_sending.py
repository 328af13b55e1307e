"""net/sending.py: writes go straight to the socket while the transport holds nothing, and
through the transport, in order, once it does."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import uvloop

from pgtarn.net.sending import (
    SEND_NEVER,
    SEND_SOME,
    backlog,
    send,
    send_state_of,
)
from pgtarn.net.transport import SocketTransport


class Recorder(asyncio.Transport):
    """A transport's write and buffer, recorded: what it was given, and how much it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.buffered = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)
        self.buffered += len(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A non-blocking socket (the connection's) and its peer."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


def received(peer: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk


def sent_with(state: int, recorder: Recorder, data: bytes) -> int:
    return send(state, recorder, data)


def test_what_the_socket_takes_skips_the_transport(pair: tuple[socket.socket, ...]) -> None:
    ours, peer = pair
    recorder = Recorder()
    state = sent_with(ours.fileno(), recorder, b"Z\x00\x00\x00\x05I")
    assert state == ours.fileno()
    assert received(peer) == b"Z\x00\x00\x00\x05I" and recorder.written == b""


def test_the_rest_goes_to_the_transport_after_what_the_socket_took(
    pair: tuple[socket.socket, ...],
) -> None:
    ours, peer = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    data = bytes(range(256)) * 4096  # 1 MiB: more than the socket's buffer
    recorder = Recorder()
    state = sent_with(ours.fileno(), recorder, data)
    assert state == backlog(ours.fileno())
    first = received(peer)
    assert first and recorder.written  # some went each way, nothing twice, in order
    assert first + recorder.written == data


def test_while_the_transport_holds_bytes_writes_go_through_it(
    pair: tuple[socket.socket, ...],
) -> None:
    ours, peer = pair
    recorder = Recorder()
    recorder.buffered = 5  # the transport has not sent all it was given yet
    state = sent_with(backlog(ours.fileno()), recorder, b"later")
    assert state == backlog(ours.fileno())
    assert recorder.written == b"later" and received(peer) == b""


def test_once_the_transport_has_sent_all_the_socket_takes_writes_again(
    pair: tuple[socket.socket, ...],
) -> None:
    ours, peer = pair
    recorder = Recorder()
    state = sent_with(backlog(ours.fileno()), recorder, b"now")
    assert state == ours.fileno()
    assert received(peer) == b"now" and recorder.written == b""


def test_a_failed_socket_leaves_all_the_bytes_to_the_transport(
    pair: tuple[socket.socket, ...],
) -> None:
    ours, peer = pair
    peer.close()  # the peer is gone: send fails with EPIPE, which the transport reports
    recorder = Recorder()
    state = sent_with(ours.fileno(), recorder, b"X\x00\x00\x00\x04")
    assert recorder.written == b"X\x00\x00\x00\x04"
    assert state == backlog(ours.fileno())


def test_send_never_writes_through_the_transport(pair: tuple[socket.socket, ...]) -> None:
    _, peer = pair
    recorder = Recorder()
    assert sent_with(SEND_NEVER, recorder, b"abc") == SEND_NEVER
    assert recorder.written == b"abc" and received(peer) == b""


def test_backlog_states_are_below_send_never() -> None:
    assert {backlog(fd) for fd in (0, 1, 7, 1023)} == {-2, -3, -9, -1025}


def test_send_some_reports_how_much_was_taken(pair: tuple[socket.socket, ...]) -> None:
    ours, peer = pair
    assert SEND_SOME(ours.fileno(), b"") == 0
    # any bytes-like object, in both builds (its type says bytes: all pgtarn passes)
    send_buffer = cast(Callable[[int, bytearray], int], SEND_SOME)
    assert send_buffer(ours.fileno(), bytearray(b"ab")) == 2
    assert received(peer) == b"ab"


def test_a_socket_transport_is_sent_on_directly() -> None:
    """pgtarn's own transport gets its socket's fd; sending on it reaches the peer."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    loop = uvloop.new_event_loop()
    try:
        transport = SocketTransport(loop, ours.detach(), socket.AF_UNIX, asyncio.Protocol())
        transport.start()
        # (a SocketTransport reaches its protocol cast to a BaseTransport: see its start)
        state = send_state_of(cast(asyncio.BaseTransport, transport))
        assert state == transport.fd and SEND_SOME(state, b"hello") == 5
        transport.abort()
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert peer.recv(5) == b"hello"
    peer.close()


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_other_transports_write_through_themselves(loop_kind: str) -> None:
    """The event loops' own transports, TLS, or any other is never sent on directly."""
    ours, peer = socket.socketpair()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        try:
            return send_state_of(transport)
        finally:
            transport.close()

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == SEND_NEVER
    finally:
        loop.close()
    peer.close()

    class TlsLike(asyncio.Transport):
        pass

    assert send_state_of(TlsLike()) == SEND_NEVER
