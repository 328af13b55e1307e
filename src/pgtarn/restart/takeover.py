"""The takeover socket: where a running pgtarn waits for a new one started with --reboot.

A single process (app.py) and a supervisor (rolling.py) open it the same way; what is said
on it once a new pgtarn connects is reboot.py's.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("pgtarn")


def takeover_address(port: int) -> str:
    """The Linux abstract unix socket (no file) where the pgtarn on port hands over to a new
    one started with --reboot (reboot.py, rolling.py)."""
    return f"\0pgtarn-takeover-{port}"


def accept_takeover(listener: socket.socket | None, busy: bool) -> socket.socket | None:
    """A new pgtarn's connection to the takeover socket, or None: nothing to accept, or
    refused (closed) when busy, as one takeover runs at a time and none while stopping."""
    if listener is None:
        return None
    try:
        conn, _addr = listener.accept()
    except OSError:
        return None
    if busy:
        conn.close()
        return None
    return conn


def takeover_listener(port: int) -> socket.socket | None:
    """The takeover socket of the pgtarn on port (one socket; nothing of reboot.py is loaded
    until a new process connects); None, logged, when it cannot be had."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(takeover_address(port))
        sock.listen(1)
    except OSError as exc:
        sock.close()
        log.warning("no takeover socket (--reboot will not find this process): %s", exc)
        return None
    sock.setblocking(False)
    return sock
