"""LinkedClient: what a server needs of the client it is lent to, imported by both sides."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from mypy_extensions import mypyc_attr

from ..pool.pool import PooledServer, Waiter
from ..session.prepared import ClientStatements

Server = TypeVar("Server", bound=PooledServer, contravariant=True)


@mypyc_attr(allow_interpreted_subclasses=True)
class LinkedClient(asyncio.Protocol, Waiter[Server]):
    """What a server needs of the client it is lent to (Server: the server's own type), and
    what a pool needs of a client that waits (Waiter).

    A base class of the client, not a typing.Protocol: in the compiled build a server's call
    to its client is then a C call through the class's method table, not a Python call.
    """

    __slots__ = ("statements",)

    statements: ClientStatements | None

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def statements_checked(self) -> None:
        """A check pgtarn made of a statement before the client's Bind of it is answered:
        send what waited for it."""
        raise NotImplementedError

    def notification_pid(self) -> int:
        """The pid a notification sent by its own server's backend is to carry: its key's
        in session mode, where that backend is the client's own; 0: as it came."""
        raise NotImplementedError

    def ready_for_query(self, server: Server, status: bytes) -> bytes | None:
        """At each ReadyForQuery: None to forward it, or bytes to send in its place; the
        client may end the link here."""
        raise NotImplementedError

    def server_lost(self, server: Server) -> None:
        raise NotImplementedError

    def parameter_changed(self, name: str, value: str, hidden: bool) -> None:
        """The server reported a new value; hidden: in the reply to pgtarn's own SET (the
        client did not see it)."""
        raise NotImplementedError

    def error_relayed(self) -> None:
        raise NotImplementedError

    def result_relayed(self, msg_type: int, body: bytes) -> None:
        """A DataRow, CommandComplete, EmptyQueryResponse or PortalSuspended is relayed (only
        while the client reads rows: ServerConnection.watch_rows)."""
        raise NotImplementedError

    def pause_reading(self) -> None:
        raise NotImplementedError

    def resume_reading(self) -> None:
        raise NotImplementedError
