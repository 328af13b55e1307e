"""Servers' ends by age and by order: server_lifetime, server_idle_timeout, RECONNECT."""

from __future__ import annotations

from .state import PoolState


def expire_idle(pool: PoolState, now: float) -> None:
    """The janitor closes a pool's idle servers past server_lifetime, or unused for
    server_idle_timeout."""
    for server in list(pool.idle):
        # 0 means "use each server once": closed when released (_to_idle), never while
        # it waits for its first client (min_pool_size would reopen it at once)
        if 0 < pool.lifetime < now - server.created_at:
            reason = "server_lifetime"
        elif (
            0 < pool.idle_timeout < now - server.last_used
            and pool.server_count > pool.min_pool_size
        ):
            reason = "server_idle_timeout"
        else:
            continue
        pool.idle.remove(server)  # out of reach of acquire before it is gone
        server.close(reason)


def reconnect(pool: PoolState) -> None:
    """RECONNECT: close a pool's idle servers now and the others when they are released; the
    listener connection reconnects at once."""
    for server in pool.servers():
        server.close_needed = True
    pool.close_idle("reconnect requested")
    if pool.board is not None:
        pool.board.restart("reconnect requested")
