"""net/transport.py: a SocketTransport on a real socket pair, under uvloop and asyncio's loop:
reads, writes past what the socket takes, flow control, the end of the stream, close and
abort, and the connection helper."""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import uvloop

from pgtarn.net.sending import send_state_of
from pgtarn.net.transport import (
    ACCEPT_SOME,
    CLOCK,
    HIGH_WATER,
    RECV_SOME,
    SEND_PART,
    WATCH_ADD,
    WATCH_MODIFY,
    WATCH_READY,
    WATCH_REMOVE,
    WATCH_SET,
    SocketTransport,
    accept_accepted,
    connect_transport,
    ready_polled,
    recv_read,
    send_written,
    socket_watch,
    watch_polled,
)

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


class Recorder(asyncio.Protocol):
    """A protocol that records what its transport tells it."""

    def __init__(self, keep_open_at_eof: bool = False) -> None:
        self.transport: Any = None
        self.received = b""
        self.events: list[str] = []
        self.lost: list[Exception | None] = []
        self.keep_open_at_eof = keep_open_at_eof
        self.fd_open_when_lost: bool | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool:
        self.events.append("eof")
        return self.keep_open_at_eof

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.append(exc)
        try:
            os.fstat(self.transport.fd)
            self.fd_open_when_lost = True
        except OSError:
            self.fd_open_when_lost = False


@pytest.fixture(params=sorted(LOOPS))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


def started(
    loop: asyncio.AbstractEventLoop, protocol: Recorder | None = None, sndbuf: int = 0
) -> tuple[SocketTransport, Recorder, socket.socket]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    if sndbuf:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    protocol = protocol or Recorder()
    transport = SocketTransport(loop, ours.detach(), socket.AF_UNIX, protocol)
    transport.start()
    return transport, protocol, peer


def run_until(
    loop: asyncio.AbstractEventLoop,
    done: Callable[[], bool],
    also: Callable[[], object] = lambda: None,
) -> None:
    async def wait() -> None:
        for _ in range(2000):
            also()
            if done():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("timed out")

    loop.run_until_complete(wait())


def drain(peer: socket.socket, into: bytearray) -> None:
    peer.setblocking(False)
    try:
        while chunk := peer.recv(1 << 20):
            into += chunk
    except BlockingIOError:
        pass


def test_reads_reach_the_protocol_and_writes_the_peer(loop: asyncio.AbstractEventLoop) -> None:
    transport, protocol, peer = started(loop)
    assert protocol.events == ["made"] and transport.is_reading()
    peer.sendall(b"Q\x00\x00\x00\x0dselect 1\x00")
    run_until(loop, lambda: len(protocol.received) == 14)
    assert protocol.received == b"Q\x00\x00\x00\x0dselect 1\x00"
    transport.write(b"Z\x00\x00\x00\x05I")
    assert transport.get_write_buffer_size() == 0  # the socket took it at once
    assert peer.recv(100) == b"Z\x00\x00\x00\x05I"
    transport.close()
    run_until(loop, lambda: protocol.lost != [])
    assert protocol.lost == [None] and protocol.fd_open_when_lost is True
    with pytest.raises(OSError):
        os.fstat(transport.fd)  # closed once connection_lost returned
    peer.close()


def test_a_write_past_the_socket_buffer_is_sent_whole_in_order_with_flow_control(
    loop: asyncio.AbstractEventLoop,
) -> None:
    transport, protocol, peer = started(loop, sndbuf=4096)
    data = bytes(range(256)) * 4096  # 1 MiB
    transport.write(data)
    transport.write(b"after")
    assert transport.get_write_buffer_size() > HIGH_WATER
    assert protocol.events == ["made", "pause"]
    got = bytearray()
    run_until(loop, lambda: len(got) == len(data) + 5, lambda: drain(peer, got))
    assert bytes(got) == data + b"after"
    run_until(loop, lambda: "resume" in protocol.events)
    assert protocol.events == ["made", "pause", "resume"]
    assert transport.get_write_buffer_size() == 0
    transport.close()
    run_until(loop, lambda: protocol.lost != [])
    peer.close()


def test_close_sends_what_is_buffered_first(loop: asyncio.AbstractEventLoop) -> None:
    transport, protocol, peer = started(loop, sndbuf=4096)
    data = b"x" * 300_000
    transport.write(data)
    transport.close()
    transport.write(b"dropped")  # a closing transport takes nothing more
    assert transport.is_closing() and not transport.is_reading()
    got = bytearray()
    run_until(loop, lambda: protocol.lost != [], lambda: drain(peer, got))
    drain(peer, got)
    assert bytes(got) == data and protocol.lost == [None]
    peer.close()


def test_abort_drops_what_is_buffered(loop: asyncio.AbstractEventLoop) -> None:
    transport, protocol, peer = started(loop, sndbuf=4096)
    transport.write(b"x" * 300_000)
    transport.abort()
    assert transport.get_write_buffer_size() == 0
    run_until(loop, lambda: protocol.lost != [])
    got = bytearray()
    drain(peer, got)
    assert len(got) < 300_000 and protocol.lost == [None]
    peer.close()


def test_the_end_of_the_stream_closes_unless_the_protocol_keeps_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    _, protocol, peer = started(loop)
    peer.shutdown(socket.SHUT_WR)
    run_until(loop, lambda: protocol.lost != [])
    assert protocol.events == ["made", "eof", "lost"] and protocol.lost == [None]
    peer.close()

    kept, keeper, peer = started(loop, Recorder(keep_open_at_eof=True))
    peer.shutdown(socket.SHUT_WR)
    run_until(loop, lambda: "eof" in keeper.events)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert keeper.lost == [] and not kept.is_reading()
    kept.write(b"still")  # half-closed by the peer: it can still be written to
    assert peer.recv(10) == b"still"
    kept.close()
    run_until(loop, lambda: keeper.lost != [])
    peer.close()


def test_a_peer_gone_is_an_error_for_the_protocol(loop: asyncio.AbstractEventLoop) -> None:
    transport, protocol, peer = started(loop)
    peer.close()
    transport.write(b"to nobody")
    run_until(loop, lambda: protocol.lost != [])
    assert isinstance(protocol.lost[0], OSError) and protocol.lost[0].errno == errno.EPIPE
    assert transport.is_closing()
    transport.write(b"more")  # dropped, no second connection_lost
    loop.run_until_complete(asyncio.sleep(0.01))
    assert protocol.events.count("lost") == 1


def test_paused_reading_reads_nothing_until_resumed(loop: asyncio.AbstractEventLoop) -> None:
    transport, protocol, peer = started(loop)
    transport.pause_reading()
    peer.sendall(b"held")
    loop.run_until_complete(asyncio.sleep(0.02))
    assert protocol.received == b"" and not transport.is_reading()
    transport.resume_reading()
    run_until(loop, lambda: protocol.received == b"held")
    transport.abort()
    run_until(loop, lambda: protocol.lost != [])
    peer.close()


def test_set_protocol_moves_the_reads(loop: asyncio.AbstractEventLoop) -> None:
    transport, first, peer = started(loop)
    second = Recorder()
    second.transport = transport
    transport.set_protocol(second)
    assert transport.get_protocol() is second
    peer.sendall(b"to the second")
    run_until(loop, lambda: second.received == b"to the second")
    assert first.received == b""
    transport.close()
    run_until(loop, lambda: second.lost != [])
    assert first.lost == []
    peer.close()


def test_extra_info_comes_from_the_socket(loop: asyncio.AbstractEventLoop) -> None:
    async def serve_and_connect() -> tuple[SocketTransport, Recorder, socket.socket]:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        protocol = Recorder()
        transport = await connect_transport(lambda: protocol, "127.0.0.1", port)
        peer, _ = listener.accept()
        listener.close()
        return transport, protocol, peer

    transport, protocol, peer = loop.run_until_complete(serve_and_connect())
    assert protocol.transport is transport and send_state_of(transport) == transport.fd
    assert transport.get_extra_info("peername") == peer.getsockname()
    assert transport.get_extra_info("sockname") == peer.getpeername()
    sock = transport.get_extra_info("socket")
    assert sock.fileno() == transport.fd and sock.family == socket.AF_INET
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
    del sock  # made when asked, kept by nobody: the socket stays the transport's
    transport.write(b"still open")
    assert peer.recv(100) == b"still open"
    assert transport.get_extra_info("nothing", "default") == "default"
    transport.close()
    run_until(loop, lambda: protocol.lost != [])
    assert transport.get_extra_info("peername") is None  # closed: nothing to ask
    peer.close()


def test_connect_tries_each_address_and_reports_the_failure(
    loop: asyncio.AbstractEventLoop,
) -> None:
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))
    port = unused.getsockname()[1]
    unused.close()  # nothing listens there now

    def attempt() -> Awaitable[SocketTransport]:
        return connect_transport(Recorder, "127.0.0.1", port)

    with pytest.raises(ConnectionRefusedError):
        loop.run_until_complete(attempt())
    with pytest.raises(FileNotFoundError):
        loop.run_until_complete(connect_transport(Recorder, "", 0, "/nonexistent/.s.PGSQL.1"))


def test_connect_over_a_unix_socket(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    path = str(tmp_path / ".s.PGSQL.5432")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    protocol = Recorder()
    transport = loop.run_until_complete(connect_transport(lambda: protocol, "", 0, path))
    peer, _ = listener.accept()
    peer.sendall(b"over unix")
    run_until(loop, lambda: protocol.received == b"over unix")
    assert transport.family == socket.AF_UNIX
    transport.close()
    run_until(loop, lambda: protocol.lost != [])
    peer.close()
    listener.close()


def test_the_pure_helpers_do_what_the_compiled_ones_do() -> None:
    for recv, send in ((recv_read, send_written), (RECV_SOME, SEND_PART)):
        ours, peer = socket.socketpair()
        ours.setblocking(False)
        assert recv(ours.fileno()) is None  # nothing yet
        peer.sendall(b"abc")
        assert recv(ours.fileno()) == b"abc"
        peer.shutdown(socket.SHUT_WR)
        assert recv(ours.fileno()) == b""  # the end
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        total = 0
        while (sent := send(ours.fileno(), b"y" * 65536)) > 0:
            total += sent
        assert sent == 0 and total > 0  # full: 0, not an error
        peer.close()  # unread bytes: a reset
        with pytest.raises(ConnectionResetError):
            recv(ours.fileno())
        with pytest.raises(OSError):
            send(ours.fileno(), b"z")  # a peer gone
        ours.close()


def test_a_protocol_may_pause_reading_as_it_is_made(loop: asyncio.AbstractEventLoop) -> None:
    class PausesAtOnce(Recorder):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            cast(asyncio.Transport, transport).pause_reading()

    transport, protocol, peer = started(loop, PausesAtOnce())
    peer.sendall(b"early")
    loop.run_until_complete(asyncio.sleep(0.02))
    assert protocol.received == b"" and not transport.is_reading()
    transport.resume_reading()
    run_until(loop, lambda: protocol.received == b"early")
    transport.close()
    run_until(loop, lambda: protocol.lost != [])
    peer.close()


def test_a_reset_behind_unread_bytes_still_ends_the_connection(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The peer sends its last words and resets the connection (a PostgreSQL backend that
    sends FATAL and exits with our bytes unread): the protocol gets the words, then
    connection_lost with the reset, not silence."""

    async def connect() -> tuple[SocketTransport, Recorder, socket.socket]:
        listener = socket.create_server(("127.0.0.1", 0))
        protocol = Recorder()
        transport = await connect_transport(
            lambda: protocol, "127.0.0.1", listener.getsockname()[1]
        )
        peer, _ = listener.accept()
        listener.close()
        return transport, protocol, peer

    transport, protocol, peer = loop.run_until_complete(connect())
    transport.write(b"never read by the peer")  # unread at its close: a reset, not a FIN
    loop.run_until_complete(asyncio.sleep(0.02))
    peer.sendall(b"FATAL: terminating connection")
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()
    run_until(loop, lambda: protocol.lost != [])
    assert protocol.received == b"FATAL: terminating connection"
    assert isinstance(protocol.lost[0], ConnectionResetError)
    assert transport.is_closing()


def test_the_pure_accept_does_what_the_compiled_one_does() -> None:
    for accept in (accept_accepted, ACCEPT_SOME):
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        assert accept(listener.fileno()) is None  # none waiting
        client = socket.create_connection(listener.getsockname())
        accepted = accept(listener.fileno())
        assert accepted is not None
        fd, peer = accepted
        assert peer == client.getsockname()
        assert not os.get_blocking(fd)
        os.close(fd)
        client.close()
        listener.close()


def test_accept_names_each_peer_host_as_the_socket_module_does() -> None:
    # loopback is all of 127/8: clients from several hosts, one of them again after another
    hosts = ("127.0.0.1", "127.10.200.3", "127.0.0.1", "127.255.9.99", "127.100.0.10")
    for accept in (accept_accepted, ACCEPT_SOME):
        listener = socket.create_server(("0.0.0.0", 0))
        listener.setblocking(False)
        for host in hosts:
            client = socket.socket()
            client.bind((host, 0))
            client.connect(("127.0.0.1", listener.getsockname()[1]))
            accepted = accept(listener.fileno())
            assert accepted is not None
            fd, peer = accepted
            assert peer == client.getsockname() and peer[0] == host
            os.close(fd)
            client.close()
        listener.close()


def test_the_pure_watch_does_what_the_compiled_one_does() -> None:
    for watch_set, watch_ready in ((watch_polled, ready_polled), (WATCH_SET, WATCH_READY)):
        epoll = select.epoll()
        epfd = epoll.fileno()
        ours, peer = socket.socketpair()
        fd = ours.fileno()
        # (not started: the watch only holds it and hands the same object back)
        transport = SocketTransport(cast(Any, None), fd, socket.AF_UNIX, Recorder())
        transports = {fd: transport}
        watch_set(epfd, epoll, WATCH_ADD, fd, select.EPOLLIN, transport)
        assert watch_ready(epfd, epoll, transports) == []  # nothing to read
        peer.sendall(b"x")
        ready = watch_ready(epfd, epoll, transports)
        assert ready == [transport] and ready[0] is transport
        watch_set(epfd, epoll, WATCH_MODIFY, fd, 0, transport)
        assert watch_ready(epfd, epoll, transports) == []  # watched for nothing...
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
        ready = watch_ready(epfd, epoll, transports)  # ...but its errors: after a None
        assert ready == [None, transport] and ready[1] is transport
        watch_set(epfd, epoll, WATCH_REMOVE, fd, 0, transport)
        assert watch_ready(epfd, epoll, transports) == []
        with pytest.raises(FileNotFoundError):
            watch_set(epfd, epoll, WATCH_MODIFY, fd, 0, transport)  # not in the set
        ours.close()
        epoll.close()


def test_sockets_ready_together_are_read_in_one_callback(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Several sockets readable at once: one wake-up of the watch reads them all; a protocol
    that fails goes to the loop's exception handler, and the others are still served."""

    class Fails(Recorder):
        def data_received(self, data: bytes) -> None:
            raise RuntimeError("this protocol fails")

    failures: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: failures.append(context))
    pairs = [started(loop, Fails() if index == 2 else None) for index in range(5)]
    wakes = 0
    watch = socket_watch(loop)
    ready = type(watch)._ready

    def counted(self: Any) -> None:
        nonlocal wakes
        wakes += 1
        ready(self)

    loop.remove_reader(watch.epfd)
    loop.add_reader(watch.epfd, counted, watch)
    for index, (_, _, peer) in enumerate(pairs):
        peer.sendall(b"%d" % index)
    loop.run_until_complete(asyncio.sleep(0.02))
    assert [protocol.received for index, (_, protocol, _) in enumerate(pairs) if index != 2] == [
        b"0",
        b"1",
        b"3",
        b"4",
    ]
    assert wakes == 1
    assert len(failures) == 1 and isinstance(failures[0]["exception"], RuntimeError)
    assert failures[0]["transport"] is pairs[2][0]
    for transport, protocol, peer in pairs:
        transport.close()

        def lost(protocol: Recorder = protocol) -> bool:
            return protocol.lost != []

        run_until(loop, lost)
        peer.close()


def test_a_transport_closed_by_another_in_the_same_wake_up_reads_nothing_more(
    loop: asyncio.AbstractEventLoop,
) -> None:
    class Closes(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.other: tuple[SocketTransport, Recorder] | None = None

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.other is not None and not self.other[0].is_closing():
                self.other[0].abort()
                self.other[1].events.append("aborted")

    class Notes(Recorder):
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self.events.append("data")

    closer, closer_too = Closes(), Closes()
    first, _, first_peer = started(loop, closer)
    second, noted, second_peer = started(loop, Notes())
    third, _, third_peer = started(loop, closer_too)
    closer.other = closer_too.other = second, noted
    for peer in (first_peer, second_peer, third_peer):
        peer.sendall(b"x")
    run_until(loop, lambda: noted.lost != [])
    # read before its abort, or never: never after
    assert noted.events in (["made", "aborted", "lost"], ["made", "data", "aborted", "lost"])
    assert noted.lost == [None]
    for transport, peer in ((first, first_peer), (third, third_peer)):
        transport.close()
        peer.close()
    second_peer.close()
    loop.run_until_complete(asyncio.sleep(0.01))


def test_a_callback_after_the_reads_runs_once_every_socket_of_the_batch_was_read(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """after_reads inside a batch: called once the batch's reads are all over, in the same
    wake-up (no callback of the loop's own); outside one, from the loop."""
    order: list[str] = []

    class Asks(Recorder):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            order.append(self.name)
            socket_watch(loop).after_reads(lambda: order.append(f"after {self.name}"))

    pairs = [started(loop, Asks(str(index))) for index in range(3)]
    watch = socket_watch(loop)
    for _, _, peer in pairs:
        peer.sendall(b"x")
    select.select([watch.epfd], [], [], 1.0)  # (all three ready: one batch)
    watch._ready()
    assert order[:3] == ["0", "1", "2"] and order[3:4] == ["after 0"]  # the first asked
    assert not watch.reading and watch.after is None
    loop.run_until_complete(asyncio.sleep(0.01))  # the others asked too late: from the loop
    assert sorted(order[4:]) == ["after 1", "after 2"]
    order.clear()
    watch.after_reads(lambda: order.append("outside"))
    assert order == []
    loop.run_until_complete(asyncio.sleep(0.01))
    assert order == ["outside"]
    for transport, protocol, peer in pairs:
        transport.close()
        run_until(loop, lambda protocol=protocol: protocol.lost != [])  # type: ignore[misc]
        peer.close()


def test_each_wake_up_reads_the_clock_once_for_its_batch_and_none_outside(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The reads of a batch see the clock as read at its wake-up, each wake-up anew; what the
    loop runs outside a batch (a timer, another transport) sees no reading, and reads the
    clock itself."""
    seen: list[float] = []

    class Stamps(Recorder):
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            seen.append(CLOCK.now)

    transport, protocol, peer = started(loop, Stamps())
    watch = socket_watch(loop)
    for wake_up in range(2):
        before = time.monotonic()
        peer.sendall(b"x")
        select.select([watch.epfd], [], [], 1.0)
        watch._ready()
        after = time.monotonic()
        assert len(seen) == wake_up + 1
        assert before <= seen[wake_up] <= after  # read at this wake-up, not an older one
        assert CLOCK.now == 0.0  # the batch over: no reading left behind
    outside: list[float] = []
    loop.call_soon(lambda: outside.append(CLOCK.now))
    peer.sendall(b"y")
    run_until(loop, lambda: len(seen) == 3 and outside != [])
    assert outside == [0.0] and seen[2] != 0.0
    transport.close()
    run_until(loop, lambda: protocol.lost != [])
    peer.close()
