"""systemd without libsystemd: sd_notify datagrams and socket activation's descriptors.

Notifications (Type=notify) are datagrams of ``KEY=VALUE`` lines sent to the unix socket
that ``$NOTIFY_SOCKET`` names: a path, or an abstract socket when it starts with ``@``.
Without ``$NOTIFY_SOCKET`` every call here returns at once: nothing is opened or sent.
Only the process systemd watches notifies: the supervisor of workers = N starts its workers
with :func:`child_environment`, which leaves the variable out.

Socket activation: when ``$LISTEN_PID`` is our pid, descriptors 3 to 3 + ``$LISTEN_FDS``
- 1 are listening sockets systemd made (the .socket unit's ListenStream=), which pgtarn
serves in place of binding listen_addr, listen_port and unix_socket_dir itself, as
PgBouncer does. The variables are removed once read, so no child process takes them for
its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator

log = logging.getLogger("pgtarn")

#: The first descriptor systemd passes (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3
#: The variables of socket activation, removed once read.
LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
#: A notification must not hold the event loop up for long if systemd is slow to read.
SEND_TIMEOUT = 2.0


def notify(*fields: str) -> bool:
    """Send fields (``KEY=VALUE``) as one datagram to $NOTIFY_SOCKET; True if sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(SEND_TIMEOUT)
            sock.sendto("\n".join(fields).encode(), address)
    except OSError as exc:  # systemd gone or the socket not ours: nothing to tell
        log.warning(
            "systemd notification %s not sent to %s: %s",
            ",".join(fields),
            os.environ.get("NOTIFY_SOCKET"),
            exc,
        )
        return False
    return True


def ready() -> bool:
    """Startup (or a reload) is done: clients may connect."""
    return notify("READY=1", f"MAINPID={os.getpid()}")


def stopping() -> bool:
    """A shutdown has begun."""
    return notify("STOPPING=1")


@contextlib.contextmanager
def reloading() -> Iterator[None]:
    """Around a reload: RELOADING=1 with the time (Type=notify-reload wants it), then
    READY=1 whether the reload worked or not (a failed one keeps the old configuration)."""
    notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
    try:
        yield
    finally:
        ready()


def child_environment() -> dict[str, str]:
    """Our environment without what systemd meant for this process alone."""
    return {
        name: value
        for name, value in os.environ.items()
        if name != "NOTIFY_SOCKET" and name not in LISTEN_VARIABLES
    }


def listen_sockets() -> list[socket.socket]:
    """The listening sockets systemd passed to this process (none without socket activation
    or when $LISTEN_PID names another process); the LISTEN_* variables are removed."""
    pid, count = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    names = os.environ.get("LISTEN_FDNAMES", "")
    for name in LISTEN_VARIABLES:
        os.environ.pop(name, None)
    if pid != str(os.getpid()) or not count or not count.isdigit():
        return []
    sockets: list[socket.socket] = []
    labels = names.split(":") if names else []
    for index, fd in enumerate(range(LISTEN_FDS_START, LISTEN_FDS_START + int(count))):
        label = labels[index] if index < len(labels) else str(fd)
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            log.warning("socket activation: descriptor %d (%s) is not a socket: %s", fd, label, exc)
            continue
        if sock.type != socket.SOCK_STREAM or \
                not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):  # fmt: skip
            log.warning(
                "socket activation: descriptor %d (%s) is not a listening stream socket; ignored",
                fd,
                label,
            )
            sock.detach()
            continue
        # systemd passes them inheritable; children get them only when handed on on purpose
        sock.set_inheritable(False)
        sock.setblocking(False)
        log.info("listening on %s (socket activation, %s)", _address(sock), label)
        sockets.append(sock)
    return sockets


def _address(sock: socket.socket) -> str:
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{name.decode(errors='replace') if isinstance(name, bytes) else name}"
    return str(name[:2])
