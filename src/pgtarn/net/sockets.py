"""Sockets for client and server connections alike: tuning, addresses, connecting, cancelling."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Collection, Iterable, Mapping
from time import monotonic
from typing import cast

from ..config.settings import Config, DatabaseEntry
from ..proto import build
from .accept import SocketServer
from .transport import connect_transport

# Its lines are about connections to PostgreSQL: logged as the server connections' are.
log = logging.getLogger("pgtarn.server")


#: A socket option: (level, name, value).
TcpOption = tuple[int, int, int]


def tcp_options(config: Config) -> tuple[TcpOption, ...]:
    """What tcp_keepidle, tcp_keepintvl and tcp_keepcnt (with tcp_keepalive on),
    tcp_user_timeout and tcp_socket_buffer ask of each TCP connection, client or server, as
    PgBouncer sets them; 0 (the default of each) leaves the system's value: no option."""
    options: list[TcpOption] = []
    if config.tcp_keepalive:
        for name, value in (
            (socket.TCP_KEEPIDLE, config.tcp_keepidle),
            (socket.TCP_KEEPINTVL, config.tcp_keepintvl),
            (socket.TCP_KEEPCNT, config.tcp_keepcnt),
        ):
            if value > 0:
                options.append((socket.IPPROTO_TCP, name, value))
    if config.tcp_user_timeout > 0:
        options.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, config.tcp_user_timeout))
    if config.tcp_socket_buffer > 0:
        options += [
            (socket.SOL_SOCKET, socket.SO_SNDBUF, config.tcp_socket_buffer),
            (socket.SOL_SOCKET, socket.SO_RCVBUF, config.tcp_socket_buffer),
        ]
    return tuple(options)


def tune(
    transport: asyncio.BaseTransport, keepalive: bool, options: tuple[TcpOption, ...] = ()
) -> bool:
    """SO_KEEPALIVE (when asked) and options (tcp_options) on a TCP socket; False for a unix
    socket.

    TCP_NODELAY is on already: asyncio and uvloop set it on every TCP transport they make
    (setting it again cost two system calls per connection, uvloop's transport socket making
    a socket object for each option)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    if keepalive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for level, name, value in options:
        sock.setsockopt(level, name, value)
    return True


def keepalive_listeners(servers: Iterable[SocketServer], keepalive: bool) -> None:
    """SO_KEEPALIVE (tcp_keepalive) on the listening TCP sockets, at start and at RELOAD.

    Linux copies a listening socket's options to each socket it accepts: a client's
    connection has SO_KEEPALIVE from the start, with no system call (nor the socket objects
    the event loop makes to set one) at each login. New clients follow a RELOAD."""
    for server in servers:
        for sock in server.sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(keepalive))


def address(addr: object) -> str:
    """ "host:port" of a TCP socket address; a unix socket's path, or "unix" without one."""
    if isinstance(addr, tuple):
        return f"{addr[0]}:{addr[1]}"
    return str(addr or "unix")


#: A host (or unix socket directory) and port to connect to.
Target = tuple[str, int]


def targets(db: DatabaseEntry, socket_dir: str = "/tmp") -> list[Target]:
    """The entry's hosts with their ports (DatabaseEntry.targets)."""
    return db.targets(socket_dir)


class HostChooser:
    """Which host of an entry's list a new connection tries first (load_balance_hosts):
    round-robin (the default, as PgBouncer) moves on to the next host at each connection;
    disable keeps the host that last worked until it fails. Either way a connection goes on
    to the next host when one cannot be reached (refused, unresolvable), so such a host is
    skipped rather than failing every other attempt."""

    def __init__(self) -> None:
        self.next: dict[str, int] = {}
        #: Per entry, the hosts whose last login did not fit its target_session_attrs:
        #: tried last (not never: roles change at a failover).
        self.unfit: dict[str, set[int]] = {}

    def order(self, db: DatabaseEntry) -> list[int]:
        count = len(db.hosts) or 1
        first = self.next.get(db.name, 0) % count
        rotation = [(first + step) % count for step in range(count)]
        unfit = self.unfit.get(db.name)
        if not unfit:
            return rotation
        return [i for i in rotation if i not in unfit] + [i for i in rotation if i in unfit]

    def mark(self, db: DatabaseEntry, index: int, fits: bool) -> None:
        """A login to host index found it fitting the entry's target_session_attrs, or not."""
        if fits:
            self.unfit.get(db.name, set()).discard(index)
        else:
            self.unfit.setdefault(db.name, set()).add(index)

    def used(self, db: DatabaseEntry, index: int, connected: bool) -> None:
        """A connection to host index connected, or (connected False) none could."""
        sticky = db.load_balance_hosts == "disable" and connected
        self.next[db.name] = index if sticky else index + 1


def role_fits(attrs: str, params: Mapping[str, str]) -> bool:
    """Whether a server whose login reported params fits target_session_attrs, as libpq
    decides it from the in_hot_standby and default_transaction_read_only parameters
    (reported since PostgreSQL 14; an older server, which reports neither, fits any)."""
    standby = params.get("in_hot_standby")
    if standby is None:
        return True
    read_only = standby == "on" or params.get("default_transaction_read_only") == "on"
    if attrs == "read-write":
        return not read_only
    if attrs == "read-only":
        return read_only
    if attrs == "primary":
        return standby == "off"
    if attrs in ("standby", "prefer-standby"):
        return standby == "on"
    return True


def connect_failure(exc: BaseException) -> str:
    """PgBouncer's words for a connect to PostgreSQL that failed, the system's reason after
    them: "server DNS lookup failed (...)" for a host name that does not resolve, else
    "connect failed (...)" (refused, unreachable, timed out)."""
    phrase = "server DNS lookup failed" if isinstance(exc, socket.gaierror) else "connect failed"
    return f"{phrase} ({exc or 'timeout'})"


async def open_connection(
    db: DatabaseEntry,
    factory: Callable[[], asyncio.Protocol],
    timeout: float,
    socket_dir: str = "/tmp",
    chooser: HostChooser | None = None,
    skip: Collection[int] = (),
    buffer: int = 0,
    host_failed: Callable[[Target, BaseException, bool], None] | None = None,
) -> Target:
    """Connect a protocol to one of a database entry's hosts (TCP or a unix socket
    directory), trying them in the chooser's order (but those in skip); returns the one
    connected, or raises the last host's error. host_failed(target, error, more) is told of
    each host that failed, more: another one is tried next (without it, the failures are
    logged here)."""
    hosts = targets(db, socket_dir)
    order = chooser.order(db) if chooser is not None else list(range(len(hosts)))
    order = [index for index in order if index not in skip]
    if not order:
        raise OSError("no host of the list is left to try")
    error: BaseException | None = None
    for at, index in enumerate(order):
        try:
            await connect_to(hosts[index], factory, timeout, buffer)
        except (OSError, TimeoutError) as exc:
            error = exc
            if host_failed is not None:
                host_failed(hosts[index], exc, at + 1 < len(order))
            elif len(order) > 1:
                log.warning(
                    "could not connect to %s:%s for %s: %s",
                    *hosts[index],
                    db.name,
                    exc or "timeout",
                )
            continue
        if chooser is not None:
            chooser.used(db, index, True)
        return hosts[index]
    if chooser is not None:
        chooser.used(db, order[0], False)
    assert error is not None
    raise error


async def connect_to(
    target: Target, factory: Callable[[], asyncio.Protocol], timeout: float, buffer: int = 0
) -> None:
    """Connect a protocol to one host and port (TCP, or a unix socket directory), on a
    transport of pgtarn's own (net/transport.py); buffer: tcp_socket_buffer."""
    host, port = target
    path = os.path.join(host, f".s.PGSQL.{port}") if host.startswith("/") else None
    await asyncio.wait_for(connect_transport(factory, host, port, path, buffer), timeout or None)


class _CancelOnce(asyncio.Protocol):
    """Sends one CancelRequest when connected, if it is still wanted then (else closes);
    ``ended`` is done when the connection is gone: PostgreSQL closes it once it has signalled
    the backend (or found nothing to signal)."""

    def __init__(self, request: bytes, still_wanted: Callable[[], bool]) -> None:
        self.request = request
        self.still_wanted = still_wanted
        self.sent = False
        self.transport: asyncio.Transport | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.still_wanted():
            self.transport.write(self.request)
            self.sent = True
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


async def send_cancel_request(
    target: Target, pid: int, key: int, config: Config, still_wanted: Callable[[], bool]
) -> bool:
    """Open a connection, send a CancelRequest (if still_wanted then) and wait until
    PostgreSQL closes the connection, all within cancel_wait_timeout; whether the cancel is
    over: answered, or never sent. False: it was sent and not answered in time, so it may
    still reach the backend (logged, as a cancel that cannot connect is).

    cancel_wait_timeout = 0 falls back to server_connect_timeout rather than waiting
    forever: a cancel nobody can deliver must not hold a task (nor a server) for good.
    """
    timeout = config.cancel_wait_timeout or config.server_connect_timeout
    deadline = monotonic() + timeout
    cancel = _CancelOnce(build.cancel_request(pid, key), still_wanted)
    try:
        await connect_to(target, lambda: cancel, timeout)
        await asyncio.wait_for(cancel.ended, max(deadline - monotonic(), 0.001))
    except (TimeoutError, OSError) as exc:
        reason = str(exc) or (
            f"cancel_wait_timeout ({timeout:g} s)"
            if config.cancel_wait_timeout
            else f"cancel_wait_timeout (0: server_connect_timeout, {timeout:g} s)"
        )
        log.warning("cancel request to %s:%s failed: %s", *target, reason)
        if cancel.transport is not None:
            cancel.transport.abort()
        return not cancel.sent
    return True
