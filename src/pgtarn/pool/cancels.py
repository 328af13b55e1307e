"""A pool's servers held while CancelRequests for their backends are in flight (sans-IO).

A CancelRequest goes to PostgreSQL on a connection of its own and lands whenever PostgreSQL
gets to it: a server its client released meanwhile could take it to the next client's query
(57014 "canceling statement due to user request" for a query nobody cancelled). So each
cancel is counted against its server from the moment it is asked for (``cancel_started``)
until it is over (``cancel_ended``): PostgreSQL closed the cancel's connection, which it does
once it has signalled the backend, or the cancel was never sent. A server released while it
has a count goes to the pool's ``being_canceled`` (Pool.release) instead of a client or the
idle list, and the end of its last cancel releases it as usual. A cancel that was sent and
got no answer in time may still land: its server is closed rather than lent again.
"""

from __future__ import annotations

from .handoffs import come_back
from .pool import Pool, S


def cancel_started(pool: Pool[S], server: S, request: bool) -> None:
    """A CancelRequest for server's backend is on its way (request: a client's, whose cancel
    connection waits for its end): from now until it ends, server released goes to no
    client."""
    pool.cancels[server] = pool.cancels.get(server, 0) + 1
    if request:
        pool.cancel_requests += 1


def cancel_ended(pool: Pool[S], server: S, request: bool, answered: bool) -> None:
    """A cancel of cancel_started is over: answered (PostgreSQL closed its connection, or it
    was never sent), or not (sent, no answer in time). The end of a held server's last cancel
    releases it; a cancel not answered closes its server (at once when held, else when its
    client lets it go)."""
    if request:
        pool.cancel_requests -= 1
    left = pool.cancels.get(server, 0) - 1
    if left > 0:
        pool.cancels[server] = left
    else:
        pool.cancels.pop(server, None)
    if not answered:
        server.close_needed = True  # (still linked: closed when released)
    if left > 0 or server not in pool.being_canceled:
        return
    pool.being_canceled.discard(server)
    if not answered:
        server.close("a cancel request was sent and not answered: it may still arrive")
    elif not pool.owed or pool.gate is None or not pool.gate.gives_back(pool, server):
        come_back(pool, server)


def cancels_in_flight(pool: Pool[S]) -> int:
    """SHOW POOLS' sv_active_cancel: the pool's CancelRequests on their way to PostgreSQL."""
    return sum(pool.cancels.values())
