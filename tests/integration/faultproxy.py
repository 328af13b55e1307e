"""A TCP proxy for tests that can cut, refuse or blackhole connections to a server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeVar

from tests.support import make_dsn

LISTEN_HOST = "127.0.0.1"
WRITE_HIGH_WATER = 64 * 1024
"""Bytes buffered for a transport before reading from its peer is paused."""
WRITE_LOW_WATER = 16 * 1024
CALL_TIMEOUT = 10.0
"""Seconds an API call waits for the proxy's loop to carry it out."""

_T = TypeVar("_T")


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _abort(transport: asyncio.BaseTransport) -> None:
    """Close at once; with SO_LINGER 0 the kernel sends an RST rather than a FIN."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert isinstance(transport, asyncio.Transport)
    transport.abort()


class _Side(asyncio.Protocol):
    """One end of a proxied pair: the accepted client socket or the upstream socket."""

    def __init__(self, pair: _Pair) -> None:
        self.pair = pair
        self.transport: asyncio.Transport | None = None
        self.reading = True
        self.write_paused = False
        self.eof = False

    @property
    def peer(self) -> _Side:
        return self.pair.server if self is self.pair.client else self.pair.client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        _set_nodelay(transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        if self.pair.closed:  # cut while the upstream connect was in flight
            _abort(transport)
            return
        if self is self.pair.client:
            self.pair.proxy._accepted_pair(self.pair)
        self.pair.update_reading()

    def set_reading(self, want: bool) -> None:
        if self.transport is None or want == self.reading:
            return
        self.reading = want
        if want:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        peer = self.peer.transport
        if peer is not None:
            peer.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        self.reading = False  # asyncio stops reading a transport kept open after EOF
        peer = self.peer
        if peer.transport is not None and peer.transport.can_write_eof():
            peer.transport.write_eof()  # sent once the buffered data is out
        if peer.eof:
            self.pair.close(abort=False)
        return True  # keep the half-closed connection: the peer may still send

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pair.close(abort=exc is not None)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.pair.update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.pair.update_reading()


class _Pair:
    """An accepted client connection and its upstream connection (once made)."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.client = _Side(self)
        self.server = _Side(self)
        self.connect_task: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def sides(self) -> tuple[_Side, _Side]:
        return (self.client, self.server)

    def update_reading(self) -> None:
        """Read a side only if its bytes can go somewhere right now."""
        for side in self.sides:
            peer = side.peer
            side.set_reading(
                not self.closed
                and not self.proxy._blackholed
                and not side.eof
                and peer.transport is not None
                and not peer.write_paused
            )

    def close(self, *, abort: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy._pairs.discard(self)
        if self.connect_task is not None:
            self.connect_task.cancel()
        for side in self.sides:
            if side.transport is not None:
                if abort:
                    _abort(side.transport)
                else:
                    side.transport.close()  # flushes what is buffered first


class FaultProxy:
    """Forwards TCP connections from 127.0.0.1:`port` to target_host:target_port.

    Its event loop runs in a daemon thread of its own, so it works alike for
    synchronous tests and for tests that run asyncio in the main thread. Every
    method may be called from any other thread and returns once its change has
    taken effect in the proxy's loop.

    Faults:

    - ``cut()`` aborts every proxied connection, both sides, with an RST;
      connections made afterwards work.
    - ``down()`` closes the listening socket (connects get ECONNREFUSED) and
      cuts every connection; ``up()`` listens on the same port again.
    - ``blackhole()`` stops all traffic without closing anything: new
      connections are accepted but get no upstream connection and nothing is
      read from them; existing ones stop reading both sides, so bytes sent
      from then on wait in the kernel's socket buffers (nothing is dropped;
      bytes that were already in the proxy's write buffers still go out).
      The proxy does not notice a peer closing meanwhile. ``blackhole(False)``
      resumes: existing connections deliver what waited, and each held new
      connection gets its upstream connection and is forwarded normally (one
      whose client has given up meanwhile is then closed as usual).

    - ``stall_connects()`` keeps every existing connection working but makes new connects
      hang: the proxy stops listening and holds its port with a socket whose accept queue is
      full, so the kernel drops each SYN (the connecting side sees no answer until its own
      timeout). ``stall_connects(False)`` listens normally again.

    ``active()`` counts every pair not yet closed, held and connecting ones
    included; ``accepted`` counts connections accepted since start().
    """

    def __init__(self, target_host: str, target_port: int, listen_host: str = LISTEN_HOST) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = listen_host
        self.port = 0
        self.accepted = 0
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._blackholed = False
        self._stalled: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle

    def start(self) -> None:
        """Start the loop thread and listen on a free port of 127.0.0.1."""
        with self._lock:
            if self._thread is not None or self._closed:
                raise RuntimeError("FaultProxy.start() may be called once")
            self._thread = threading.Thread(
                target=self._run, name=f"faultproxy->{self.target_port}", daemon=True
            )
            self._thread.start()
        if not self._ready.wait(CALL_TIMEOUT):
            raise RuntimeError("the fault proxy's loop did not start")
        if self._start_error is not None:
            self._thread.join(CALL_TIMEOUT)
            raise self._start_error

    def close(self) -> None:
        """Cut everything, stop listening, stop the loop and join its thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop ended on its own
                loop.call_soon_threadsafe(stop.set)
        thread.join(CALL_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError("the fault proxy's thread did not stop")

    def __enter__(self) -> FaultProxy:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def dsn(self, user: str, password: str | None, dbname: str = "app", **extra: object) -> str:
        """libpq connection string through the proxy (like PgtarnProcess.dsn)."""
        return make_dsn(
            host=self.host, port=self.port, dbname=dbname, user=user, password=password, **extra
        )

    # -- faults

    def cut(self) -> int:
        """Abort every proxied connection (RST to both sides); return how many pairs."""
        return self._call(self._cut)

    def down(self) -> None:
        """Stop listening (connects are refused) and cut every connection."""
        self._call(self._down)

    def up(self) -> None:
        """Listen again, on the same port; a no-op if listening."""
        self._call(self._up)

    def blackhole(self, on: bool = True) -> None:
        """Stall all traffic (see the class docstring), or resume it with on=False."""
        self._call(lambda: self._set_blackhole(on))

    def stall_connects(self, on: bool = True) -> None:
        """Make new connects hang, or listen normally again (see the class docstring)."""
        self._call(lambda: self._set_stalled(on))

    def active(self) -> int:
        """Number of proxied connection pairs not yet closed."""
        return self._call(self._active)

    # -- in the proxy's loop

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self._listen()
            assert self._server is not None
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:
            self._start_error = exc
            return
        finally:
            self._ready.set()
        try:
            await self._stop.wait()
        finally:
            for sock in self._stalled:
                sock.close()
            self._stalled = []
            await self._down()
            if self._tasks:
                for task in self._tasks:
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def _call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        loop = self._loop
        if loop is None or self._closed or not self._ready.is_set() or self._start_error:
            raise RuntimeError("the fault proxy is not running")
        if threading.current_thread() is self._thread:
            raise RuntimeError("FaultProxy methods must not be called from its own loop")

        async def run() -> _T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(CALL_TIMEOUT)

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Pair(self).client, self.host, self.port, reuse_address=True
        )

    def _accepted_pair(self, pair: _Pair) -> None:
        self.accepted += 1
        self._pairs.add(pair)
        if not self._blackholed:
            self._connect_upstream(pair)

    def _connect_upstream(self, pair: _Pair) -> None:
        task = asyncio.get_running_loop().create_task(self._open_upstream(pair))
        pair.connect_task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_upstream(self, pair: _Pair) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: pair.server, self.target_host, self.target_port)
        except OSError:
            pair.connect_task = None
            pair.close(abort=True)  # upstream unreachable: reset the client
        else:
            pair.connect_task = None

    async def _settle(self) -> None:
        """Let the loop run the connection_lost callbacks that aborts scheduled."""
        for _ in range(3):
            await asyncio.sleep(0)

    async def _cut(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.close(abort=True)
        await self._settle()
        return len(pairs)

    async def _down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # closes the listening socket at once
        await self._cut()
        if server is not None:
            await asyncio.wait_for(server.wait_closed(), CALL_TIMEOUT)

    async def _up(self) -> None:
        if self._server is None:
            await self._listen()

    async def _set_blackhole(self, on: bool) -> None:
        self._blackholed = on
        for pair in list(self._pairs):
            if not on and pair.server.transport is None and pair.connect_task is None:
                self._connect_upstream(pair)  # held while blackholed
            pair.update_reading()

    async def _set_stalled(self, on: bool) -> None:
        if on and not self._stalled:
            server, self._server = self._server, None
            if server is not None:
                server.close()  # the listening socket only: proxied pairs carry on
            holder = socket.socket()
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind((self.host, self.port))
            holder.listen(0)
            self._stalled = [holder]
            for _ in range(3):  # never accepted: they fill the accept queue
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex((self.host, self.port))
                self._stalled.append(filler)
        elif not on and self._stalled:
            for sock in self._stalled:
                sock.close()
            self._stalled = []
            await self._listen()

    async def _active(self) -> int:
        return len(self._pairs)


__all__ = ["FaultProxy"]
