"""Shared enums: where a client connection is in its life (a leaf that imports nothing)."""

from __future__ import annotations

import enum
from typing import Final


class ClientState(enum.Enum):
    """STARTUP -> AUTH -> (WELCOME) -> READY, or ADMIN for the admin console, or REPLICATION
    for a replication connection (its own server, bytes passed as they are); then CLOSED."""

    STARTUP = "startup"
    AUTH = "auth"
    WELCOME = "welcome"
    READY = "ready"
    ADMIN = "admin"
    REPLICATION = "replication"
    CLOSED = "closed"


#: The state of a client that relays, as a constant: compiled, a Final is read from a C static,
#: where ClientState.READY is a dictionary lookup then an attribute lookup at each use.
READY_STATE: Final = ClientState.READY
#: Still logging in: client_login_timeout applies, SHOW LISTS counts them as login_clients.
LOGGING_IN = frozenset({ClientState.STARTUP, ClientState.AUTH})
