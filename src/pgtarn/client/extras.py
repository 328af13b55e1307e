"""The parts of a client's state that few clients have, each made at its first use.

Thousands of clients may sit idle, and a field costs each of them 8 bytes: what only a
listener, an admin session, a replication connection or statement mode needs
lives in these, and an idle client that needs none of it holds none of them.
"""

from __future__ import annotations

from typing import Any

from ..admin.console import AdminSession
from ..server.connection import ServerConnection
from ..session.effects import Parsed

#: Shared by every client that listens to nothing (an empty frozenset is not a singleton).
NO_CHANNELS: frozenset[str] = frozenset()


class ClientListen:
    """A tracked client's LISTEN state (listening.py): made at its first LISTEN, reply owed
    or notification, as most clients never listen and thousands of idle ones then hold none
    of these fields."""

    __slots__ = ("answers", "held_batch", "local_statements", "notify_queue", "subscribed",
                 "withheld")

    def __init__(self) -> None:
        #: LISTEN/UNLISTEN batches answered by pgtarn: [ReadyForQuery owed before its reply,
        #: its subscriptions, its replies (None: a CommandComplete per subscription), whether
        #: a ReadyForQuery ends it], oldest first.
        self.answers: list[list[Any]] = []
        #: Its statements of LISTEN/UNLISTEN that pgtarn answers (extended protocol), by name.
        self.local_statements: dict[bytes, Parsed] | None = None
        #: The channels the pool's board has for this client (whether some of them are not
        #: confirmed by the listener connection yet is the client's `listen_wait`).
        self.subscribed = NO_CHANNELS
        #: The ReadyForQuery withheld until they are (b"": none).
        self.withheld = b""
        #: The start of an extended-protocol batch pgtarn may answer (LISTEN), not whole yet:
        #: the relay puts it before the next chunk (listening.py, _local_batches).
        self.held_batch = b""
        #: Notifications waiting to go out.
        self.notify_queue: list[bytes] = []

    def holds_anything(self) -> bool:
        """Something owed, held, queued or subscribed (a takeover waits for none)."""
        return bool(self.answers or self.local_statements or self.subscribed or self.withheld
                    or self.held_batch or self.notify_queue)


class ClientExtras:
    """What few clients use (ClientTransport's properties of the same names read and write
    these): made at the first write of one of them (_extras_made)."""

    __slots__ = ("admin", "close_logged", "close_reason", "last_server", "replication",
                 "schema_pending")

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
