"""Prepared statements by name: the cache shared by all clients, one client's names, counts."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from ..proto.build import message, quote_literal

#: A query that makes a server forget its prepared statements.
FORGETS_ALL = re.compile(rb"(?i)\b(?:discard\s+all|deallocate\s+(?:prepare\s+)?all)\b")


def forgets_all(text: bytes, status: bytes) -> bool:
    """Whether text (a query's, or a prepared statement's being run), run by a server whose
    transaction status is status, drops every prepared statement: DISCARD ALL fails inside a
    transaction block, DEALLOCATE ALL in a failed one, and then they drop none."""
    match = FORGETS_ALL.search(text)
    if match is None:
        return False
    return status == b"I" or (status == b"T" and match.group(0)[:2].lower() != b"di")


@dataclass(eq=False)
class Statement:
    """One distinct prepared statement, as every server knows it."""

    name: bytes
    #: The whole Parse message under the server-side name; for a statement defined with SQL
    #: PREPARE, the Query message that prepares it.
    parse: bytes
    clients: int = 0  # how many client names refer to it
    sql: bool = False  # defined by SQL PREPARE: one client's, never shared
    #: Its text holds DISCARD ALL or DEALLOCATE ALL: running it may drop every statement.
    forgets: bool = False
    #: A client asked for its description (Describe of the statement): clients may have
    #: cached its parameter and result types, so it is never prepared afresh under them.
    described: bool = False
    #: The cache's generation when it was made (schema changes and renewals count up).
    generation: int = 0
    #: How many times it was given a new server-side name to be prepared afresh.
    renewals: int = 0
    #: What the first client to describe it was told (stale.description_digest), and the
    #: ParameterDescription's body: a server that prepares it afresh is checked against them.
    told: bytes | None = None
    told_parameters: bytes = b""
    #: Its text was never kept (a named Parse or SQL PREPARE longer than
    #: client_message_buffer, passed on in pieces): one client's, on the one server that
    #: prepared it, its client pinned there; its parse only raises an error, should another
    #: server ever need it. A SQL PREPARE's is named as its client names it.
    held: bool = False

    def typed_parse(self) -> bytes:
        """Its Parse with the parameter types its clients were told, where they were: those
        that PostgreSQL fixed when it first prepared the statement, as a direct connection's
        backend keeps them."""
        if self.told is None or self.sql:
            return self.parse
        body = self.parse[5:]
        query_end = body.index(b"\x00", body.index(b"\x00") + 1) + 1
        return message(b"P", body[:query_end] + self.told_parameters)

    @property
    def query(self) -> str:
        """The statement's text (for SHOW PREPARED_STATEMENTS)."""
        body = self.parse[5:]
        if self.sql:  # PREPARE name (types) AS query
            return body.rstrip(b"\x00").decode("utf-8", "replace")
        start = body.index(b"\x00") + 1
        return body[start : body.index(b"\x00", start)].decode("utf-8", "replace")

    @property
    def parameter_count(self) -> int:
        """How many parameter types its Parse declared (0 for SQL PREPARE)."""
        if self.sql:
            return 0
        body = self.parse[5:]
        end = body.index(b"\x00", body.index(b"\x00") + 1) + 1
        return int.from_bytes(body[end : end + 2], "big")


class StatementCache:
    """query text + parameter types -> Statement, shared by all clients of the pooler.

    A schema change (DDL seen going to a server, or an admin RENEW) starts a new generation:
    a Parse after it gets a statement of its own, prepared afresh on every server, and the
    statements clients name from before are renamed so that every server prepares them
    afresh too, except those a client described (its driver may have cached their types:
    they stay as PostgreSQL prepared them, and fail as they would on a direct connection).
    """

    def __init__(self) -> None:
        self._by_key: dict[bytes, Statement] = {}
        #: Every statement some client name refers to, by identity (old generations too).
        self._live: set[Statement] = set()
        self._ids = itertools.count(1)
        self.generation = 0
        #: Statements given a new server-side name (schema changes, stale plans): a counter.
        self.renewals = 0

    def __len__(self) -> int:
        return len(self._live)

    def statements(self) -> list[Statement]:
        """The shared statements clients name now (those of earlier generations too)."""
        return list(self._live)

    def intern(self, parse_tail: bytes) -> Statement:
        """The statement for a Parse body after its name (query, types); counted once more."""
        stmt = self._by_key.get(parse_tail)
        if stmt is None:
            name = b"pgtarn_%d" % next(self._ids)
            query = parse_tail[: parse_tail.find(b"\x00")]
            stmt = Statement(
                name,
                message(b"P", name + b"\x00" + parse_tail),
                forgets=FORGETS_ALL.search(query) is not None,
                generation=self.generation,
            )
            self._by_key[parse_tail] = stmt
            self._live.add(stmt)
        stmt.clients += 1
        return stmt

    def release(self, stmt: Statement) -> None:
        """A client name no longer refers to stmt; forget it when no client does."""
        if stmt.sql:
            return
        stmt.clients -= 1
        if stmt.clients <= 0:
            key = _key(stmt)
            if self._by_key.get(key) is stmt:
                del self._by_key[key]
            self._live.discard(stmt)

    def schema_changed(self) -> None:
        """DDL went to a server (or an admin asked): every statement prepared before now is
        prepared afresh before its next use, but for those a client described, whose names
        keep their servers' statements (what a backend of a direct connection does); every
        Parse from now on gets a statement of the new generation."""
        self.generation += 1
        self._by_key.clear()
        for stmt in self._live:
            if not stmt.described:
                self._rename(stmt)

    def detach(self, stmt: Statement) -> None:
        """A statement failed in a way that may mean it is stale: the next Parse of its text,
        by any client, gets a statement prepared afresh (the drivers' own recovery)."""
        if stmt.sql:
            return
        key = _key(stmt)
        if self._by_key.get(key) is stmt:
            del self._by_key[key]

    def sql_statement(self, definition: bytes) -> Statement:
        """A new statement for SQL PREPARE; definition is what follows its name
        ((types) AS query)."""
        name = b"pgtarn_s%d" % next(self._ids)
        return Statement(name, message(b"Q", b"PREPARE " + name + definition + b"\x00"), 1, True)

    def held_statement(self, client_name: bytes) -> Statement:
        """A new statement for a named Parse passed on in pieces (``Statement.held``), one
        client's (never shared: its text is not known), named by client_name."""
        name = b"pgtarn_h%d" % next(self._ids)
        parse = message(b"P", name + b"\x00" + _held_raise(client_name) + b"\x00\x00\x00")
        return Statement(name, parse, 1, held=True)

    def held_sql_statement(self, client_name: bytes) -> Statement:
        """A new statement for a SQL PREPARE passed on in pieces (``Statement.held``), one
        client's: the server has it under client_name itself, so that the client's later
        uses of that name in the same long query, which pgtarn does not read, find it too
        (its client is pinned to that server, closed when the client leaves)."""
        parse = message(b"Q", _held_raise(client_name) + b"\x00")
        return Statement(client_name, parse, 1, sql=True, held=True)

    def renew(self, stmt: Statement) -> None:
        """The statement's plan went stale on some server: give it a new server-side name, so
        every server prepares it afresh on next use (the old ones age out of their LRU)."""
        if stmt.held:  # (its text is not known: it fails as on a direct connection)
            return
        self.detach(stmt)
        self._rename(stmt)

    def _rename(self, stmt: Statement) -> None:
        self.renewals += 1
        stmt.renewals += 1
        stmt.generation = self.generation
        if stmt.sql:
            definition = stmt.parse[5 + len(b"PREPARE ") + len(stmt.name) : -1]
            stmt.name = b"pgtarn_s%d" % next(self._ids)
            stmt.parse = message(b"Q", b"PREPARE " + stmt.name + definition + b"\x00")
            return
        key = _key(stmt)
        stmt.name = b"pgtarn_%d" % next(self._ids)
        stmt.parse = message(b"P", stmt.name + b"\x00" + key)

    def retain(self, stmt: Statement) -> None:
        """A client name refers to stmt again (a redefinition was undone)."""
        if stmt.sql:
            return
        stmt.clients += 1
        if stmt.held:  # (never shared)
            return
        self._live.add(stmt)
        if stmt.generation == self.generation:
            self._by_key.setdefault(_key(stmt), stmt)


def _held_raise(client_name: bytes) -> bytes:
    """The text of a held statement's stand-in, should a server lack it: it raises 26000."""
    what = client_name.decode("utf-8", "replace").replace("$pgtarn$", "")
    text = quote_literal(
        f'prepared statement "{what}" was longer than client_message_buffer:'
        " only the server that prepared it has it"
    ).encode()
    sql = b"DO $pgtarn$BEGIN RAISE EXCEPTION USING ERRCODE = '26000', MESSAGE = "
    return sql + text + b"; END$pgtarn$"


def _key(stmt: Statement) -> bytes:
    return stmt.parse[5 + len(stmt.name) + 1 :]


#: The names of a client that has named no statement (shared, never written: name() gives a
#: client a dict of its own at its first): most pooled clients name none.
_NO_NAMES: dict[bytes, Statement] = {}


@dataclass(init=False, slots=True)
class ClientStatements:
    """A client's statement names -> the shared statements.

    An __init__ of its own, not the generated one: compiled, it is a C constructor (one per
    client login)."""

    cache: StatementCache
    names: dict[bytes, Statement]

    def __init__(self, cache: StatementCache) -> None:
        self.cache = cache
        self.names = _NO_NAMES

    def name(self, name: bytes, stmt: Statement) -> None:
        """Let name mean stmt (the caller keeps the cache's counts)."""
        names = self.names
        if names is _NO_NAMES:
            self.names = names = {}
        names[name] = stmt

    def define(self, name: bytes, parse_tail: bytes) -> tuple[Statement, Statement | None]:
        """Name a statement; returns it and what the name meant before (None: nothing).

        A client that prepares a text it already has under another name is recovering from
        something its driver saw (a type it cannot find, an error): a drivers' pattern that
        must reach a statement parsed again, so the text gets one of its own."""
        cache = self.cache
        stmt = cache.intern(parse_tail)
        if stmt.clients > 1 and any(
            other is stmt and key != name for key, other in self.names.items()
        ):
            cache.release(stmt)
            cache.detach(stmt)
            stmt = cache.intern(parse_tail)
        old = self.names.get(name)
        self.name(name, stmt)
        if old is not None:
            self.cache.release(old)
        return stmt, old

    def undefine(self, name: bytes, stmt: Statement | None, previous: Statement | None) -> None:
        """A Parse (stmt) or Close (None) that did not happen: the name means what it did."""
        if self.names.get(name) is not stmt:
            return
        if stmt is not None:
            self.cache.release(stmt)
        if previous is None:
            self.names.pop(name, None)
        else:
            self.name(name, previous)
            self.cache.retain(previous)

    def forget(self, name: bytes, stmt: Statement | None = None) -> None:
        """Drop a name (only if it still means stmt, when given)."""
        old = self.names.get(name)
        if old is not None and (stmt is None or old is stmt):
            del self.names[name]
            self.cache.release(old)

    def clear(self) -> None:
        for stmt in self.names.values():
            self.cache.release(stmt)
        self.names = _NO_NAMES


@dataclass(slots=True)
class PreparedCounters:
    """Prepared-statement counts of one pool, for its statistics."""

    client_parses: int = 0  # statements clients prepared (Parse of a name, SQL PREPARE)
    server_parses: int = 0  # statements pgtarn prepared on servers
    binds: int = 0  # executions of prepared statements (Bind of a name, SQL EXECUTE)
