"""net/accept.py: listening sockets accept into SocketTransports; out of file descriptors,
accepting pauses and comes back; close stops it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from pgtarn.net.accept import ACCEPT_RETRY_DELAY, SocketServer, adopt
from pgtarn.net.transport import SocketTransport

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


class Echo(asyncio.Protocol):
    """Sends back what it gets; records its transport."""

    made: list[Echo] = []

    def __init__(self) -> None:
        self.transport: Any = None
        self.nodelay = 0
        self.peer: Any = None
        self.lost = False
        Echo.made.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock.family != socket.AF_UNIX:
            self.nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


@pytest.fixture(params=sorted(LOOPS))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    Echo.made = []
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


def listening() -> socket.socket:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


async def round_trip(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = await reader.readexactly(len(data))
    writer.close()
    return got


def test_connections_get_socket_transports(loop: asyncio.AbstractEventLoop) -> None:
    listener = listening()
    port = listener.getsockname()[1]
    server = SocketServer(loop, [listener], Echo)

    async def clients() -> list[bytes]:
        return await asyncio.gather(*(round_trip(port, f"client {i}".encode()) for i in range(20)))

    got = loop.run_until_complete(clients())
    assert got == [f"client {i}".encode() for i in range(20)]
    assert len(Echo.made) == 20
    for echo in Echo.made:
        assert isinstance(echo.transport, SocketTransport) and echo.nodelay
        assert echo.peer[0] == "127.0.0.1" and echo.peer[1] > 0  # (as accept(2) gave it)
    loop.run_until_complete(asyncio.sleep(0.05))
    assert all(echo.lost for echo in Echo.made)  # the clients closed: so did the transports
    server.close()
    assert listener.fileno() == -1  # closed
    with pytest.raises(OSError):
        loop.run_until_complete(round_trip(port, b"refused"))


def test_out_of_descriptors_pauses_accepting_then_resumes(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """accept(2) failing with EMFILE (every descriptor taken) pauses accepting for
    ACCEPT_RETRY_DELAY instead of spinning; the connection waits in the queue and is served
    once descriptors are free again."""
    listener = listening()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))  # queued: not accepted yet
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    servers: list[SocketServer] = []

    async def exhausted_then_freed() -> tuple[bool, int, float]:
        """Within one run of the loop (uvloop makes descriptors at each run's start)."""
        fillers: list[int] = []
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        try:
            with contextlib.suppress(OSError):
                while True:  # every descriptor below the limit taken
                    fillers.append(os.open(os.devnull, os.O_RDONLY))
            server = SocketServer(asyncio.get_running_loop(), [listener], Echo)
            servers.append(server)
            await asyncio.sleep(0.05)
            paused, accepted = server.serving, len(Echo.made)
        finally:
            for fd in fillers:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        started = time.monotonic()
        while not (server.serving and Echo.made):
            await asyncio.sleep(0.005)
        return paused or accepted > 0, accepted, time.monotonic() - started

    server_ran_on, accepted, waited = loop.run_until_complete(exhausted_then_freed())
    assert not server_ran_on and accepted == 0  # paused, nothing accepted while exhausted
    assert waited <= ACCEPT_RETRY_DELAY + 1  # then back, and the queued connection served
    client.settimeout(5)
    client.sendall(b"waited")
    loop.run_until_complete(asyncio.sleep(0.05))
    assert client.recv(100) == b"waited"
    client.close()
    for echo in Echo.made:
        echo.transport.close()
    loop.run_until_complete(asyncio.sleep(0.01))
    servers[0].close()


def test_adopt_takes_a_connected_socket(loop: asyncio.AbstractEventLoop) -> None:
    ours, peer = socket.socketpair()
    echo = Echo()
    transport = adopt(loop, ours, echo)
    assert ours.fileno() == -1  # detached: the transport owns the descriptor
    assert echo.transport is transport and transport.get_extra_info("socket") is not None
    peer.sendall(b"adopted")
    loop.run_until_complete(asyncio.sleep(0.05))
    assert peer.recv(100) == b"adopted"
    transport.close()
    loop.run_until_complete(asyncio.sleep(0.01))
    assert echo.lost
    peer.close()


def test_close_tcp_keeps_the_unix_socket_accepting(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    tcp = listening()
    port = tcp.getsockname()[1]
    path = str(tmp_path / "s")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    unix.listen()
    server = SocketServer(loop, [tcp, unix], Echo)
    server.close_tcp()  # a shutdown that waits: the console still logs in over the unix socket
    assert tcp.fileno() == -1 and server.sockets == [unix]
    with pytest.raises(OSError):
        loop.run_until_complete(round_trip(port, b"refused"))

    async def over_unix() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"unix")
        got = await reader.readexactly(4)
        writer.close()
        return got

    assert loop.run_until_complete(over_unix()) == b"unix"
    server.close()
    assert unix.fileno() == -1
