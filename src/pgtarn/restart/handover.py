"""What a client handed to a new pgtarn (--reboot) carries with its socket, as a message.

The old process sends an idle client's socket (SCM_RIGHTS) with this state; the new one
goes on serving the client as if nothing happened: no login, no welcome, the same cancel
key. Sans-IO: a HandedClient in, a JSON-able dict out, and back, checked field by field
(the two processes may be different versions of pgtarn; a field that does not check out
leaves the client on the old process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The format of the message; a new process refuses one it does not know.
VERSION = 1
#: SCRAM-SHA-256's ClientKey and ServerKey are SHA-256 sized.
SCRAM_KEY_LEN = 32


class HandoverError(ValueError):
    """A handed-over client's state is not one this process can take."""


@dataclass
class HandedStatement:
    """One of the client's named prepared statements: its name, and what defines it: a
    Parse's body after the name (query, parameter types), or for SQL PREPARE, what follows
    the name ((types) AS query)."""

    name: bytes
    definition: bytes
    sql: bool = False


@dataclass
class HandedClient:
    """An idle client's state: who it is, what it was told, what its session holds."""

    user: str
    database: str
    #: BackendKeyData the client was given (its CancelRequests name it).
    cancel_key: tuple[int, int]
    #: Tracked parameters as the client last heard them (ParameterStatus).
    params: dict[str, str]
    #: Wall clock of its connect; seconds since then (monotonic clocks are per process).
    connect_time: float = 0.0
    age: float = 0.0
    #: Session state (track_session_state): the settings as the SQL that replays them, the
    #: settings it started with (options), and whether a RESET removed some of those.
    settings: dict[str, str] = field(default_factory=dict)
    startup_settings: dict[str, str] = field(default_factory=dict)
    restore: bool = False
    #: Whether its extended-protocol messages were followed (it used Parse/Bind).
    framer: bool = False
    statements: list[HandedStatement] = field(default_factory=list)
    #: SCRAM passthrough: the (ClientKey, ServerKey) its pool logs in to PostgreSQL with,
    #: from a client's SCRAM login. Secrets: never logged, nor put in an error.
    scram_keys: tuple[bytes, bytes] | None = None


def encode_client(client: HandedClient) -> dict[str, Any]:
    """The message for client (bytes as latin-1 text: JSON has no bytes)."""
    return {
        "v": VERSION,
        "user": client.user,
        "database": client.database,
        "cancel_key": list(client.cancel_key),
        "params": dict(client.params),
        "connect_time": client.connect_time,
        "age": client.age,
        "settings": dict(client.settings),
        "startup_settings": dict(client.startup_settings),
        "restore": client.restore,
        "framer": client.framer,
        "statements": [
            [s.name.decode("latin-1"), s.definition.decode("latin-1"), s.sql]
            for s in client.statements
        ],
        "scram_keys": None if client.scram_keys is None else [k.hex() for k in client.scram_keys],
    }


def decode_client(message: dict[str, Any]) -> HandedClient:
    """The client a message describes (HandoverError if any field is not as encode_client
    makes it)."""
    if message.get("v") != VERSION:
        raise HandoverError(f"handover format {message.get('v')!r}, not {VERSION}")
    key = message.get("cancel_key")
    if not (isinstance(key, list) and len(key) == 2 and all(_is_int(k) for k in key)):
        raise HandoverError(f"cancel_key {key!r}")
    statements = []
    for entry in _typed(message, "statements", list):
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and isinstance(entry[1], str)
            and isinstance(entry[2], bool)
        ):
            raise HandoverError(f"statement {entry!r}")
        try:
            name, definition = entry[0].encode("latin-1"), entry[1].encode("latin-1")
        except UnicodeEncodeError:
            raise HandoverError(f"statement {entry!r}") from None
        statements.append(HandedStatement(name, definition, entry[2]))
    return HandedClient(
        user=_typed(message, "user", str),
        database=_typed(message, "database", str),
        cancel_key=(key[0], key[1]),
        params=_strings(message, "params"),
        connect_time=float(_typed(message, "connect_time", (int, float))),
        age=float(_typed(message, "age", (int, float))),
        settings=_strings(message, "settings"),
        startup_settings=_strings(message, "startup_settings"),
        restore=_typed(message, "restore", bool),
        framer=_typed(message, "framer", bool),
        statements=statements,
        scram_keys=_scram_keys(message.get("scram_keys")),
    )


def _scram_keys(value: object) -> tuple[bytes, bytes] | None:
    """The SCRAM keys of a message (absent from an older pgtarn's: None); the error never
    shows them."""
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(k, str) for k in value):
        try:
            keys = bytes.fromhex(value[0]), bytes.fromhex(value[1])
        except ValueError:
            pass
        else:
            if all(len(key) == SCRAM_KEY_LEN for key in keys):
                return keys
    raise HandoverError("scram_keys are not two SHA-256 keys")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(message: dict[str, Any], name: str, kind: Any) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise HandoverError(f"{name} {value!r}")
    return value


def _strings(message: dict[str, Any], name: str) -> dict[str, str]:
    value = _typed(message, name, dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HandoverError(f"{name} {value!r}")
    return dict(value)
