"""Listening sockets whose connections each get a SocketTransport (in place of asyncio's servers).

A connection accepted here is the client's socket, non-blocking, with TCP_NODELAY on TCP (as
asyncio and uvloop set it), handed to a new protocol on a SocketTransport (net/transport.py).
It is accepted with accept4(2) in the compiled build (net/_io.c: no socket object, and the
peer's address kept by the transport until the protocol asks for it once), and TCP_NODELAY is
set on the listening sockets, which Linux copies to each connection they accept: a login
makes no system call for either. This module is compiled with the login path (setup.py): a
connection's accept was a Python frame.
The listening sockets are made by the caller (its own, systemd's, the supervisor's, a pgtarn
handing over); close() stops accepting and closes them.

When the process is out of file descriptors (or the kernel of memory for one more socket),
accept(2) fails until a connection closes: the socket stays in the queue, and accepting
pauses for a second rather than spinning on a listening socket that stays readable (as
asyncio does).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Final

from .transport import ACCEPT_SOME, SocketTransport

log = logging.getLogger("pgtarn.net")

#: Connections accepted per wake-up at most, so that a burst cannot starve the others.
ACCEPT_BATCH: Final = 128
#: Seconds to pause accepting when the process is out of file descriptors.
ACCEPT_RETRY_DELAY: Final = 1.0
#: accept(2) errors that pause accepting (resources), and those of one lost connection.
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def adopt(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.Protocol
) -> SocketTransport:
    """Start a SocketTransport for protocol on a connected socket, which it owns from now on
    (the socket object is detached)."""
    sock.setblocking(False)
    family = sock.family
    if family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = SocketTransport(loop, sock.detach(), family, protocol)
    transport.start()
    return transport


class SocketServer:
    """Listening sockets, accepting into protocols from protocol_factory."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket.socket],
        protocol_factory: Callable[[], asyncio.Protocol],
    ) -> None:
        self.loop = loop
        self.sockets = sockets
        self.protocol_factory = protocol_factory
        self.serving = False
        self._resume: asyncio.TimerHandle | None = None
        for sock in sockets:
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (inherited)
        self._start()

    def _start(self) -> None:
        self._resume = None
        self.serving = True
        for sock in self.sockets:
            # its fd and family read here, once: each read of sock.family makes an enum
            fd = sock.fileno()
            self.loop.add_reader(fd, self._accept, fd, int(sock.family))

    def _stop(self) -> None:
        self.serving = False
        for sock in self.sockets:
            self.loop.remove_reader(sock.fileno())

    def _accept(self, listening: int, family: int) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                accepted = ACCEPT_SOME(listening)
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    continue  # that one connection is gone (ECONNABORTED and the like)
                log.error(
                    "could not accept a connection (%s): accepting again in %g s",
                    exc.strerror,
                    ACCEPT_RETRY_DELAY,
                )
                self._stop()
                self._resume = self.loop.call_later(ACCEPT_RETRY_DELAY, self._start)
                return
            if accepted is None:
                return  # none left (or another worker took it: a shared unix socket)
            fd, peer = accepted
            transport = SocketTransport(self.loop, fd, family, self.protocol_factory(), peer)
            try:
                transport.start()
            except Exception:  # its socket could not be watched, or its protocol failed
                log.exception("accepted connection dropped")
                transport.abort()

    def close_tcp(self) -> None:
        """Stop accepting on the TCP listening sockets and close them; a unix socket goes on
        (a shutdown keeps it for the admin console)."""
        closing = [sock for sock in self.sockets if sock.family != socket.AF_UNIX]
        self.sockets = [sock for sock in self.sockets if sock.family == socket.AF_UNIX]
        for sock in closing:
            if self.serving:
                self.loop.remove_reader(sock.fileno())
            sock.close()

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections made stay open)."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self.serving:
            self._stop()
        for sock in self.sockets:
            sock.close()
