"""Starting a pool's new server: connecting it in the background."""

from __future__ import annotations

from ..config.settings import DatabaseEntry
from ..pool.pool import Pool
from ..runtime import Runtime
from .connection import ServerConnection
from .login import server_login_for
from .transport import log


def launch_server(
    runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry
) -> ServerConnection:
    """Create a server connection and start connecting it in the background."""
    server = ServerConnection(runtime, pool, db, server_login_for(runtime, pool, db))
    split = pool.split
    if split is not None and pool.host_index < 0 and split.hosts.split_brain:
        server.refuse(
            "more than one server claims to be the primary: no writes until one "
            "does (see SHOW HOSTS)"
        )
        return server
    if pool.server_count >= pool.pool_size:  # past pool_size: only the reserve opens more
        log.info("%r taking connection from reserve_pool", server)
    server.start_connecting()
    return server
