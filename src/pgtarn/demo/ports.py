"""Loopback TCP ports for the demo's PostgreSQL and pgtarn: pick a free one, test one."""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "free_port", "port_is_free"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on `host` that was free a moment ago (the OS picked it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Tell whether a server could bind `port` on `host` now (SO_REUSEADDR, like servers)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
