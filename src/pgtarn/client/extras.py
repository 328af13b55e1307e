"""The parts of a client's state that few clients have, each made at its first use.

Thousands of clients may sit idle, and a field costs each of them 8 bytes: what only an
admin session, a replication connection or a client with session settings needs lives in
ClientExtras, and an idle client that needs none of it holds none. (A LISTEN state is a
part of its own, listening.py's ClientListen, made the same way.)
"""

from __future__ import annotations

from ..admin.console import AdminSession
from ..server.connection import ServerConnection


class ClientExtras:
    """What few clients use (ClientTransport's properties of the same names read and write
    these): made at the first write of one of them (_extras_made)."""

    __slots__ = (
        "admin",
        "close_logged",
        "close_reason",
        "last_server",
        "replication",
        "schema_pending",
    )

    def __init__(self) -> None:
        #: The admin console's session (admin or stats, AdminSession.admin).
        self.admin: AdminSession | None = None
        #: A replication connection: "physical" or "logical" ("": none, the usual).
        self.replication = ""
        #: Why pgtarn closed the connection (for the log line), "" while it did not.
        self.close_reason = ""
        #: Its "closing because" line is written (once: at close, or when the peer left).
        self.close_logged = False
        #: A client with session settings: the server it last left them on (preferred).
        self.last_server: ServerConnection | None = None
        #: It sent DDL whose transaction has not ended yet: statements prepared meanwhile
        #: (by anyone) may be stale once it commits or rolls back.
        self.schema_pending = False
