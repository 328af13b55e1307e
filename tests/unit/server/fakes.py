"""Stand-ins for what a server connection talks to: a transport, a linked client, a pool."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, cast

from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import Config
from pgtarn.pool.pool import Pool
from pgtarn.proto import build
from pgtarn.runtime import Runtime
from pgtarn.server.connection import ServerConnection
from pgtarn.server.linked import LinkedClient
from pgtarn.server.login import server_login_for

INI = """
[databases]
app = host=127.0.0.1 port=5432 dbname=appdb password=pw application_name=fromini
[pgbouncer]
auth_type = trust
pool_mode = {mode}
max_prepared_statements = {prepared}
log_connections = 0
log_disconnections = 0
log_pooler_errors = 0
"""

WELCOME = (
    build.authentication(0)
    + build.parameter_status("server_version", "15.0")
    + build.parameter_status("TimeZone", "UTC")
    + build.backend_key_data(7, 8)
    + build.ready_for_query(b"I")
)


class CountingRuntime(Runtime):
    """A runtime whose spawned tasks never run: a connection it is asked to open is only
    counted (the test plays the socket)."""

    def __init__(self, config: Config, userlist: dict[str, str]) -> None:
        super().__init__(config, userlist)
        self.connects = 0

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> Any:
        coro.close()  # no socket: connection_made is the test's
        self.connects += 1
        return None


class FakeTransport(asyncio.Transport):
    """Keeps what is written; a TCP peer unless told otherwise."""

    def __init__(self, peername: object = ("127.0.0.1", 5432)) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False
        self.protocol: asyncio.BaseProtocol | None = None
        self.extra: dict[str, Any] = {"peername": peername, "sockname": ("127.0.0.1", 40000)}

    def take(self) -> bytes:
        """What was written since the last take."""
        out = bytes(self.written)
        self.written.clear()
        return out

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None, "no protocol set"
        return self.protocol


class FakeClient(LinkedClient[ServerConnection]):
    """A linked client that keeps what it is sent and forwards every ReadyForQuery."""

    def __init__(self) -> None:
        self.statements = None
        self.received = bytearray()
        self.statuses: list[bytes] = []
        self.lost = False
        self.errors = 0

    def write(self, data: bytes) -> None:
        self.received += data

    def ready_for_query(self, server: ServerConnection, status: bytes) -> bytes | None:
        self.statuses.append(status)
        return None

    def server_lost(self, server: ServerConnection) -> None:
        self.lost = True

    def parameter_changed(self, name: str, value: str, hidden: bool) -> None:
        pass

    def error_relayed(self) -> None:
        self.errors += 1

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connecting_server(
    mode: str = "session", prepared: int = 0
) -> tuple[ServerConnection, FakeTransport]:
    """A server of pool app/u that has just connected (its StartupMessage taken)."""
    runtime = Runtime(parse_config(INI.format(mode=mode, prepared=prepared)), {})
    db = runtime.config.databases["app"]
    # the registry holds PooledServers; its launcher narrows as app.py's does
    pool = cast(Pool[ServerConnection], runtime.registry.get_pool(db, "u"))
    server = ServerConnection(runtime, pool, db, server_login_for(runtime, pool, db))
    pool.login.add(server)  # as Pool.launch does
    transport = FakeTransport()
    server.connection_made(transport)
    return server, transport


def logged_in_server(
    mode: str = "session", prepared: int = 0
) -> tuple[ServerConnection, FakeTransport]:
    server, transport = connecting_server(mode, prepared)
    server.data_received(WELCOME)
    assert server.login is None
    transport.take()
    return server, transport
