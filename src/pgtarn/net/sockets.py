"""Sockets for client and server connections alike: tuning, addresses, connecting, cancelling."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import cast

from ..config import Config, DatabaseEntry
from ..proto import build

# Its lines are about connections to PostgreSQL: logged as the server connections' are.
log = logging.getLogger("pgtarn.server")


def tune(transport: asyncio.BaseTransport, keepalive: bool) -> bool:
    """TCP_NODELAY (and SO_KEEPALIVE when asked) on a TCP socket; False for a unix socket."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if keepalive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return True


def address(addr: object) -> str:
    """"host:port" of a TCP socket address; a unix socket's path, or "unix" without one."""
    if isinstance(addr, tuple):
        return f"{addr[0]}:{addr[1]}"
    return str(addr or "unix")


async def open_connection(
    db: DatabaseEntry, factory: Callable[[], asyncio.Protocol], timeout: float,
    socket_dir: str = "/tmp",
) -> None:
    """Connect a protocol to a database entry's host: TCP or a unix socket directory.

    An entry without host connects through the unix socket in unix_socket_dir, as PgBouncer.
    """
    loop = asyncio.get_running_loop()
    host = db.host or socket_dir or "/tmp"
    if host.startswith("/"):
        path = os.path.join(host, f".s.PGSQL.{db.port}")
        coro = loop.create_unix_connection(factory, path)
    else:
        coro = loop.create_connection(factory, host, db.port)
    await asyncio.wait_for(coro, timeout or None)


class _CancelOnce(asyncio.Protocol):
    """Sends one CancelRequest when connected, if it is still wanted then, and closes."""

    def __init__(self, request: bytes, still_wanted: Callable[[], bool]) -> None:
        self.request = request
        self.still_wanted = still_wanted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.still_wanted():
            cast(asyncio.Transport, transport).write(self.request)
        transport.close()


async def send_cancel_request(db: DatabaseEntry, pid: int, key: int, config: Config,
                              still_wanted: Callable[[], bool]) -> None:
    """Open a connection and send a CancelRequest, giving up after cancel_wait_timeout.

    cancel_wait_timeout = 0 falls back to server_connect_timeout rather than waiting
    forever: a cancel nobody can deliver must not hold a task for good.
    """
    timeout = config.cancel_wait_timeout or config.server_connect_timeout
    request = build.cancel_request(pid, key)
    try:
        await open_connection(db, lambda: _CancelOnce(request, still_wanted), timeout,
                              config.unix_socket_dir)
    except (TimeoutError, OSError) as exc:
        reason = str(exc) or (
            f"cancel_wait_timeout ({timeout:g} s)" if config.cancel_wait_timeout
            else f"cancel_wait_timeout (0: server_connect_timeout, {timeout:g} s)")
        log.warning("cancel request to %s:%s failed: %s", db.host, db.port, reason)
