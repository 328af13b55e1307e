"""Socket tuning and addresses for client and server connections alike."""

from __future__ import annotations

import asyncio
import socket


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
