"""What says a shared statement went stale: PostgreSQL's errors, what a Describe told a
client, and whether a batch reads a new description."""

from __future__ import annotations

from typing import Final

from ..proto.msgtypes import BIND, DESCRIBE, QUERY, ROW_DESCRIPTION, SYNC
from .framer import Part

#: The error PostgreSQL gives when a prepared statement's result type changed (ALTER TABLE).
RESULT_TYPE_CHANGED: Final = b"cached plan must not change result type"
#: Errors that mean a statement was prepared against a schema that changed since (SQLSTATE
#: field and a part of the message): its result type changed, a type it names was dropped,
#: a column it writes changed type.
STALE_ERRORS: Final = (
    (b"C0A000\x00", RESULT_TYPE_CHANGED),
    (b"CXX000\x00", b"cache lookup failed for type"),
    (b"C42804\x00", b"but expression is of type"),
)


def description_digest(parameters: bytes, msg_type: int, body: bytes) -> bytes:
    """What a Describe of a statement tells its client, for comparing: the ParameterDescription
    and the RowDescription's names and types (not the table OID and column number, which a
    table made again changes without changing what the client decodes), or NoData."""
    if msg_type != ROW_DESCRIPTION:
        return parameters + b"|n"
    out = bytearray(parameters)
    out += b"|"
    count = int.from_bytes(body[:2], "big")
    pos = 2
    for _ in range(count):
        end = body.find(b"\x00", pos)
        if end < 0 or end + 19 > len(body):  # not a RowDescription PostgreSQL would send
            return parameters + b"|" + body
        out += body[pos : end + 1]  # the name and its NUL
        out += body[end + 7 : end + 17]  # type OID, length, modifier
        pos = end + 19
    return bytes(out)


def means_stale(body: bytes) -> bool:
    """Whether an ErrorResponse's body says its statement was prepared against an older
    schema (STALE_ERRORS)."""
    return any(code in body and text in body for code, text in STALE_ERRORS)


def reads_description(parts: list[Part], index: int) -> bool:
    """Whether the client reads a description of what parts[index] (a Bind, or a Query)
    returns before its batch ends: a Query brings its RowDescription, and a Describe of the
    statement or portal does (libpq's PQsendQueryPrepared sends one). A client that binds
    without one decodes rows with what it was told before, so a statement prepared afresh
    under it must not be run in its place."""
    part = parts[index]
    if isinstance(part, tuple) and part[0] == QUERY:
        return True
    for j in range(index + 1, len(parts)):
        part = parts[j]
        if isinstance(part, int):
            return False
        if isinstance(part, tuple):
            if part[0] == DESCRIBE:
                return True
            if part[0] in (SYNC, QUERY, BIND):
                return False
    return False
