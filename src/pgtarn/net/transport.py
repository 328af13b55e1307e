"""A transport of pgtarn's own on a plain TCP or unix socket, its reads watched in bulk.

uvloop's transports take the GIL back twice per read (libuv asks Python for a buffer, then
hands it the bytes) and keep a socket object, a buffer list and a weak reference per
connection; a reader added with ``add_reader`` still takes it back once per read, through a
Handle. The sockets of a loop's SocketTransports are instead in one epoll set of the loop's
(``SocketWatch``), and the loop watches only that set: when it is readable, one callback
asks it which sockets are, and each transport reads its own, one recv(2) and one bytes
object per read (native/_io.c in the compiled build). A busy loop iteration finds several
sockets readable, and pays for one callback, at whose end runs what is to follow its reads
(``after_reads``). A transport sends what it is given at once and buffers only what the
socket does not take, watching for writability (``add_writer``) until that is sent.

It behaves as an asyncio transport for the protocol above it, as far as pgtarn uses one:

- ``connection_made`` when it is made; ``data_received`` per read; ``eof_received`` at the
  end of the stream (the transport closes unless it returns True: pgtarn never keeps a
  half-closed socket); ``connection_lost`` once, from the loop, after ``close``, ``abort`` or
  a failed socket, with the socket still open until it returns;
- ``pause_writing`` past the high-water mark of bytes buffered, ``resume_writing`` once at
  or below the low one (asyncio's defaults, 64 and 16 KiB);
- ``close`` sends what is buffered first; ``abort`` drops it.

Its ``fd`` is the socket's: a connection sends on it directly while the transport holds
nothing unsent (net/sending.py). TLS wraps it as it wraps any transport (net/tls.py).

A socket that fails (its peer reset it, say) is reported by the set as well, reading or
not: the transport then reads what is left and ends. (On uvloop's own watch it could be
lost: when epoll reports an error, libuv stops watching the socket and uvloop calls the
reader once more, then closes its watch; if the socket still held bytes from the peer, that
one read returned them and the error behind them was never seen, the connection waiting
forever. A PostgreSQL backend that sends FATAL and exits with our next query unread resets
its socket just so.) A connection costs two epoll_ctl calls, to add and remove its socket,
and one more for each pause and resume of its reading.

Long: the transport, the epoll set that feeds it and the socket wrapper it hands out are one
mechanism with one contract (the list above); split, each part would be read against the other.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import time
from collections.abc import Callable
from typing import Any, Final, cast

from .. import native

#: recv_some(fd): the bytes a socket holds now, b"" at its end, None when it holds none.
RecvSome = Callable[[int], bytes | None]
#: send_part(fd, data): the bytes the socket took now, 0 when it is full; OSError on failure.
SendPart = Callable[[int, bytes | bytearray | memoryview], int]

#: accept_some(fd): a connection accepted on listening socket fd (its fd, non-blocking, and
#: its peer's address), None when none waits; OSError on failure.
AcceptSome = Callable[[int], tuple[int, Any] | None]

#: watch_set(epfd, epoll, op, fd, events, transport): add (WATCH_ADD), change (WATCH_MODIFY)
#: or remove (WATCH_REMOVE) fd's socket in the epoll set epfd (the select.epoll epoll), for
#: transport. The compiled build's calls epoll_ctl(2) on epfd with transport as the data; the
#: pure build's calls epoll's methods.
WatchSet = Callable[[int, "select.epoll", int, int, int, object], None]
#: watch_ready(epfd, epoll, transports): the transports of the set's ready sockets now, in
#: order, each one whose socket failed or hung up after a None. The compiled build's reads
#: epfd and finds each transport in its event's data; the pure build's polls epoll and finds
#: them in transports, by fd.
WatchReady = Callable[
    [int, "select.epoll", "dict[int, SocketTransport]"], "list[SocketTransport | None]"
]
#: epoll_ctl(2)'s operations (Linux's values).
WATCH_ADD: Final = 1
WATCH_REMOVE: Final = 2
WATCH_MODIFY: Final = 3

#: The largest read (as uvloop's and asyncio's transports).
READ_SIZE: Final = 65536
#: asyncio's default write-buffer limits.
HIGH_WATER: Final = 64 * 1024
LOW_WATER: Final = 16 * 1024


def recv_read(fd: int) -> bytes | None:
    """recv_some of the pure build."""
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:
        return None


def send_written(fd: int, data: bytes | bytearray | memoryview) -> int:
    """send_part of the pure build. (Python ignores SIGPIPE: a peer gone is an EPIPE.)"""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0


def watch_polled(
    epfd: int, epoll: select.epoll, op: int, fd: int, events: int, transport: object
) -> None:
    """watch_set of the pure build."""
    if op == WATCH_ADD:
        epoll.register(fd, events)
    elif op == WATCH_MODIFY:
        epoll.modify(fd, events)
    else:
        epoll.unregister(fd)


def ready_polled(
    epfd: int, epoll: select.epoll, transports: dict[int, SocketTransport]
) -> list[SocketTransport | None]:
    """watch_ready of the pure build."""
    ready: list[SocketTransport | None] = []
    for fd, events in epoll.poll(0):
        if events & BROKEN:
            ready.append(None)
        ready.append(transports[fd])
    return ready


def accept_accepted(fd: int) -> tuple[int, Any] | None:
    """accept_some of the pure build."""
    listener = socket.socket(fileno=fd)
    try:
        accepted, peer = cast(Any, listener)._accept()  # (fd and address: no socket object)
    except BlockingIOError:
        return None
    finally:
        listener.detach()
    os.set_blocking(accepted, False)
    return accepted, peer


#: native/_io.c's when it is built, else the pure build's.
RECV_SOME: Final[RecvSome] = recv_read if native.recv_some is None else native.recv_some
SEND_PART: Final[SendPart] = send_written if native.send_part is None else native.send_part
ACCEPT_SOME: Final[AcceptSome] = (
    accept_accepted if native.accept_some is None else native.accept_some
)
WATCH_SET: Final[WatchSet] = watch_polled if native.watch_set is None else native.watch_set
WATCH_READY: Final[WatchReady] = ready_polled if native.watch_ready is None else native.watch_ready


class SocketTransport:
    """An open non-blocking socket (its fd, owned from now on) and the protocol it feeds."""

    __slots__ = (
        "_buffer",
        "_buffered",
        "_closing",
        "_data_received",
        "_lost",
        "_paused_writing",
        "_peer",
        "_protocol",
        "_reading",
        "_writing",
        "family",
        "fd",
        "loop",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        family: int,
        protocol: asyncio.Protocol,
        peer: Any = None,
    ) -> None:
        self.loop = loop
        self.fd = fd
        #: AF_INET, AF_INET6 or AF_UNIX.
        self.family = family
        self._protocol = protocol
        #: The peer address accept(2) gave, until asked once (a client asks at its
        #: connection_made and keeps what it needs: a getpeername less per login, and no
        #: address kept per connection); then the socket is asked.
        self._peer = peer
        #: Its protocol's data_received, kept: a bound method made once, not looked up by
        #: name at each read.
        self._data_received = protocol.data_received
        #: What the socket did not take yet, in order (None when nothing: most connections
        #: never hold a list), and its size.
        self._buffer: list[bytes | memoryview] | None = None
        self._buffered = 0
        self._closing = False
        #: connection_lost is called (or on its way): the socket is closed or about to be.
        self._lost = False
        self._reading = False
        self._writing = False
        self._paused_writing = False

    def start(self) -> None:
        """Begin reading and hand the transport to its protocol (which may pause reading or
        close it there: nothing is read before the loop runs again)."""
        self._reading = True
        socket_watch(self.loop).add(self)
        self._protocol.connection_made(cast(asyncio.BaseTransport, self))

    # --- the loop's callbacks ---------------------------------------------------------------

    def _read_ready(self) -> None:
        try:
            data = RECV_SOME(self.fd)
        except OSError as exc:
            self._fail(exc)
            return
        if data is None:
            return  # (woken for nothing: another reader took it, or a spurious wake-up)
        if len(data):
            self._data_received(data)
        else:  # the end of the stream
            self._reading = False
            if not self._protocol.eof_received():
                self.close()  # (which takes the socket out of the watch)
            elif not self._lost:  # kept half-open: watched no more for what it will not send
                socket_watch(self.loop).read(self, False)

    def _write_ready(self) -> None:
        buffer = self._buffer
        assert buffer is not None  # (watched for writability only while it holds bytes)
        try:
            while buffer:
                first = buffer[0]
                sent = SEND_PART(self.fd, first)
                self._buffered -= sent
                if sent < len(first):
                    buffer[0] = memoryview(first)[sent:]
                    break
                del buffer[0]
        except OSError as exc:
            self._fail(exc)
            return
        if not buffer:
            self._buffer = None
            self._writing = False
            self.loop.remove_writer(self.fd)
            if self._closing:
                self._lose(None)
                return
        if self._paused_writing and self._buffered <= LOW_WATER:
            self._paused_writing = False
            self._protocol.resume_writing()

    # --- what the protocol calls ------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return  # (as asyncio's: a closed transport drops what it is given)
        if not data:
            return
        buffer = self._buffer
        if buffer is not None:
            buffer.append(bytes(data))
            self._buffered += len(data)
        else:
            try:
                sent = SEND_PART(self.fd, data)
            except OSError as exc:
                self._fail(exc)
                return
            if sent == len(data):
                return
            self._buffer = [
                memoryview(data)[sent:] if isinstance(data, bytes) else bytes(data)[sent:]
            ]
            self._buffered += len(data) - sent
            self._writing = True
            self.loop.add_writer(self.fd, self._write_ready)
        if not self._paused_writing and self._buffered > HIGH_WATER:
            self._paused_writing = True
            self._protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        """Send what is buffered, then close (connection_lost from the loop)."""
        if self._closing:
            return
        self._closing = True
        if self._buffer is None:
            self._lose(None)  # (which takes the socket out of the watch)
        else:
            self.pause_reading()

    def abort(self) -> None:
        """Close now, dropping what is buffered."""
        self._closing = True
        self._buffer = None
        self._buffered = 0
        self._lose(None)

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            if not self._lost:
                socket_watch(self.loop).read(self, False)

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            socket_watch(self.loop).read(self, True)

    def is_reading(self) -> bool:
        return self._reading

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (LOW_WATER, HIGH_WATER)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        raise NotImplementedError("pgtarn's transports keep asyncio's default limits")

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("pgtarn never half-closes a connection")

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = cast(asyncio.Protocol, protocol)
        self._data_received = self._protocol.data_received

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """peername, sockname and socket (a TransportSocket), asked of the socket when asked:
        nothing is kept per connection. None once closed."""
        if name not in ("peername", "sockname", "socket") or self._lost:
            return default
        if name == "peername" and self._peer is not None:
            peer, self._peer = self._peer, None
            return peer
        sock = TransportSocket(self.fd, self.family)
        if name == "socket":
            return sock
        try:
            return sock.getpeername() if name == "peername" else sock.getsockname()
        except OSError:
            return default

    # --- the end ----------------------------------------------------------------------------

    def broken(self) -> None:
        """The socket failed or hung up (SocketWatch): hand the protocol what it still holds,
        then end with the error (or as at the end of the stream)."""
        while not self._lost:
            try:
                data = RECV_SOME(self.fd)
            except OSError as exc:
                self._fail(exc)
                return
            if data is None:  # nothing held, and recv reports no error: ask the socket
                code = TransportSocket(self.fd, self.family).getsockopt(
                    socket.SOL_SOCKET, socket.SO_ERROR
                )
                self._fail(OSError(code or errno.ECONNRESET, os.strerror(code or errno.ECONNRESET)))
                return
            if not data:
                self._closing = True  # (no eof_received: a hung-up socket cannot be written)
                self._buffer = None
                self._buffered = 0
                self._lose(None)
                return
            self._data_received(data)

    def _fail(self, exc: OSError) -> None:
        """The socket failed: drop what is buffered and tell the protocol."""
        self._closing = True
        self._buffer = None
        self._buffered = 0
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._reading = False
        socket_watch(self.loop).remove(self)
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)
        self.loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            os.close(self.fd)  # (after connection_lost: its number may serve a new socket)


#: What a socket being read is watched for; a socket not being read is watched for nothing,
#: and epoll reports its errors and hang-ups all the same.
READABLE: Final = select.EPOLLIN
#: Errors and hang-ups, reported whatever a socket is watched for.
BROKEN: Final = select.EPOLLERR | select.EPOLLHUP


class LoopClock:
    """time.monotonic() read once per wake-up of a SocketWatch, for what its batch runs.

    Each transaction stamps two instants (a query's start at its first read, its end at
    ReadyForQuery); one clock read per batch serves all of them, as PgBouncer keeps one
    cached time per loop turn. Outside a batch (a TLS or fallback transport of the loop's,
    a timer, the janitor) ``now`` is 0.0, and a reader reads the clock itself: a value read
    here is never older than the wake-up whose bytes it stamps.
    """

    __slots__ = ("now",)

    def __init__(self) -> None:
        #: The wake-up's reading while its batch runs; 0.0 outside one.
        self.now = 0.0


#: The one clock of the process's loop (a native object: a field read, not a dict lookup).
CLOCK: Final = LoopClock()
#: (bound once: a module attribute lookup per call otherwise)
monotonic: Final = time.monotonic


class SocketWatch:
    """The sockets of a loop's transports in one epoll set (level-triggered), itself watched
    by the loop: see the module's docstring."""

    __slots__ = ("after", "epfd", "epoll", "loop", "reading", "transports")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.epoll = select.epoll()
        self.epfd = self.epoll.fileno()
        #: The transports whose sockets are in the set, by fd: each is held here while its
        #: socket is registered (the compiled build's events point at it), and its socket
        #: leaves the set (at _lose) before it is closed, so that its number can serve no
        #: other socket while it is here.
        self.transports: dict[int, SocketTransport] = {}
        #: While the ready sockets of a batch are read; then after, if given (after_reads).
        self.reading = False
        self.after: Callable[[], None] | None = None
        loop.add_reader(self.epfd, self._ready)

    def add(self, transport: SocketTransport) -> None:
        """Watch transport's socket, for reading if it reads."""
        fd = transport.fd
        WATCH_SET(
            self.epfd,
            self.epoll,
            WATCH_ADD,
            fd,
            READABLE if transport.is_reading() else 0,
            transport,
        )
        self.transports[fd] = transport  # (before the loop runs again: no event comes sooner)

    def read(self, transport: SocketTransport, reading: bool) -> None:
        """Watch transport's socket for reading, or for nothing but errors."""
        WATCH_SET(
            self.epfd, self.epoll, WATCH_MODIFY, transport.fd, READABLE if reading else 0, transport
        )

    def after_reads(self, callback: Callable[[], None]) -> None:
        """Call callback once the reads under way are over: at the end of the batch (one per
        batch; no callback of the loop's own, no hand-off of the GIL), else by call_soon."""
        if self.reading and self.after is None:
            self.after = callback
        else:
            self.loop.call_soon(callback)

    def remove(self, transport: SocketTransport) -> None:
        fd = transport.fd
        if self.transports.get(fd) is transport:
            WATCH_SET(self.epfd, self.epoll, WATCH_REMOVE, fd, 0, transport)
            del self.transports[fd]  # (after: its events may point at it until then)

    def _ready(self) -> None:
        # A protocol's exception goes to the loop's handler, as a callback's would, and the
        # other sockets are still read. A transport that an earlier one closed has left the
        # set, but may be in this batch: lost, it reads no more and broken() does nothing.
        ready = WATCH_READY(self.epfd, self.epoll, self.transports)
        # the bytes of this batch arrived by now: their time, until the batch ends
        CLOCK.now = monotonic()
        try:
            self._read_batch(ready)
        finally:
            CLOCK.now = 0.0  # (what runs next reads the clock itself)

    def _read_batch(self, ready: list[SocketTransport | None]) -> None:
        self.reading = True
        broken = False
        for transport in ready:
            if transport is None:  # (the next one failed or hung up)
                broken = True
                continue
            try:
                if broken:
                    broken = False
                    transport.broken()
                elif transport._reading:
                    transport._read_ready()
            except Exception as exc:
                self.loop.call_exception_handler(
                    {
                        "message": "a protocol failed on what its socket brought",
                        "exception": exc,
                        "transport": transport,
                        "protocol": transport.get_protocol(),
                    }
                )
        self.reading = False
        after = self.after
        if after is not None:
            self.after = None
            try:
                after()
            except Exception as exc:
                failed = {"message": "a callback after the reads failed", "exception": exc}
                self.loop.call_exception_handler(failed)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.remove_reader(self.epoll.fileno())
        self.epoll.close()


#: Each loop's SocketWatch (one loop in pgtarn; tests make many).
_watches: dict[asyncio.AbstractEventLoop, SocketWatch] = {}


def socket_watch(loop: asyncio.AbstractEventLoop) -> SocketWatch:
    """The SocketWatch of loop, made at its first transport (and the watches of closed loops
    dropped then)."""
    watch = _watches.get(loop)
    if watch is None:
        for other in [other for other in _watches if other.is_closed()]:
            _watches.pop(other).close()
        watch = _watches[loop] = SocketWatch(loop)
    return watch


class TransportSocket:
    """A transport's socket as get_extra_info("socket") gives it: the socket calls pgtarn
    makes on a connection's socket (options, addresses, its fd to hand to another process),
    which stays the transport's to close. Made when asked, kept by nobody."""

    __slots__ = ("family", "fd")

    def __init__(self, fd: int, family: int) -> None:
        self.fd = fd
        self.family = family

    @property
    def type(self) -> int:
        return socket.SOCK_STREAM

    def fileno(self) -> int:
        return self.fd

    def _on_socket(self, call: Callable[[socket.socket], Any]) -> Any:
        """call on a socket object made on the fd, detached (never closed) after it."""
        sock = socket.socket(self.family, socket.SOCK_STREAM, 0, self.fd)
        try:
            return call(sock)
        finally:
            sock.detach()

    def getpeername(self) -> Any:
        return self._on_socket(socket.socket.getpeername)

    def getsockname(self) -> Any:
        return self._on_socket(socket.socket.getsockname)

    def getsockopt(self, level: int, option: int, size: int = 0) -> Any:
        if size:
            return self._on_socket(lambda sock: sock.getsockopt(level, option, size))
        return self._on_socket(lambda sock: sock.getsockopt(level, option))

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        self._on_socket(lambda sock: sock.setsockopt(level, option, value))


async def open_socket(
    loop: asyncio.AbstractEventLoop, family: int, address: Any, buffer: int = 0
) -> int:
    """A non-blocking socket connected to address (TCP_NODELAY on TCP): its fd, the caller's
    from now on. buffer: SO_SNDBUF and SO_RCVBUF (tcp_socket_buffer; 0: the system's), set
    before the connection is made, since the window it offers is agreed on then: smaller
    buffers set later stall a connection that sends a lot (a base backup)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if buffer > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock.detach()


async def connect_transport(protocol_factory: Callable[[], asyncio.Protocol], host: str,
                            port: int, path: str | None = None, buffer: int = 0
                            ) -> SocketTransport:  # fmt: skip
    """Connect to host and port (each address it resolves to, in turn), or to a unix socket
    at path, and start a SocketTransport with a protocol from protocol_factory on it."""
    loop = asyncio.get_running_loop()
    family: int = socket.AF_UNIX
    if path is not None:
        fd = await open_socket(loop, family, path)
    else:
        errors: list[OSError] = []
        found: tuple[int, int] | None = None
        for info in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            try:
                found = info[0], await open_socket(loop, info[0], info[4], buffer)
                break
            except OSError as exc:
                errors.append(exc)
        if found is None:
            if len(errors) == 1:
                raise errors[0]
            raise OSError(f"Multiple exceptions: {', '.join(str(exc) for exc in errors)}")
        family, fd = found
    transport = SocketTransport(loop, fd, family, protocol_factory())
    transport.start()
    return transport
