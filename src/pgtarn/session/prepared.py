"""Named prepared statements across pooled servers: rewrite client messages, filter replies.

Theory of operation. A client's named statement is known by its query text and parameter
types; each distinct one gets a single server-side name (``pgtarn_<n>``) shared by every
client (``StatementCache``). ``ClientStatements`` maps the client's names to those
statements; ``ServerStatements`` is what one server has prepared, least recently used first,
at most ``capacity`` of them.

``ServerStatements.rewrite`` turns a batch of complete client messages into what that server
must get: Parse/Bind/Describe/Close of a named statement use the server-side name; a Parse of
a statement the server already has becomes a harmless Close of a name nobody uses, whose
CloseComplete is turned back into the ParseComplete the client expects; a Bind or Describe of
a statement the server lacks gets a Parse in front of it, whose ParseComplete the client never
sees; a client Close forgets the client's name only (other clients may still use the
statement). Every ParseComplete and CloseComplete to come is queued in order, with sync
markers for Sync and Query; ``ServerStatements.reply`` consumes them as the server answers.
After an error PostgreSQL skips to the next Sync: at ReadyForQuery the entries still queued
before that Sync are the Parses that never happened, so their statements are forgotten on
the server (and, for the client's own Parse, by the client), and no broken name is left.

Stdlib only, no I/O: messages in, bytes and decisions out.
"""

from __future__ import annotations

import itertools
import re
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from struct import Struct

from . import sqlnames
from .framer import ClientFramer, Part

_I = Struct("!I")
PARSE_COMPLETE = b"1\x00\x00\x00\x04"
#: A statement name no client or server uses: closing it is a successful no-op.
NOOP_NAME = b"pgtarn_noop"
NOOP_CLOSE = b"C" + _I.pack(4 + 1 + len(NOOP_NAME) + 1) + b"S" + NOOP_NAME + b"\x00"

# What a queued entry expects from the server, and what to do with it.
_PARSE = 1  # a ParseComplete
_CLOSE = 2  # a CloseComplete
_SYNC = 3  # a ReadyForQuery (after Sync or Query)
_BIND = 4  # a BindComplete
_HIDDEN = 5  # marks where a batch of pgtarn's own begins

# What a _SYNC entry undoes when its batch failed.
_DEFINED = 3  # the client's SQL PREPARE
_DEALLOCATED = 4  # the client's SQL DEALLOCATE
_PRELUDE = 5  # pgtarn's own PREPARE ahead of a client's EXECUTE

#: The error PostgreSQL gives when a prepared statement's result type changed (ALTER TABLE).
RESULT_TYPE_CHANGED = b"cached plan must not change result type"

FORWARD = 0
DROP = 1
AS_PARSE_COMPLETE = 2

ERROR_FORWARD = 0
ERROR_HIDE = 1
ERROR_REPLACE = 2

READY_FORWARD = 0
READY_RETRY = 1
READY_UNHIDE = 2

SYNC = b"S\x00\x00\x00\x04"


def _message(msg_type: bytes, body: bytes) -> bytes:
    return msg_type + _I.pack(len(body) + 4) + body


def _cstring(body: bytes, pos: int) -> tuple[bytes, int]:
    end = body.index(b"\x00", pos)
    return body[pos:end], end + 1


@dataclass(eq=False)
class Statement:
    """One distinct prepared statement, as every server knows it."""

    name: bytes
    #: The whole Parse message under the server-side name; for a statement defined with SQL
    #: PREPARE, the Query message that prepares it.
    parse: bytes
    clients: int = 0  # how many client names refer to it
    sql: bool = False  # defined by SQL PREPARE: one client's, never shared

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
    """query text + parameter types -> Statement, shared by all clients of the pooler."""

    def __init__(self) -> None:
        self._by_key: dict[bytes, Statement] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_key)

    def statements(self) -> list[Statement]:
        """The shared statements clients name now."""
        return list(self._by_key.values())

    def intern(self, parse_tail: bytes) -> Statement:
        """The statement for a Parse body after its name (query, types); counted once more."""
        stmt = self._by_key.get(parse_tail)
        if stmt is None:
            name = b"pgtarn_%d" % next(self._ids)
            stmt = Statement(name, _message(b"P", name + b"\x00" + parse_tail))
            self._by_key[parse_tail] = stmt
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

    def sql_statement(self, definition: bytes) -> Statement:
        """A new statement for SQL PREPARE; definition is what follows its name
        ((types) AS query)."""
        name = b"pgtarn_s%d" % next(self._ids)
        return Statement(name, _message(b"Q", b"PREPARE " + name + definition + b"\x00"),
                         1, True)

    def renew(self, stmt: Statement) -> None:
        """The statement's plan went stale on some server: give it a new server-side name, so
        every server prepares it afresh on next use (the old ones age out of their LRU)."""
        if stmt.sql:
            definition = stmt.parse[5 + len(b"PREPARE ") + len(stmt.name) : -1]
            stmt.name = b"pgtarn_s%d" % next(self._ids)
            stmt.parse = _message(b"Q", b"PREPARE " + stmt.name + definition + b"\x00")
            return
        key = _key(stmt)
        stmt.name = b"pgtarn_%d" % next(self._ids)
        stmt.parse = _message(b"P", stmt.name + b"\x00" + key)

    def retain(self, stmt: Statement) -> None:
        """A client name refers to stmt again (a redefinition was undone)."""
        if stmt.sql:
            return
        stmt.clients += 1
        self._by_key.setdefault(_key(stmt), stmt)


def _key(stmt: Statement) -> bytes:
    return stmt.parse[5 + len(stmt.name) + 1 :]


@dataclass
class ClientStatements:
    """A client's statement names -> the shared statements."""

    cache: StatementCache
    names: dict[bytes, Statement] = field(default_factory=dict)

    def define(self, name: bytes, parse_tail: bytes) -> tuple[Statement, Statement | None]:
        """Name a statement; returns it and what the name meant before (None: nothing)."""
        stmt = self.cache.intern(parse_tail)
        old = self.names.get(name)
        self.names[name] = stmt
        if old is not None:
            self.cache.release(old)
        return stmt, old

    def undefine(self, name: bytes, stmt: Statement | None, previous: Statement | None
                 ) -> None:
        """A Parse (stmt) or Close (None) that did not happen: the name means what it did."""
        if self.names.get(name) is not stmt:
            return
        if stmt is not None:
            self.cache.release(stmt)
        if previous is None:
            self.names.pop(name, None)
        else:
            self.names[name] = previous
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
        self.names.clear()


@dataclass(slots=True)
class PreparedCounters:
    """Prepared-statement counts of one pool, for its statistics."""

    client_parses: int = 0  # statements clients prepared (Parse of a name, SQL PREPARE)
    server_parses: int = 0  # statements pgtarn prepared on servers
    binds: int = 0  # executions of prepared statements (Bind of a name, SQL EXECUTE)


@dataclass(slots=True)
class _Entry:
    kind: int
    action: int = FORWARD
    stmt: Statement | None = None
    client: ClientStatements | None = None
    client_name: bytes = b""
    previous: Statement | None = None
    #: The client's parts from this Bind or Query to its Sync, to send again after a stale
    #: plan (only when nothing of the batch ran before it); owner is that client.
    batch: list[Part] | None = None
    at: int = 0
    owner: ClientStatements | None = None
    #: The statements a simple query EXECUTEs (renewed if their plan went stale).
    executes: tuple[Statement, ...] = ()


# Entries with nothing to undo are shared (never changed once made).
_SYNC_ENTRY = _Entry(_SYNC)
_BIND_ENTRY = _Entry(_BIND)
_PARSE_ENTRY = _Entry(_PARSE)
_CLOSE_ENTRY = _Entry(_CLOSE)
#: A batch of pgtarn's own starts here: every reply up to its ReadyForQuery is swallowed.
HIDDEN_ENTRY = _Entry(_HIDDEN)


class ServerStatements:
    """The statements one server has prepared, and the replies it still owes about them."""

    def __init__(self, capacity: int, counters: PreparedCounters | None = None) -> None:
        self.capacity = capacity
        self.prepared: OrderedDict[bytes, Statement] = OrderedDict()
        self.expected: deque[_Entry] = deque()
        self.counters = counters if counters is not None else PreparedCounters()
        #: Since the last Sync or Query only Parse/Describe/Close went (nothing ran yet).
        self.fresh = True
        #: Nothing at all went since the last Sync or Query.
        self.clean = True
        #: An ErrorResponse came since the last ReadyForQuery (and the last one's body).
        self.failed = False
        self.last_error = b""
        self._retry: tuple[ClientStatements, list[Part], int] | None = None
        #: READY_RETRY: what to send the server; ERROR_HIDE / READY_UNHIDE: the error held back;
        #: ERROR_REPLACE: the error to send instead.
        self.resend = b""
        self.withheld = b""
        self.replacement = b""
        #: A statement pgtarn failed to prepare ahead of a client's query, and why.
        self._failed_prelude: tuple[bytes, bytes] | None = None
        #: SQL-level statements an unnamed Parse EXECUTEs, renewed if their plan went stale.
        self.stale_candidates: tuple[Statement, ...] = ()

    @property
    def idle(self) -> bool:
        """No reply about statements is owed (the server can change hands)."""
        return not self.expected

    # --- client -> server ---------------------------------------------------------------------

    def rewrite(self, client: ClientStatements, messages: Iterable[tuple[int, bytes]]) -> bytes:
        """What to send this server for complete client messages (type, body)."""
        return self._encode(client, list(messages), 0, None, True)

    def send(self, client: ClientStatements, parts: list[Part], chunk: bytes | None = None
             ) -> bytes:
        """What to send this server for parts from a ClientFramer.

        chunk: the received bytes, when the parts are exactly those (ClientFramer.whole);
        with nothing to rewrite they are sent as they are.
        """
        if chunk is not None and ClientFramer.plain(parts):
            for part in parts:
                if isinstance(part, int):
                    self.expected.append(_SYNC_ENTRY)
            self.fresh = self.clean = isinstance(parts[-1], int)
            return chunk
        return self._encode(client, parts, 0, None, True)

    def _encode(self, client: ClientStatements, parts: list[Part], begin: int, end: int | None,
                may_retry: bool) -> bytes:
        out = bytearray()
        for index in range(begin, len(parts) if end is None else end):
            part = parts[index]
            if isinstance(part, int):
                self._synced(_SYNC_ENTRY)
            elif isinstance(part, bytes):
                out += part
                self.fresh = self.clean = False
            else:
                msg_type, body = part
                if msg_type == 0x50:  # Parse
                    self._parse(client, body, out)
                elif msg_type == 0x42:  # Bind
                    self._bind(client, body, out, parts, index, may_retry)
                elif msg_type in (0x44, 0x43):  # Describe, Close
                    self._describe_or_close(client, msg_type, body, out)
                elif msg_type == 0x51:  # Query
                    self._query(client, body, out, parts, index, may_retry)
                else:
                    out += _message(bytes((msg_type,)), body)
                    if msg_type == 0x53:  # Sync
                        self._synced(_SYNC_ENTRY)
                    else:
                        self.fresh = self.clean = False
        return bytes(out)

    def _synced(self, entry: _Entry) -> None:
        self.expected.append(entry)
        self.fresh = self.clean = True

    def _parse(self, client: ClientStatements, body: bytes, out: bytearray) -> None:
        clean = self.clean
        self.clean = False
        name, pos = _cstring(body, 0)
        if sqlnames.may_name_statements(body, pos):
            body = self._sql_in_parse(client, name, body, pos, clean, out)
        if not name:
            out += _message(b"P", body)
            self.expected.append(_PARSE_ENTRY)
            return
        self.counters.client_parses += 1
        stmt, previous = client.define(name, body[pos:])
        if self._has(stmt):
            out += NOOP_CLOSE
            self.expected.append(
                _Entry(_CLOSE, AS_PARSE_COMPLETE, stmt, client, name, previous))
        else:
            self._prepare(stmt, out, _Entry(_PARSE, FORWARD, stmt, client, name, previous))

    def _sql_in_parse(self, client: ClientStatements, name: bytes, body: bytes, pos: int,
                      clean: bool, out: bytearray) -> bytes:
        """A Parse body whose query uses SQL-level statement names.

        An unnamed statement that EXECUTEs the client's statements gets their server-side
        names (prepared first, when it begins a batch). What cannot be run safely becomes a
        query that raises the error saying so: a PREPARE or DEALLOCATE (it would be made or
        dropped on one server only), or a named statement using the client's names (it would
        depend on statements other servers lack).
        """
        query, end = _cstring(body, pos)
        try:
            found = sqlnames.scan(query)
        except sqlnames.Unterminated:
            return body
        renames: list[tuple[int, int, bytes]] = []
        needed: list[Statement] = []
        for use in found.uses:
            stmt = client.names.get(use.name)
            if use.kind != sqlnames.PREPARE and stmt is None:
                continue  # not the client's: PostgreSQL's own error names it
            if use.kind != sqlnames.EXECUTE or name:
                word = "PREPARE" if use.kind == sqlnames.PREPARE else \
                    "DEALLOCATE" if use.kind == sqlnames.DEALLOCATE else "EXECUTE"
                return _refused_parse(body, pos, end, word + (
                    " of a SQL-level prepared statement" if use.kind != sqlnames.EXECUTE
                    else " of a SQL-level prepared statement in a named statement") +
                    " through the extended query protocol is not supported in transaction"
                    " pooling mode; send it as a simple query")
            assert stmt is not None
            if stmt.name not in self.prepared and not clean:
                return _refused_parse(body, pos, end, "EXECUTE of a SQL-level prepared"
                                      " statement in the middle of an extended-protocol batch"
                                      " is not supported in transaction pooling mode")
            needed.append(stmt)
            renames.append((use.start, use.end, stmt.name))
        for stmt in needed:
            if not self._has(stmt):
                self._prelude(stmt, out)
            self.counters.binds += 1
        if not renames:
            return body
        self.stale_candidates = tuple(needed)
        return body[:pos] + sqlnames.rename(query, renames) + b"\x00" + body[end:]

    def _bind(self, client: ClientStatements, body: bytes, out: bytearray, parts: list[Part],
              index: int, may_retry: bool) -> None:
        _portal, pos = _cstring(body, 0)
        name, end = _cstring(body, pos)
        stmt = client.names.get(name) if name else None
        if stmt is None:
            out += _message(b"B", body)
            self.expected.append(_BIND_ENTRY)
        else:
            self.counters.binds += 1
            self._ensure(stmt, out)
            out += _message(b"B", body[:pos] + stmt.name + body[end - 1 :])
            # Nothing of the batch ran before this Bind: it may be sent again after a stale
            # plan (whether a Sync ends it within these parts is seen only then).
            self.expected.append(
                _Entry(_BIND, FORWARD, stmt, None, b"", None, parts, index, client)
                if may_retry and self.fresh else _Entry(_BIND, FORWARD, stmt))
        self.fresh = self.clean = False

    def _describe_or_close(self, client: ClientStatements, msg_type: int, body: bytes,
                           out: bytearray) -> None:
        self.clean = False
        kind = body[:1]
        name, _end = _cstring(body, 1)
        if kind != b"S" or not name:
            out += _message(bytes((msg_type,)), body)
            if msg_type == 0x43:
                self.expected.append(_CLOSE_ENTRY)
        elif msg_type == 0x44:
            stmt = client.names.get(name)
            if stmt is None:
                out += _message(b"D", body)
            else:
                self._ensure(stmt, out)
                out += _message(b"D", b"S" + stmt.name + b"\x00")
                # A stale plan fails a Describe too: it has no reply entry, so a Bind after
                # it must not be retried from, and it is the statement to renew.
                self.fresh = False
                self.stale_candidates = (stmt,)
        else:
            # Other clients may use the statement: forget the name, keep the server's.
            previous = client.names.get(name)
            client.forget(name)
            out += NOOP_CLOSE
            self.expected.append(_Entry(_CLOSE, FORWARD, None, client, name, previous))

    def _query(self, client: ClientStatements, body: bytes, out: bytearray, parts: list[Part],
               index: int, may_retry: bool) -> None:
        """A simple Query: SQL-level PREPARE / EXECUTE / DEALLOCATE names are rewritten."""
        text = body[:-1] if body.endswith(b"\x00") else body
        clean = self.clean  # nothing of the transaction ran since the last Sync
        found = None
        if sqlnames.may_name_statements(text):
            try:
                found = sqlnames.scan(text)
            except sqlnames.Unterminated:
                found = None  # PostgreSQL gives the syntax error
        if found is None or not found.uses:
            self._pass_query(body, out)
            return
        refusal = self._refusal(client, found)
        if refusal is not None:
            out += refusal
            self._synced(_SYNC_ENTRY)
            return
        renames: list[tuple[int, int, bytes]] = []
        executes: list[Statement] = []
        entry = None
        for use in found.uses:
            stmt = client.names.get(use.name)
            if use.kind == sqlnames.PREPARE:
                self.counters.client_parses += 1
                stmt = client.cache.sql_statement(text[use.end : use.statement_end])
                client.names[use.name] = stmt
                self._evict(out)
                self.prepared[stmt.name] = stmt
                self.counters.server_parses += 1
                entry = _Entry(_SYNC, _DEFINED, stmt, client, use.name)
            elif stmt is None:
                continue  # not a name of this client: PostgreSQL's own error names it
            else:
                had = self._has(stmt)
                if not had:
                    self._prelude(stmt, out)
                if use.kind == sqlnames.DEALLOCATE:
                    client.forget(use.name)
                    self.prepared.pop(stmt.name, None)
                    entry = _Entry(_SYNC, _DEALLOCATED, stmt, client, use.name,
                                   stmt if had else None)
                else:
                    self.counters.binds += 1
                    executes.append(stmt)
            renames.append((use.start, use.end, stmt.name))
        if not renames:
            self._pass_query(body, out)
            return
        out += _message(b"Q", sqlnames.rename(text, renames) + b"\x00")
        if entry is None:
            entry = _Entry(_SYNC, FORWARD, executes=tuple(executes))
            if may_retry and clean and found.statements == 1:
                entry.batch, entry.at, entry.owner = parts, index, client
        self._synced(entry)

    def _pass_query(self, body: bytes, out: bytearray) -> None:
        """A simple Query sent as the client wrote it."""
        out += _message(b"Q", body)
        self._synced(_SYNC_ENTRY)

    def _refusal(self, client: ClientStatements, found: sqlnames.Scan) -> bytes | None:
        """A query that raises the error for a form pgtarn cannot run safely, or None."""
        for use in found.uses:
            known = client.names.get(use.name)
            if use.kind != sqlnames.EXECUTE and found.statements > 1:
                word = "PREPARE" if use.kind == sqlnames.PREPARE else "DEALLOCATE"
                return raise_error(
                    "0A000", f"{word} must be sent as a query of its own in transaction"
                    " pooling mode")
            if use.kind == sqlnames.PREPARE and known is not None:
                name = use.name.decode("utf-8", "replace")
                return raise_error("42P05", f'prepared statement "{name}" already exists')
            if (use.kind != sqlnames.PREPARE and known is not None and not self.clean
                    and known.name not in self.prepared):
                return raise_error(
                    "0A000", "a prepared statement cannot be run by a simple query in the"
                    " middle of an extended-protocol batch in transaction pooling mode;"
                    " send Sync first")
        return None

    def _prelude(self, stmt: Statement, out: bytearray) -> None:
        """Prepare stmt ahead of a simple query, in a batch of pgtarn's own (after the last
        Sync, so nothing can skip it) whose replies the client never sees."""
        self.expected.append(HIDDEN_ENTRY)
        self._evict(out)
        out += stmt.parse
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        if not stmt.sql:
            out += SYNC
            self.expected.append(_Entry(_PARSE, DROP, stmt))
        self.expected.append(_Entry(_SYNC, _PRELUDE, stmt))

    def _ensure(self, stmt: Statement, out: bytearray) -> None:
        """Prepare stmt on this server first if it lacks it; the client never sees that."""
        if not self._has(stmt):
            self._prepare(stmt, out, _Entry(_PARSE, DROP, stmt))

    def _has(self, stmt: Statement) -> bool:
        """Whether this server has stmt (then it becomes the most recently used)."""
        if stmt.name not in self.prepared:
            return False
        self.prepared.move_to_end(stmt.name)
        return True

    def _prepare(self, stmt: Statement, out: bytearray, entry: _Entry) -> None:
        """Send stmt's Parse (after evicting the least recently used if full)."""
        self._evict(out)
        out += stmt.parse
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        self.expected.append(entry)

    def _evict(self, out: bytearray) -> None:
        while self.capacity and len(self.prepared) >= self.capacity:
            name, stmt = self.prepared.popitem(last=False)
            out += _message(b"C", b"S" + name + b"\x00")
            self.expected.append(_Entry(_CLOSE, DROP, stmt))

    # --- server -> client -----------------------------------------------------------------------

    def reply(self, msg_type: int) -> int:
        """A ParseComplete, BindComplete or CloseComplete: what to do with it.

        Returns FORWARD, DROP or AS_PARSE_COMPLETE (send a ParseComplete in its place).
        """
        want = _PARSE if msg_type == 0x31 else _BIND if msg_type == 0x32 else _CLOSE
        expected = self.expected
        while expected and expected[0].kind != want and expected[0].kind != _SYNC:
            self._skipped(expected.popleft())  # cannot happen with a well-behaved server
        if not expected or expected[0].kind != want:
            return FORWARD
        return expected.popleft().action

    def error(self, body: bytes, cache: StatementCache) -> int:
        """An ErrorResponse: ERROR_FORWARD, ERROR_HIDE (held back in ``withheld``: the batch
        will be sent again) or ERROR_REPLACE (send ``replacement`` instead).

        A Bind or EXECUTE that failed because the statement's result type changed renews
        that statement, so that the next attempt prepares it again.
        """
        self.failed = True
        self.last_error = body
        expected = self.expected
        if not expected:
            return ERROR_FORWARD
        head = expected[0]
        stale = head.executes or ((head.stmt,) if head.kind == _BIND and head.stmt else
                                  self.stale_candidates)
        if stale and b"C0A000\x00" in body and RESULT_TYPE_CHANGED in body:
            for stmt in stale:
                # The old name stays in this server's LRU (its key), so that it is closed
                # when evicted; the renewed name is prepared afresh on next use.
                cache.renew(stmt)
            if (head.batch is not None and head.owner is not None and self._retry is None
                    and _batch_end(head.batch, head.at) >= 0):
                self._retry = (head.owner, head.batch, head.at)
                self.withheld = body
                return ERROR_HIDE
        failed = self._failed_prelude
        if failed is not None and b"C26000\x00" in body and b'"' + failed[0] + b'"' in body:
            # "prepared statement pgtarn_s7 does not exist": the client gets the real cause.
            self._failed_prelude = None
            self.replacement = failed[1]
            return ERROR_REPLACE
        return ERROR_FORWARD

    def ready(self, status: bytes, client: ClientStatements | None) -> int:
        """A ReadyForQuery: READY_FORWARD, READY_RETRY (swallow it and send ``resend``: the
        batch again, its statement prepared afresh) or READY_UNHIDE (send ``withheld`` first).

        client: the statements of the client linked now (a retry is for that client only).
        """
        expected = self.expected
        if not self.failed and expected and expected[0] is _SYNC_ENTRY:  # the common case
            expected.popleft()
            return READY_FORWARD
        failed = self.failed
        self.failed = False
        sync = self._ready()
        if sync is None or sync.action != _PRELUDE:
            self._failed_prelude = None  # it was for the query that followed the prelude
        if sync is not None and sync.action != FORWARD and failed:
            self._undo(sync)
        retry = self._retry
        if retry is None:
            return READY_FORWARD
        self._retry = None
        owner, parts, at = retry
        if status == b"I" and not expected and self.clean and client is owner:
            self.resend = self._encode(owner, parts, at, _batch_end(parts, at) + 1, False)
            return READY_RETRY
        return READY_UNHIDE

    def take_hidden(self) -> bool:
        """Whether a batch of pgtarn's own is next (call at a ReadyForQuery boundary)."""
        expected = self.expected
        if expected and expected[0] is HIDDEN_ENTRY:
            expected.popleft()
            return True
        return False

    def _ready(self) -> _Entry | None:
        """ReadyForQuery: what was queued before its Sync and did not come never will.
        Returns the entry of that Sync."""
        expected = self.expected
        self.stale_candidates = ()
        skipped = []
        sync = None
        while expected:
            entry = expected.popleft()
            if entry.kind == _SYNC:
                sync = entry
                break
            if entry is not HIDDEN_ENTRY:
                skipped.append(entry)
        for entry in reversed(skipped):  # undone last first, like an undo log
            self._skipped(entry)
        return sync

    def _undo(self, sync: _Entry) -> None:
        """A simple query that defined, dropped or prepared a statement failed."""
        stmt = sync.stmt
        assert stmt is not None
        if sync.action == _PRELUDE and b"C42P05\x00" in self.last_error:
            return  # already there: prepared before, by a query whose outcome was unknown
        if sync.action == _DEALLOCATED:
            assert sync.client is not None
            sync.client.undefine(sync.client_name, None, stmt)
            if sync.previous is not None:  # the server had it and still has it
                self.prepared[stmt.name] = stmt
            return
        if self.prepared.get(stmt.name) is stmt:
            del self.prepared[stmt.name]
        if sync.action == _DEFINED:
            assert sync.client is not None
            sync.client.undefine(sync.client_name, stmt, None)
        else:
            self._failed_prelude = (stmt.name, self.last_error)

    def _skipped(self, entry: _Entry) -> None:
        if entry.client is not None:
            # The client's Parse or Close failed or was skipped after an error: the name
            # means what it meant before.
            entry.client.undefine(entry.client_name, entry.stmt, entry.previous)
        stmt = entry.stmt
        if stmt is None:
            return
        if entry.kind == _PARSE:
            # The server lacks the statement.
            if self.prepared.get(stmt.name) is stmt:
                del self.prepared[stmt.name]
        elif entry.action == DROP:
            # An eviction that did not happen: the server still has the statement.
            self.prepared[stmt.name] = stmt
            self.prepared.move_to_end(stmt.name, last=False)

    def clear(self) -> None:
        """The server forgot every statement (DISCARD ALL, DEALLOCATE ALL)."""
        self.prepared.clear()

    def sync_sent(self) -> None:
        """A Sync or Query went by untouched, or pgtarn sent a Sync itself (a client left
        mid-batch): its ReadyForQuery ends what came before."""
        self._synced(_SYNC_ENTRY)


def _refused_parse(body: bytes, pos: int, end: int, message: str) -> bytes:
    """A Parse body whose query raises message (SQLSTATE 0A000) when executed."""
    return body[:pos] + raise_error("0A000", message)[5:-1] + b"\x00" + body[end:]


def _batch_end(parts: list[Part], index: int) -> int:
    """Where the batch holding parts[index] ends (its Sync or Query), or -1."""
    for j in range(index, len(parts)):
        part = parts[j]
        if isinstance(part, int) or (isinstance(part, tuple) and part[0] in (0x53, 0x51)):
            return j
    return -1


def raise_error(sqlstate: str, message: str) -> bytes:
    """A Query whose error is ours, raised by the server so that it lands in order and a
    transaction block fails as it would have."""
    literal = "'" + message.replace("'", "''").replace("$pgtarn$", "") + "'"
    sql = (f"DO $pgtarn$BEGIN RAISE EXCEPTION USING ERRCODE = '{sqlstate}', "
           f"MESSAGE = {literal}; END$pgtarn$")
    return _message(b"Q", sql.encode() + b"\x00")


#: A simple query that makes a server forget its prepared statements.
FORGETS_ALL = re.compile(rb"(?i)\b(?:discard\s+all|deallocate\s+(?:prepare\s+)?all)\b")
