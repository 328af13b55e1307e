"""A transport of pgtarn's own on a plain TCP or unix socket: one loop callback per read.

uvloop's transports take the GIL back twice per read (libuv asks Python for a buffer, then
hands it the bytes) and keep a socket object, a buffer list and a weak reference per
connection. A SocketTransport asks the loop to watch its socket (``add_reader``) and reads it
itself when told it is readable: one callback, one recv(2) and one bytes object per read
(net/_io.c in the compiled build). It sends what it is given at once and buffers only what
the socket does not take, watching for writability (``add_writer``) until that is sent.

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

A socket that fails (its peer reset it, say) needs a second watch. When epoll reports an
error, libuv stops watching the socket and uvloop calls the reader once more, then closes
its watch: if the socket still held bytes from the peer, that one read returns them and
the error behind them would never be seen, the connection waiting forever (a PostgreSQL
backend that sends FATAL and exits with our next query unread resets its socket just so).
So each transport's socket is also in an epoll set of the loop's that reports nothing but
errors and hang-ups (``ErrorWatch``); when it does, the transport reads what is left and
ends. It costs two epoll_ctl calls per connection, none per read.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
from collections.abc import Callable
from typing import Any, Final, cast

#: recv_some(fd): the bytes a socket holds now, b"" at its end, None when it holds none.
RecvSome = Callable[[int], bytes | None]
#: send_part(fd, data): the bytes the socket took now, 0 when it is full; OSError on failure.
SendPart = Callable[[int, bytes | bytearray | memoryview], int]

#: accept_some(fd): a connection accepted on listening socket fd (its fd, non-blocking, and
#: its peer's address), None when none waits; OSError on failure.
AcceptSome = Callable[[int], tuple[int, Any] | None]

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


_recv: RecvSome | None
_send: SendPart | None
_accept: AcceptSome | None
try:
    from ._io import accept_some as _accept
    from ._io import recv_some as _recv
    from ._io import send_part as _send
except ImportError:  # the pure build, or the helper not built
    _recv = _send = _accept = None

#: net/_io.c's when it is built, else the pure build's.
RECV_SOME: Final[RecvSome] = recv_read if _recv is None else _recv
SEND_PART: Final[SendPart] = send_written if _send is None else _send
ACCEPT_SOME: Final[AcceptSome] = accept_accepted if _accept is None else _accept


class SocketTransport:
    """An open non-blocking socket (its fd, owned from now on) and the protocol it feeds."""

    __slots__ = ("_buffer", "_buffered", "_closing", "_data_received", "_lost",
                 "_paused_writing", "_peer", "_protocol", "_reading", "_writing", "family", "fd",
                 "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, family: int,
                 protocol: asyncio.Protocol, peer: Any = None) -> None:
        self.loop = loop
        self.fd = fd
        #: AF_INET, AF_INET6 or AF_UNIX.
        self.family = family
        self._protocol = protocol
        #: The peer address accept(2) gave, until asked once (a client asks at its
        #: connection_made and keeps what it needs: a getpeername less per login, and no
        #: address kept per connection); then the socket is asked.
        self._peer = peer
        #: Its protocol's data_received, kept: looked up by name at each read it cost about
        #: 150 instructions more.
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
        error_watch(self.loop).add(self)
        self.resume_reading()
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
            self.pause_reading()
            if not self._protocol.eof_received():
                self.close()

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
            self._buffer = [memoryview(data)[sent:] if isinstance(data, bytes)
                            else bytes(data)[sent:]]
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
        self.pause_reading()
        if self._buffer is None:
            self._lose(None)

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
            self.loop.remove_reader(self.fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self.loop.add_reader(self.fd, self._read_ready)

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
        """The socket failed or hung up (ErrorWatch): hand the protocol what it still holds,
        then end with the error (or as at the end of the stream)."""
        while not self._lost:
            try:
                data = RECV_SOME(self.fd)
            except OSError as exc:
                self._fail(exc)
                return
            if data is None:  # nothing held, and recv reports no error: ask the socket
                code = TransportSocket(self.fd, self.family).getsockopt(
                    socket.SOL_SOCKET, socket.SO_ERROR)
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
        error_watch(self.loop).remove(self.fd)
        self.pause_reading()
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)
        self.loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            os.close(self.fd)  # (after connection_lost: its number may serve a new socket)


class ErrorWatch:
    """The sockets of a loop's transports in an epoll set that reports only their errors and
    hang-ups (registered with no events), itself read by the loop: see the module's
    docstring."""

    __slots__ = ("epoll", "loop", "transports")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.epoll = select.epoll()
        self.transports: dict[int, SocketTransport] = {}
        loop.add_reader(self.epoll.fileno(), self._ready)

    def add(self, transport: SocketTransport) -> None:
        self.epoll.register(transport.fd, 0)
        self.transports[transport.fd] = transport

    def remove(self, fd: int) -> None:
        if self.transports.pop(fd, None) is not None:
            self.epoll.unregister(fd)

    def _ready(self) -> None:
        for fd, _ in self.epoll.poll(0):
            transport = self.transports.get(fd)
            if transport is not None:
                transport.broken()

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.remove_reader(self.epoll.fileno())
        self.epoll.close()


#: Each loop's ErrorWatch (one loop in pgtarn; tests make many).
_watches: dict[asyncio.AbstractEventLoop, ErrorWatch] = {}


def error_watch(loop: asyncio.AbstractEventLoop) -> ErrorWatch:
    """The ErrorWatch of loop, made at its first transport (and the watches of closed loops
    dropped then)."""
    watch = _watches.get(loop)
    if watch is None:
        for other in [other for other in _watches if other.is_closed()]:
            _watches.pop(other).close()
        watch = _watches[loop] = ErrorWatch(loop)
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


async def open_socket(loop: asyncio.AbstractEventLoop, family: int, address: Any) -> int:
    """A non-blocking socket connected to address (TCP_NODELAY on TCP): its fd, the caller's
    from now on."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock.detach()


async def connect_transport(protocol_factory: Callable[[], asyncio.Protocol], host: str,
                            port: int, path: str | None = None) -> SocketTransport:
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
                found = info[0], await open_socket(loop, info[0], info[4])
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
