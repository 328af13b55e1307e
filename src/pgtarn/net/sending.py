"""A connection's writes: straight to its socket when its transport holds nothing unsent.

A connection's transport is a SocketTransport (net/transport.py), whose write sends at once
what the socket takes; calling it still costs a method lookup and its checks. A connection
instead keeps a *send state* for its transport, one int, and sends with ``native/_io.c``'s
send_some in the compiled build (os.write in the pure one):

- ``fd >= 0``: a plain socket whose transport holds nothing unsent: send on it directly;
- ``SEND_NEVER``: write through the transport always (TLS, a transport of another kind, or
  one closed or about to be);
- ``backlog(fd)``: the socket took less than it was given and the transport holds the rest:
  write through the transport, in order, until it has sent all of it.

What the socket does not take goes to the transport, which then does what it always does:
buffers it, pauses the protocol past its high-water mark, and reports a failed socket through
connection_lost (given bytes the socket refused, it meets the same error). Before it calls
connection_lost the transport's socket is open; a connection sets SEND_NEVER there and
wherever it closes its transport, since a closed transport drops what it is given and its
socket's number may serve a new connection after.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final

from .. import native
from .transport import SocketTransport

#: send_some(fd, data): the bytes of data the socket took (0: none, full or failed).
SendSome = Callable[[int, bytes], int]

#: Write through the transport, always.
SEND_NEVER: Final = -1


def send_some_written(fd: int, data: bytes) -> int:
    """send_some of the pure build: the bytes of data the socket took (0: none, full or
    failed). (Python ignores SIGPIPE: a peer gone is an EPIPE, here a 0.)"""
    try:
        return os.write(fd, data)
    except OSError:
        return 0


#: send_some of native/_io.c when it is built, else the pure build's.
SEND_SOME: Final[SendSome] = send_some_written if native.send_some is None else native.send_some


def backlog(fd: int) -> int:
    """The send state of socket fd while its transport holds unsent bytes (below SEND_NEVER);
    and, given such a state, its fd (the mapping is its own inverse)."""
    return -2 - fd


def send_state_of(transport: asyncio.BaseTransport) -> int:
    """The send state of a new transport: its socket's fd when it is a SocketTransport (a
    plain socket), else SEND_NEVER."""
    return transport.fd if isinstance(transport, SocketTransport) else SEND_NEVER


def send(state: int, transport: asyncio.Transport, data: bytes) -> int:
    """Send data on the socket of state, or through the transport; the send state for the
    next one."""
    if state >= 0:
        sent = SEND_SOME(state, data)
        if sent == len(data):
            return state
        transport.write(data[sent:] if sent else data)
        return backlog(state)
    if state != SEND_NEVER and not transport.get_write_buffer_size():
        return send(backlog(state), transport, data)  # all sent: the socket's again
    transport.write(data)
    return state
