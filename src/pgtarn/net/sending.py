"""A server connection's writes: straight to its socket when its transport holds nothing unsent.

In uvloop a transport's write costs about 900 instructions before the system call (a buffer
list appended to and cleared, flow-control checks). The compiled build has a helper,
``net/_send.c``, that makes the send(2) itself for about 100; the pure build does the same
with os.write. A server connection keeps a *send state* for its transport, one int:

- ``fd >= 0``: a plain socket whose transport holds nothing unsent: send on it directly;
- ``SEND_NEVER``: write through the transport always (TLS, a transport of an unknown kind, or
  one closed or about to be);
- ``backlog(fd)``: the socket took less than it was given and the transport holds the rest:
  write through the transport, in order, until it has sent all of it.

What the socket does not take goes to the transport, which then does what it always does:
buffers it, pauses the protocol past its high-water mark, and reports a failed socket through
connection_lost (given bytes the socket refused, it meets the same error). Before it calls
connection_lost the transport's socket is open; a connection sets SEND_NEVER there and
wherever it closes its transport, since a closed transport drops what it is given and its
socket's number may serve a new connection after.

Clients keep the transport's write (write_of): uvloop gives a transport's socket only through
get_extra_info("socket"), whose socket object (72 bytes) the transport then keeps for its
life, and a few thousand idle clients would each hold one (ARCHITECTURE.md, Memory).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final, cast

#: A transport's write, as its class has it: called with the transport and the bytes.
TransportWrite = Callable[[asyncio.Transport, bytes], object]
#: send_some(fd, data): the bytes of data the socket took (0: none, full or failed).
SendSome = Callable[[int, bytes], int]

#: Write through the transport, always.
SEND_NEVER: Final = -1
#: Transport classes that are a plain socket (uvloop's and asyncio's); not TLS.
PLAIN_TRANSPORTS: Final = frozenset({"TCPTransport", "UnixTransport",
                                     "_SelectorSocketTransport"})


def send_some_written(fd: int, data: bytes) -> int:
    """send_some of the pure build: the bytes of data the socket took (0: none, full or
    failed). (Python ignores SIGPIPE: a peer gone is an EPIPE, here a 0.)"""
    try:
        return os.write(fd, data)
    except OSError:
        return 0


_helper: SendSome | None
try:
    from ._send import send_some as _helper
except ImportError:  # the pure build, or the helper not built
    _helper = None

#: send_some of net/_send.c when it is built, else the pure build's.
SEND_SOME: Final[SendSome] = send_some_written if _helper is None else _helper


def backlog(fd: int) -> int:
    """The send state of socket fd while its transport holds unsent bytes (below SEND_NEVER);
    and, given such a state, its fd (the mapping is its own inverse)."""
    return -2 - fd


def send_state_of(transport: asyncio.BaseTransport) -> int:
    """The send state of a new transport: its socket's fd when it is a plain socket, else
    SEND_NEVER."""
    if type(transport).__name__ not in PLAIN_TRANSPORTS:
        return SEND_NEVER
    sock = transport.get_extra_info("socket")
    return SEND_NEVER if sock is None else int(sock.fileno())


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


def write_of(transport: asyncio.Transport) -> TransportWrite:
    """The write function of transport's class, kept by a client for its transport.

    Compiled, ``transport.write(data)`` looks the method up by name at every call, about 150
    instructions of the 1,000 of a write; the function kept is called directly.
    """
    return cast(TransportWrite, type(transport).write)


def no_transport(transport: asyncio.Transport, data: bytes) -> None:
    """The write of a client that has had no transport yet (never called: writes check the
    transport first)."""
    raise AssertionError("no transport")
