"""The listening sockets of a pgtarn with workers, made once by the supervisor.

TCP: one socket per worker and address, all bound with SO_REUSEPORT, so the kernel spreads
new connections over the workers and each worker accepts only from its own queue (no
thundering herd). The unix socket cannot be shared that way (SO_REUSEPORT has no effect on
AF_UNIX), so it is one socket that every worker accepts from; asyncio accepts in a loop, and
a worker that loses a race simply gets EAGAIN. The supervisor keeps every socket open for the
life of the pgtarn: a restarted worker takes the same sockets, so connections that arrive
while it is down wait in its queue instead of being refused.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from ..errors import ConfigError


def tcp_listeners(hosts: list[str] | None, port: int, backlog: int, copies: int,
                  keepalive: bool = False, reuse_port: bool = True, buffer: int = 0
                  ) -> list[list[socket.socket]]:  # fmt: skip
    """For each of copies workers, its listening sockets on every address of hosts (None:
    every address of the machine, as listen_addr = *). keepalive (tcp_keepalive): set before
    they listen, so that every connection they accept has it (accepted sockets inherit it).
    reuse_port: SO_REUSEPORT, for workers (a single process goes without: a second pgtarn on
    its port must fail to start, not share the port). buffer (tcp_socket_buffer, 0: the
    system's): SO_SNDBUF and SO_RCVBUF, inherited by the connections accepted, whose window
    is agreed on before pgtarn could set them."""
    addresses: list[tuple[socket.AddressFamily, Any]] = []
    for host in hosts if hosts is not None else [None]:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise ConfigError(f"listen_addr {host}: {exc}") from None
        for info in infos:
            address = (info[0], info[4])
            if address not in addresses:
                addresses.append(address)
    made: list[list[socket.socket]] = [[] for _ in range(copies)]
    try:
        for family, sockaddr in addresses:
            for worker in range(copies):
                sock = socket.socket(family, socket.SOCK_STREAM)
                made[worker].append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(keepalive))
                if buffer > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
                try:
                    sock.bind(sockaddr)
                except OSError as exc:
                    raise OSError(
                        exc.errno,
                        f"could not listen on {sockaddr[0]} port {sockaddr[1]}: {exc.strerror}",
                    ) from None
                sock.listen(backlog)
                sock.setblocking(False)
    except OSError:
        for socks in made:
            for sock in socks:
                sock.close()
        raise
    return made


def unix_listener(path: str, backlog: int, mode: int) -> socket.socket:
    """The unix socket at path, listening (ConfigError if a live process listens there)."""
    if os.path.exists(path):
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(path)
            raise ConfigError(f"{path}: another process is listening there")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, mode)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
