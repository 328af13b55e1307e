"""Starting a pool's new server: its credentials, and connecting it in the background."""

from __future__ import annotations

from ..config import DatabaseEntry
from ..errors import ProtocolViolation
from ..net.sockets import open_connection
from ..pool.pool import Pool
from ..proto.server_login import LOGIN_MAX, ServerAuth, ServerLogin
from ..runtime import Runtime
from .connection import ServerConnection


def server_login_for(runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry
                     ) -> ServerLogin:
    """Credentials for a new server of a pool.

    The password is the entry's own, else the auth_file secret of the pool's user. A stored
    SCRAM verifier cannot log in by itself: then the keys from a client's SCRAM login are
    used (SCRAM passthrough).
    """
    password = db.password if db.password is not None else runtime.userlist.get(pool.user)
    if password is None:
        password = runtime.looked_up(db, pool.user)  # auth_query found it at a client's login
    keys = None
    if password is not None and password.startswith("SCRAM-SHA-256$"):
        keys = pool.scram_keys
        password = None
    auth = ServerAuth(pool.user, password, keys, runtime.config.server_channel_binding)
    return ServerLogin(auth, db.dbname, db.startup_params,
                       min(runtime.config.max_packet_size, LOGIN_MAX))


def launch_server(runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry
                  ) -> ServerConnection:
    """Create a server connection and start connecting it in the background."""
    server = ServerConnection(runtime, pool, db, server_login_for(runtime, pool, db))

    async def connect() -> None:
        try:
            await open_connection(db, lambda: server, runtime.config.server_connect_timeout,
                                  runtime.config.unix_socket_dir)
        except (TimeoutError, OSError) as exc:
            server.connection_failed(exc if str(exc) else ProtocolViolation("timeout"))

    runtime.spawn(connect())
    return server

