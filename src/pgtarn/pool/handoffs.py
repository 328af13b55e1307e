"""Servers released while clients wait, lent to them once the callback that released them ends.

A server is most often released inside its own read: the ReadyForQuery that ends its
client's transaction, the end of a reset, the end of its login. Lent there, the next client
would write to it while the read that released it is still being relayed, and whatever
follows in that read would be taken for the new client's. So, when the pool has a
``defer`` (the runtime's; sans-IO pools without one lend at once):

- released inside its own read (the hot path under load), a server that goes to a waiting
  client is put with the ``active`` ones and marked (``handoff_at``: when it was released;
  Pool._to_idle), and at the end of that read ``lend_marked`` lends it to the client first
  in the queue then (ServerConnection.data_received): a mark set and read, no queue of its own;
- idle servers given to the waiting clients by RESUME or by a pool taking another's
  waiters (Pool._serve_waiters), and a server back from its cancels (``come_back``), are
  marked alike and handed off by the runtime once the reads under way are over
  (state.HandOffs.due, then ``hand_off``).

Until then it is nobody's and not idle: no client that asks takes it, and the clients
waiting keep their places (``acquire`` queues a newcomer behind them). With nobody left
waiting (or the pool paused), it is released as any server instead: idle, or closed
(RECONNECT, a reload, PAUSE, server_lifetime, past the pool's size). A server closed
meanwhile (KILL, an error on its socket) drops its mark: it goes to nobody, and its close
opens another for the clients waiting.

A release outside any read of the server's own (a client that declined the server it was
given, inside a hand-off) lends at once: no read is under way.
"""

from __future__ import annotations

from .pool import Pool, S


def lend_marked(pool: Pool[S], server: S) -> None:
    """At the end of its read: server, marked in it, to the client first in the queue now;
    with nobody waiting any more, or the pool paused or the server to be closed, released
    as any server."""
    now = server.handoff_at
    server.handoff_at = 0.0
    waiting = pool.waiting
    if pool.paused or server.close_needed or not waiting.count:
        pool._to_idle(server, now, True)
        return
    waited = now - waiting.first_since()
    waiter = waiting.popleft()
    pool.stats.wait.observe(waited if waited > 0.0 else 0.0)  # (queued after it came)
    waiter.server_assigned(server)


def hand_off(pool: Pool[S], server: S) -> None:
    """The runtime's hand-off of a marked server: released now (to the first client
    waiting, or idle or closed as any release); one whose mark was dropped (it closed, or
    a read of its own lent it meanwhile) is left alone."""
    now = server.handoff_at
    if now:
        server.handoff_at = 0.0
        pool._to_idle(server, now, True)


def come_back(pool: Pool[S], server: S) -> None:
    """server, in no container, is back from its cancels (pool/cancels.py): to the waiting
    clients once the callback under way is over, else idle (or closed) at once."""
    defer = pool.defer
    if pool.waiting and defer is not None:
        pool.active.add(server)
        server.handoff_at = pool.clock()
        defer.due(pool, server)
    else:
        pool._to_idle(server)
