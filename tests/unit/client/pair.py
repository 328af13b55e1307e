"""A client and the servers of its pool, all real objects on fake transports (no sockets)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import cast

from pgtarn.client.connection import ClientConnection
from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.pool.pool import Pool as PoolOf
from pgtarn.pool.pool import PooledServer
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.runtime import Runtime
from pgtarn.server.connection import ServerConnection
from pgtarn.server.login import server_login_for

from ..server.fakes import FakeTransport

INI = """
[databases]
app = host=127.0.0.1 port=5432 dbname=appdb password=pw
[pgbouncer]
auth_type = trust
pool_mode = {mode}
default_pool_size = {pool_size}
max_prepared_statements = {prepared}
log_connections = 0
log_disconnections = 0
log_pooler_errors = 0
"""

SERVER_WELCOME = (
    build.authentication(0)
    + build.parameter_status("server_version", "15.0")
    + build.parameter_status("TimeZone", "UTC")
    + build.parameter_status("DateStyle", "ISO, MDY")
    + build.backend_key_data(7, 8)
    + build.ready_for_query(b"I")
)


class ClientSide(FakeTransport):
    """A client's transport: also asked how much it has yet to send, and whether it reads."""

    reading = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def result(status: bytes = b"I") -> bytes:
    """PostgreSQL's reply to a one-row SELECT, ending in ReadyForQuery with status."""
    return (
        build.row_description([("x", 23)])
        + build.data_row(["1"])
        + build.command_complete("SELECT 1")
        + build.ready_for_query(status)
    )


class Pool:
    """A runtime whose pool servers are ServerConnections on fake transports."""

    def __init__(
        self, mode: str = "transaction", pool_size: int = 1, prepared: int = 0, more: str = ""
    ) -> None:
        """more: lines added to [pgbouncer]."""
        self.runtime = Runtime(
            parse_config(INI.format(mode=mode, pool_size=pool_size, prepared=prepared) + more),
            {"u": ""},
        )
        self.servers: list[ServerConnection] = []
        self.runtime.registry.launch = self._launch
        #: What the loop would call once its reads are over (the hand-off step), in order.
        self.after: list[Callable[[], None]] = []
        self.runtime.handoffs.later = self.after.append

    def _launch(self, registered: PoolOf[PooledServer], db: DatabaseEntry) -> ServerConnection:
        pool = cast(PoolOf[ServerConnection], registered)  # (as app.py's launcher narrows it)
        server = ServerConnection(self.runtime, pool, db, server_login_for(self.runtime, pool, db))
        server.connection_made(FakeTransport())
        self.servers.append(server)
        return server

    def reads_over(self) -> None:
        """The loop's reads are over: what was to follow them runs (servers handed off)."""
        while self.after:
            self.after.pop(0)()

    def log_in_servers(self) -> None:
        for server in self.servers:
            if server.login is not None:
                server.data_received(SERVER_WELCOME)
                sent(server)  # the StartupMessage and nothing else
        self.reads_over()  # (servers handed off outside their read)

    def client(self, **params: str) -> tuple[ClientConnection, ClientSide]:
        """A client logged in to app (trust), its welcome taken."""
        client = ClientConnection(self.runtime)
        transport = ClientSide(("127.0.0.1", 40001))
        client.connection_made(transport)
        client.data_received(build.startup_message({"user": "u", "database": "app", **params}))
        self.log_in_servers()
        assert [t for t, _ in split_messages(transport.take())][-1] == ord("Z")
        return client, transport


def fields_of(cls: type) -> list[str]:
    """The fields a class declares itself (slots or, compiled, attributes), by name."""
    return [name for name, value in vars(cls).items() if inspect.isdatadescriptor(value)]


def sent(server: ServerConnection) -> bytes:
    """What the server wrote to PostgreSQL since the last look."""
    transport = server.transport
    assert isinstance(transport, FakeTransport)
    return transport.take()


def types(data: bytes) -> str:
    return "".join(chr(t) for t, _ in split_messages(data))
