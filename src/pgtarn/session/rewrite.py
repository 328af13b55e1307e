"""Rewrite a client's statement messages for one server: the client -> server half of
ServerStatements (prepared.py tells how the two halves work together).

Long: StatementRewriter is one state machine over the client's
Parse/Bind/Describe/Close/Execute messages; its branches share the same statement table and are
read as a whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

from ..proto import build
from ..proto.build import message, quote_literal
from ..proto.messages import read_cstring
from ..proto.msgtypes import BIND, CLOSE, DESCRIBE, PARSE, QUERY, SYNC
from . import sqlnames
from .fifo import Fifo
from .framer import Part
from .statements import FORGETS_ALL, ClientStatements, PreparedCounters, Statement, forgets_all

#: A statement name no client or server uses: closing it is a successful no-op.
NOOP_NAME: Final = b"pgtarn_noop"
NOOP_CLOSE: Final = message(b"C", b"S" + NOOP_NAME + b"\x00")

# What a queued entry expects from the server, and what to do with it.
KIND_PARSE: Final = 1  # a ParseComplete
KIND_CLOSE: Final = 2  # a CloseComplete
KIND_SYNC: Final = 3  # a ReadyForQuery (after Sync or Query)
KIND_BIND: Final = 4  # a BindComplete
KIND_HIDDEN: Final = 5  # marks where a batch of pgtarn's own begins
KIND_DESCRIBE: Final = 6  # a client's Describe of a statement: what it is told, recorded
KIND_CHECK: Final = 7  # pgtarn's Describe of a statement prepared afresh, checked

# What a KIND_SYNC entry undoes when its batch failed.
UNDO_DEFINED: Final = 3  # the client's SQL PREPARE
UNDO_DEALLOCATED: Final = 4  # the client's SQL DEALLOCATE
UNDO_PRELUDE: Final = 5  # pgtarn's own PREPARE ahead of a client's EXECUTE
UNDO_CHECK: Final = 6  # pgtarn's Parse and Describe of a statement a client described
UNDO_CEDED: Final = 7  # pgtarn's copy of a client's statement under the client's name

#: The error a client gets for a statement whose result type changed since it was told it.
RESULT_TYPE_CHANGED_ERROR: Final = ("0A000", "cached plan must not change result type")
#: The name of pgtarn's statement that raises an error in place of a client's.
RAISER_NAME: Final = b"pgtarn_raise"
#: How every server-side name pgtarn gives begins: a client naming one it did not define
#: means another client's statement, which it must never reach.
SERVER_PREFIX: Final = b"pgtarn_"


FORWARD: Final = 0
DROP: Final = 1
AS_PARSE_COMPLETE: Final = 2
#: The raiser's Parse that fails with 42P05 in place of a client's Parse of a name in use
#: (the entry's client_name): its error is given the client's name (never completes).
REFUSED_REUSE: Final = 3
#: The raiser's Parse that fails (a syntax error) in place of a client's named Parse longer
#: than client_message_buffer (the entry's client_name): its error becomes 54000.
REFUSED_LONG: Final = 4


class Entry:
    """One reply a server owes about statements, and what to do when it comes (or not).

    (Not a dataclass: compiled, a dataclass's __init__ is the one the dataclasses module
    writes at import, run by the interpreter.)"""

    __slots__ = (
        "action",
        "at",
        "batch",
        "client",
        "client_name",
        "executes",
        "kind",
        "owner",
        "previous",
        "stmt",
    )

    def __init__(self, kind: int, action: int = FORWARD, stmt: Statement | None = None,
                 client: ClientStatements | None = None, client_name: bytes = b"",
                 previous: Statement | None = None, batch: list[Part] | None = None,
                 at: int = 0, owner: ClientStatements | None = None,
                 executes: tuple[Statement, ...] = ()) -> None:  # fmt: skip
        self.kind = kind
        self.action = action
        self.stmt = stmt
        self.client = client
        self.client_name = client_name
        self.previous = previous
        #: The client's parts from this Bind or Query to its Sync, to send again after a
        #: stale plan (only when nothing of the batch ran before it); owner is that client.
        self.batch = batch
        self.at = at
        self.owner = owner
        #: The statements a simple query EXECUTEs (renewed if their plan went stale).
        self.executes = executes

    def __repr__(self) -> str:
        return f"Entry(kind={self.kind}, action={self.action}, stmt={self.stmt!r})"


# Entries with nothing to undo are shared (never changed once made).
SYNC_ENTRY: Final = Entry(KIND_SYNC)
BIND_ENTRY: Final = Entry(KIND_BIND)
PARSE_ENTRY: Final = Entry(KIND_PARSE)
CLOSE_ENTRY: Final = Entry(KIND_CLOSE)
#: A batch of pgtarn's own starts here: every reply up to its ReadyForQuery is swallowed.
HIDDEN_ENTRY: Final = Entry(KIND_HIDDEN)
#: A part (STREAMED_HEAD, head): the head (header included) of a client's Bind or Parse
#: too long to hold, its body's rest to follow as raw parts (client/large.py).
STREAMED_HEAD: Final = 0x100
#: A part (REFUSED_HEAD, head): the head of a client's named Parse too long to hold that
#: cannot be passed on (client/large.py says why): refused in its place, its rest dropped.
REFUSED_HEAD: Final = 0x101
#: A part (CEDING_HEAD, head): the head of a client's Query or unnamed Parse too long to
#: hold that names statements in a way pgtarn cannot rewrite (client/large.py): the
#: client's statements are prepared on this server under its own names first, then it
#: goes as written.
CEDING_HEAD: Final = 0x102
#: A part (COPIES, b""): the client's statements prepared on this server under its own
#: names, ahead of a long Query whose names past its head cannot be rewritten
#: (client/large.py): if it names them there, they are ceded to the server at its end.
COPIES: Final = 0x103
#: A part (COPIES_CLOSED, b""): that Query named none past its head: the copies closed.
COPIES_CLOSED: Final = 0x104


class StatementRewriter:
    """The statements one server has prepared, and how a client's messages are rewritten for it
    (the client -> server half of ServerStatements, in prepared.py).

    Long: one state machine over a client's statement messages, its branches sharing one
    statement table (the module docstring says so too)."""

    def __init__(self, capacity: int, counters: PreparedCounters | None = None) -> None:
        self.capacity = capacity
        self.prepared: OrderedDict[bytes, Statement] = OrderedDict()
        self.expected: Fifo[Entry] = Fifo()
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
        #: The unnamed statement's text, when it holds DISCARD ALL or DEALLOCATE ALL.
        self.unnamed_forgets = b""
        #: A check of a described statement prepared afresh here is under way: the client's
        #: parts from its Bind on wait (deferred, taken by the caller of send) until its
        #: ReadyForQuery (then resume is set).
        self.checking = False
        self.resume = False
        self.deferred: list[Part] | None = None
        #: Describe replies owed (the relay reads ParameterDescription and RowDescription
        #: only while some are), and the ParameterDescription of the one under way.
        self.describing = 0
        self._parameters = b""
        #: Statements whose Bind raises an error here in their place (SQLSTATE, message):
        #: prepared afresh with another result type than their clients were told.
        self.refused: dict[bytes, tuple[str, str]] = {}
        #: The error pgtarn's raiser or a stand-in name is to give (SQLSTATE, the message
        #: the server will give, the message the client gets): ServerStatements.error sends
        #: it as PostgreSQL words it, routine included (drivers read that).
        self.raising: tuple[str, str, str] | None = None
        #: Bytes of a streamed Bind replaced by pgtarn's raiser still to come: dropped from
        #: the raw parts that follow (and of a streamed Query replaced by a refusal).
        self.dropping = 0
        #: The entry of a streamed Query whose head named statements, appended at its end
        #: (its SYNC_MARK), after its raw parts.
        self.streamed_query: Entry | None = None
        #: The client's statements prepared here under its own names ahead of a long Query
        #: (COPIES), to close after it (COPIES_CLOSED).
        self.copies: list[bytes] = []
        #: Names the client prepared again while they were in use (refused with 42P05),
        #: for the caller to log; it empties the list.
        self.already_prepared: list[bytes] = []

    @property
    def idle(self) -> bool:
        """No reply about statements is owed (the server can change hands)."""
        return not self.expected

    # --- client -> server ---------------------------------------------------------------------

    def rewrite(self, client: ClientStatements, messages: Iterable[tuple[int, bytes]]) -> bytes:
        """What to send this server for complete client messages (type, body)."""
        return self._encode(client, list(messages), 0, None, True)

    def send(
        self,
        client: ClientStatements,
        parts: list[Part],
        chunk: bytes | None = None,
        status: bytes = b"I",
    ) -> bytes:
        """What to send this server for parts from a ClientFramer.

        chunk: the received bytes, when the parts are exactly those and none needs rewriting
        (ClientFramer.whole and .plain): they are sent as they are. status: the server's
        transaction status now (whether a DISCARD ALL it will run can succeed).
        """
        if chunk is not None:
            for part in parts:
                if isinstance(part, int):
                    self.expected.append(SYNC_ENTRY)
            self.fresh = self.clean = isinstance(parts[-1], int)
            return chunk
        return self._encode(client, parts, 0, None, True, status)

    def _encode(
        self,
        client: ClientStatements,
        parts: list[Part],
        begin: int,
        end: int | None,
        may_retry: bool,
        status: bytes = b"I",
    ) -> bytes:
        out = bytearray()
        for index in range(begin, len(parts) if end is None else end):
            part = parts[index]
            if isinstance(part, int):
                query = self.streamed_query
                if query is None:
                    self._synced(SYNC_ENTRY)
                else:  # the end of a streamed Query whose head named statements
                    self.streamed_query = None
                    self._synced(query)
            elif isinstance(part, bytes):
                if self.dropping:
                    part = self._drop(part)
                out += part
                self.fresh = self.clean = False
            else:
                msg_type, body = part
                if msg_type == STREAMED_HEAD:
                    self._streamed_head(client, body, out, status)
                elif msg_type == CEDING_HEAD:
                    self._ceding_head(client, body, out)
                elif msg_type == COPIES:
                    self.copies = self._copy_statements(client, out)
                elif msg_type == COPIES_CLOSED:
                    self._close_copies(out)
                elif msg_type == REFUSED_HEAD:
                    self.clean = False
                    _refuse_long(self, body[5:], out)
                    self.dropping = 1 + int.from_bytes(body[1:5], "big") - len(body)
                elif msg_type == PARSE:
                    self._parse(client, body, out)
                elif msg_type == BIND:
                    text = self._bind(client, body, out, parts, index, may_retry, end is None)
                    if self.checking:  # its statement is checked first: the rest waits
                        self.deferred = parts[index:]
                        break
                    if text:
                        self._forget_all(client, text, status)
                elif msg_type in (DESCRIBE, CLOSE):
                    self._describe_or_close(client, msg_type, body, out)
                elif msg_type == QUERY:
                    if self._query(client, body, out, parts, index, may_retry):
                        self._forget_all(client, body, status)
                else:
                    out += message(bytes((msg_type,)), body)
                    if msg_type == SYNC:
                        self._synced(SYNC_ENTRY)
                    else:
                        self.fresh = self.clean = False
        return bytes(out)

    def _drop(self, part: bytes) -> bytes:
        """What is left of a raw part once the bytes of a replaced Bind are dropped."""
        cut = min(self.dropping, len(part))
        self.dropping -= cut
        return part[cut:]

    def _streamed_head(
        self, client: ClientStatements, head: bytes, out: bytearray, status: bytes
    ) -> None:
        """The head of a Bind or unnamed Parse passed on in pieces: written as the whole
        message would be (a Bind's statement name rewritten, its length made right), its
        rest following as raw parts; never retried nor checked first (it is not kept)."""
        rest = 1 + int.from_bytes(head[1:5], "big") - len(head)
        if head[0] == QUERY:
            self._streamed_query(client, head, out, rest, status)
            return
        if head[0] == PARSE and head[5] != 0:
            self._held_parse(client, head, out, rest)
            return
        if head[0] == PARSE:  # unnamed: one EXECUTE, or naming none (the relay saw to it)
            clean = self.clean
            self.clean = False
            self.unnamed_forgets = b""
            if sqlnames.has_statement_words(head):
                head = self._streamed_execute_parse(client, head, clean, out, rest)
            out += head
            self.expected.append(PARSE_ENTRY)
            return
        raising = self.raising
        start = len(out)
        forgets = self._bind(client, head[5:], out, [], 0, False)
        if self.raising is not raising:  # replaced by pgtarn's raiser: the rest dropped
            self.dropping = rest
            return
        last = pos = start  # the Bind is the last message written
        while pos < len(out):
            last = pos
            pos += 1 + int.from_bytes(out[pos + 1 : pos + 5], "big")
        out[last + 1 : last + 5] = (
            int.from_bytes(out[last + 1 : last + 5], "big") + rest
        ).to_bytes(4, "big")
        if forgets:
            self._forget_all(client, forgets, status)

    def _streamed_query(
        self, client: ClientStatements, head: bytes, out: bytearray, rest: int, status: bytes
    ) -> None:
        """The head of a simple Query passed on in pieces that is one EXECUTE or PREPARE (the
        relay saw to it: sqlnames.scan_head; a PREPARE is _held_prepare's). An EXECUTE is
        written with the statement's server-side name (prepared first if this server lacks
        it), its length made right for that name, its rest following as raw parts; the
        entry of its ReadyForQuery waits for its end (streamed_query). Never retried after
        a stale plan (it is not kept). A form pgtarn refuses goes as the refusal, the rest
        dropped."""
        text = head[5:]
        use = sqlnames.scan_head(text)
        uses = [] if use is None else [use]
        refusal = _refusal(self, client, sqlnames.Scan(uses, 1))
        if refusal is not None:
            out += refusal
            self.dropping = rest
            return
        if use is not None and use.kind == sqlnames.PREPARE:
            self._held_prepare(client, use.name, head, out)
            return
        stmt = None if use is None else client.names.get(use.name)
        executes: tuple[Statement, ...] = ()
        if use is not None and stmt is not None:  # (else PostgreSQL's own error names it)
            if not self._has(stmt):
                self._prelude(stmt, out)
            self.counters.binds += 1
            executes = (stmt,)
            text = sqlnames.rename(text, [(use.start, use.end, in_sql(stmt.name))])
        out += b"Q" + (4 + len(text) + rest).to_bytes(4, "big") + text
        self.fresh = self.clean = False  # (until its end)
        self.streamed_query = Entry(KIND_SYNC, FORWARD, executes=executes)
        self._forget_all(client, text, status)

    def _streamed_execute_parse(
        self, client: ClientStatements, head: bytes, clean: bool, out: bytearray, rest: int
    ) -> bytes:
        """The head of an unnamed Parse passed on in pieces, to write: one that is one
        EXECUTE (sqlnames.scan_head) gets the statement's server-side name, as _sql_in_parse
        gives it (prepared first if this server lacks it, at a batch's start), its length
        made right; one that cannot run is replaced by a Parse raising the error, its rest
        dropped."""
        text = head[6:]
        use = sqlnames.scan_head(text)
        if use is None or use.kind != sqlnames.EXECUTE:
            return head
        stmt = client.names.get(use.name)
        error = None
        if stmt is None:
            if not use.name.startswith(SERVER_PREFIX):
                return head  # not the client's: PostgreSQL's own error names it
            error = raise_error("26000", _missing(use.name))  # another client's statement
        elif stmt.name not in self.prepared and not clean:
            error = raise_error("0A000", _MID_BATCH_EXECUTE)
        if error is not None:
            self.dropping = rest
            return message(b"P", b"\x00" + error[5:-1] + b"\x00\x00\x00")
        assert stmt is not None
        if not self._has(stmt):
            self._prelude(stmt, out)
        self.counters.binds += 1
        self.stale_candidates = (stmt,)
        body = b"\x00" + sqlnames.rename(text, [(use.start, use.end, in_sql(stmt.name))])
        return b"P" + (4 + len(body) + rest).to_bytes(4, "big") + body

    def _held_prepare(
        self, client: ClientStatements, name: bytes, head: bytes, out: bytearray
    ) -> None:
        """The head of a simple Query passed on in pieces that is one SQL PREPARE, its client
        pinned to this server (client/large.py): sent as it is, the statement prepared under
        the client's own name (held_sql_statement says why), which pgtarn now follows as
        the client's; undone if the query fails, as a PREPARE held whole is."""
        self.counters.client_parses += 1
        stmt = client.cache.held_sql_statement(name)
        client.name(name, stmt)
        self._evict(out)
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        out += head
        self.fresh = self.clean = False  # (until its end)
        self.streamed_query = Entry(KIND_SYNC, UNDO_DEFINED, stmt, client, name)

    def _ceding_head(self, client: ClientStatements, head: bytes, out: bytearray) -> None:
        """The head of a Query or unnamed Parse passed on in pieces whose names pgtarn cannot
        rewrite (client/large.py): the client's statements are prepared here under its own
        names first (_copy_statements), then the message goes as the client wrote it, its
        rest as raw parts. Its client is pinned here, and from its end on its statement
        messages go as they are: the server's statements are the client's own."""
        self._copy_statements(client, out)
        out += head
        self.fresh = self.clean = False  # (until its end)
        if head[0] == PARSE:
            self.unnamed_forgets = b""
            self.expected.append(PARSE_ENTRY)

    def _copy_statements(self, client: ClientStatements, out: bytearray) -> list[bytes]:
        """Each of the client's statements prepared here under the client's own name, each
        in a batch of pgtarn's own (one that fails leaves the others; the client gets its
        error where a text names it); the names copied."""
        copied = []
        for name, stmt in client.names.items():
            if stmt.held and stmt.sql:  # (already under the client's name, here)
                continue
            self.expected.append(HIDDEN_ENTRY)
            if stmt.sql:  # PREPARE pgtarn_s<n> <definition>: the client's name in its place
                definition = stmt.parse[5 + len(b"PREPARE ") + len(stmt.name) : -1]
                out += message(b"Q", b"PREPARE " + in_sql(name) + definition + b"\x00")
            else:
                parse = stmt.typed_parse()
                out += message(b"P", name + parse[5 + len(stmt.name) :]) + build.SYNC
                self.expected.append(Entry(KIND_PARSE, DROP))
            self.expected.append(Entry(KIND_SYNC, UNDO_CEDED, client_name=name))
            copied.append(name)
        return copied

    def _close_copies(self, out: bytearray) -> None:
        """The copies of the last COPIES closed, in a batch of pgtarn's own (after the Query
        they were made for, which named none of them: a copy that failed closes as a
        no-op), so that no other client lent this server meets them."""
        copies, self.copies = self.copies, []
        if not copies:
            return
        self.expected.append(HIDDEN_ENTRY)
        for name in copies:
            out += message(b"C", b"S" + name + b"\x00")
            self.expected.append(Entry(KIND_CLOSE, DROP))
        out += build.SYNC
        self.expected.append(Entry(KIND_SYNC))

    def _held_parse(self, client: ClientStatements, head: bytes, out: bytearray, rest: int) -> None:
        """The head of a named Parse passed on in pieces, its client pinned to this server
        (client/large.py): prepared under a server-side name of its own (Statement.held),
        its length made right for that name, its rest following as raw parts."""
        self.clean = False
        body = head[5:]
        name_end = body.index(b"\x00")  # (the relay saw the name end in the head)
        name = body[:name_end]
        if name in client.names and not _reuse_unsure(self, client, name):
            _refuse_reuse(self, name, b"\x00\x00\x00", out)
            self.dropping = rest
            return
        self.counters.client_parses += 1
        stmt = client.cache.held_statement(name)
        previous = client.names.get(name)
        client.name(name, stmt)
        if previous is not None:
            client.cache.release(previous)
        self._evict(out)
        tail = stmt.name + body[name_end:]
        out += b"P" + (4 + len(tail) + rest).to_bytes(4, "big") + tail
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        self.expected.append(Entry(KIND_PARSE, FORWARD, stmt, client, name, previous))

    def _check(self, stmt: Statement, out: bytearray) -> None:
        """A Bind, first of its batch, of a statement a client described that this server
        lacks: prepare and describe it in a batch of pgtarn's own first (``checking``), whose
        description must match what the client was told before the Bind may run."""
        self.expected.append(HIDDEN_ENTRY)
        self._evict(out)
        out += stmt.typed_parse() + message(b"D", b"S" + stmt.name + b"\x00") + build.SYNC
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        self.expected.append(Entry(KIND_PARSE, DROP, stmt))
        self.expected.append(Entry(KIND_CHECK, FORWARD, stmt))
        self.describing += 1
        self.expected.append(Entry(KIND_SYNC, UNDO_CHECK, stmt))
        self.checking = True

    def _synced(self, entry: Entry) -> None:
        self.expected.append(entry)
        self.fresh = self.clean = True

    def _forget_all(self, client: ClientStatements, text: bytes, status: bytes) -> None:
        """A Query, or a Bind of a statement, whose text may hold DISCARD ALL or DEALLOCATE
        ALL was just written: if that will succeed, the server forgets every statement, and
        the client its names, from here on (not at a Parse: only running the text drops)."""
        if forgets_all(text, status):
            self.prepared.clear()
            client.clear()

    def _parse(self, client: ClientStatements, body: bytes, out: bytearray) -> None:
        clean = self.clean
        self.clean = False
        name, pos = read_cstring(body, 0)
        read_cstring(body, pos)  # the query too must end, before the statement is named
        if name and name in client.names and not _reuse_unsure(self, client, name):
            _refuse_reuse(self, name, body[pos:], out)
            return
        forgets = b""
        if sqlnames.may_name_statements(body, pos):  # DISCARD / DEALLOCATE ALL pass it too
            if not name and FORGETS_ALL.search(body, pos, body.find(b"\x00", pos)):
                forgets = body[pos:]
            body = self._sql_in_parse(client, name, body, pos, clean, out)
        if not name:
            self.unnamed_forgets = forgets
            out += message(b"P", body)
            self.expected.append(PARSE_ENTRY)
            return
        self.counters.client_parses += 1
        stmt, previous = client.define(name, body[pos:])
        if self._has(stmt):
            out += NOOP_CLOSE
            self.expected.append(Entry(KIND_CLOSE, AS_PARSE_COMPLETE, stmt, client, name, previous))
        else:
            self._prepare(stmt, out, Entry(KIND_PARSE, FORWARD, stmt, client, name, previous))

    def _sql_in_parse(
        self,
        client: ClientStatements,
        name: bytes,
        body: bytes,
        pos: int,
        clean: bool,
        out: bytearray,
    ) -> bytes:
        """A Parse body whose query uses SQL-level statement names.

        An unnamed statement that EXECUTEs the client's statements gets their server-side
        names (prepared first, when it begins a batch). What cannot be run safely becomes a
        query that raises the error saying so: a PREPARE or DEALLOCATE (it would be made or
        dropped on one server only), or a named statement using the client's names (it would
        depend on statements other servers lack).
        """
        query, end = read_cstring(body, pos)
        try:
            found = sqlnames.scan(query)
        except sqlnames.Unterminated:
            return body
        renames: list[tuple[int, int, bytes]] = []
        needed: list[Statement] = []
        for use in found.uses:
            stmt = client.names.get(use.name)
            if use.kind != sqlnames.PREPARE and stmt is None:
                if use.name.startswith(SERVER_PREFIX):  # another client's statement
                    return _refused_parse(body, pos, end, _missing(use.name), "26000")
                continue  # not the client's: PostgreSQL's own error names it
            if use.kind != sqlnames.EXECUTE or name:
                word = (
                    "PREPARE"
                    if use.kind == sqlnames.PREPARE
                    else "DEALLOCATE"
                    if use.kind == sqlnames.DEALLOCATE
                    else "EXECUTE"
                )
                return _refused_parse(
                    body,
                    pos,
                    end,
                    word
                    + (
                        " of a SQL-level prepared statement"
                        if use.kind != sqlnames.EXECUTE
                        else " of a SQL-level prepared statement in a named statement"
                    )
                    + " through the extended query protocol is not supported in transaction"
                    " pooling mode; send it as a simple query",
                )
            assert stmt is not None
            if stmt.name not in self.prepared and not clean:
                return _refused_parse(body, pos, end, _MID_BATCH_EXECUTE)
            needed.append(stmt)
            renames.append((use.start, use.end, in_sql(stmt.name)))
        for stmt in needed:
            if not self._has(stmt):
                self._prelude(stmt, out)
            self.counters.binds += 1
        if not renames:
            return body
        self.stale_candidates = tuple(needed)
        return body[:pos] + sqlnames.rename(query, renames) + b"\x00" + body[end:]

    def _bind(
        self,
        client: ClientStatements,
        body: bytes,
        out: bytearray,
        parts: list[Part],
        index: int,
        may_retry: bool,
        may_check: bool = False,
    ) -> bytes:
        """Returns the text of the statement bound when it may hold DISCARD ALL or DEALLOCATE
        ALL, else b"". may_check: a check of its statement may go first (``checking`` set
        then, and the Bind not written)."""
        _portal, pos = read_cstring(body, 0)
        name, end = read_cstring(body, pos)
        stmt = client.names.get(name) if name else None
        forgets = b""
        if stmt is None and name.startswith(SERVER_PREFIX):
            # Another client's statement, by its server-side name: never the client's.
            self._raise("26000", _missing(name), body[:pos], out)
        elif stmt is None:
            out += message(b"B", body)
            self.expected.append(BIND_ENTRY)
            if not name:
                forgets = self.unnamed_forgets
        elif self.refused and stmt.name in self.refused:
            sqlstate, text = self.refused[stmt.name]
            self._raise(sqlstate, text, body[:pos], out)
        elif stmt.told is not None and may_check and self.clean and \
                stmt.name not in self.prepared:  # fmt: skip
            self._check(stmt, out)
            return b""
        else:
            if stmt.forgets:
                forgets = stmt.parse[5 + len(stmt.name) + 1 :]
            self.counters.binds += 1
            self._ensure(stmt, out)
            out += message(b"B", body[:pos] + stmt.name + body[end - 1 :])
            # Nothing of the batch ran before this Bind: it may be sent again after a stale
            # plan (whether a Sync ends it within these parts is seen only then).
            self.expected.append(
                Entry(KIND_BIND, FORWARD, stmt, None, b"", None, parts, index, client)
                if may_retry and self.fresh
                else Entry(KIND_BIND, FORWARD, stmt)
            )
        self.fresh = self.clean = False
        return forgets

    def _raise(self, sqlstate: str, text: str, portal: bytes, out: bytearray) -> None:
        """In place of a Bind (of portal: its name and NUL), pgtarn's raiser: the client gets
        its BindComplete, and the error at its Execute (sent as PostgreSQL words it)."""
        self.raising = (sqlstate, text, text)
        out += message(b"C", b"S" + RAISER_NAME + b"\x00")
        self.expected.append(Entry(KIND_CLOSE, DROP))
        out += message(
            b"P", RAISER_NAME + b"\x00" + raise_error(sqlstate, text)[5:-1] + b"\x00\x00\x00"
        )
        self.expected.append(Entry(KIND_PARSE, DROP))
        out += message(b"B", portal + RAISER_NAME + b"\x00" + b"\x00" * 6)
        self.expected.append(BIND_ENTRY)

    def _describe_or_close(
        self, client: ClientStatements, msg_type: int, body: bytes, out: bytearray
    ) -> None:
        self.clean = False
        kind = body[:1]
        name, _end = read_cstring(body, 1)
        if kind != b"S" or not name:
            out += message(bytes((msg_type,)), body)
            if msg_type == CLOSE:
                self.expected.append(CLOSE_ENTRY)
        elif msg_type == DESCRIBE:
            stmt = client.names.get(name)
            if stmt is None and name.startswith(SERVER_PREFIX):
                # Another client's statement: described as one that does not exist.
                out += message(b"D", b"S" + NOOP_NAME + b"\x00")
                self.raising = ("26000", _missing(NOOP_NAME), _missing(name))
            elif stmt is None:
                out += message(b"D", body)
            else:
                stmt.described = True  # its driver may cache what it is told now
                self._ensure(stmt, out)
                out += message(b"D", b"S" + stmt.name + b"\x00")
                if stmt.told is None:  # what it is told is recorded from the replies
                    self.expected.append(Entry(KIND_DESCRIBE, FORWARD, stmt))
                    self.describing += 1
                # A stale plan fails a Describe too: it has no reply entry, so a Bind after
                # it must not be retried from, and it is the statement to renew.
                self.fresh = False
                self.stale_candidates = (stmt,)
        else:
            # Other clients may use the statement: forget the name, keep the server's.
            previous = client.names.get(name)
            client.forget(name)
            if previous is not None and not previous.name.startswith(SERVER_PREFIX):
                # Held under the client's own name (a long SQL PREPARE), which it may run
                # as written: closed for real, as no other client has it.
                out += message(b"C", b"S" + previous.name + b"\x00")
            else:
                out += NOOP_CLOSE
            self.expected.append(Entry(KIND_CLOSE, FORWARD, None, client, name, previous))

    def _query(
        self,
        client: ClientStatements,
        body: bytes,
        out: bytearray,
        parts: list[Part],
        index: int,
        may_retry: bool,
    ) -> bool:
        """A simple Query: SQL-level PREPARE / EXECUTE / DEALLOCATE names are rewritten.
        Returns False when a query raising pgtarn's refusal went in its place."""
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
            return True
        refusal = _refusal(self, client, found)
        if refusal is not None:
            out += refusal
            self._synced(SYNC_ENTRY)
            return False
        renames: list[tuple[int, int, bytes]] = []
        executes: list[Statement] = []
        entry = None
        for use in found.uses:
            stmt = client.names.get(use.name)
            if use.kind == sqlnames.PREPARE:
                self.counters.client_parses += 1
                stmt = client.cache.sql_statement(text[use.end : use.statement_end])
                client.name(use.name, stmt)
                self._evict(out)
                self.prepared[stmt.name] = stmt
                self.counters.server_parses += 1
                entry = Entry(KIND_SYNC, UNDO_DEFINED, stmt, client, use.name)
            elif stmt is None:
                continue  # not a name of this client: PostgreSQL's own error names it
            else:
                had = self._has(stmt)
                if not had:
                    self._prelude(stmt, out)
                if use.kind == sqlnames.DEALLOCATE:
                    client.forget(use.name)
                    self.prepared.pop(stmt.name, None)
                    entry = Entry(
                        KIND_SYNC, UNDO_DEALLOCATED, stmt, client, use.name, stmt if had else None
                    )
                else:
                    self.counters.binds += 1
                    executes.append(stmt)
            renames.append((use.start, use.end, in_sql(stmt.name)))
        if not renames:
            self._pass_query(body, out)
            return True
        out += message(b"Q", sqlnames.rename(text, renames) + b"\x00")
        if entry is None:
            entry = Entry(KIND_SYNC, FORWARD, executes=tuple(executes))
            if may_retry and clean and found.statements == 1:
                entry.batch, entry.at, entry.owner = parts, index, client
        self._synced(entry)
        return True

    def _pass_query(self, body: bytes, out: bytearray) -> None:
        """A simple Query sent as the client wrote it."""
        out += message(b"Q", body)
        self._synced(SYNC_ENTRY)

    def _prelude(self, stmt: Statement, out: bytearray) -> None:
        """Prepare stmt ahead of a simple query, in a batch of pgtarn's own (after the last
        Sync, so nothing can skip it) whose replies the client never sees."""
        self.expected.append(HIDDEN_ENTRY)
        self._evict(out)
        out += stmt.parse
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        if not stmt.sql:
            out += build.SYNC
            self.expected.append(Entry(KIND_PARSE, DROP, stmt))
        self.expected.append(Entry(KIND_SYNC, UNDO_PRELUDE, stmt))

    def _ensure(self, stmt: Statement, out: bytearray) -> None:
        """Prepare stmt on this server first if it lacks it; the client never sees that."""
        if not self._has(stmt):
            self._prepare(stmt, out, Entry(KIND_PARSE, DROP, stmt))

    def _has(self, stmt: Statement) -> bool:
        """Whether this server has stmt (then it becomes the most recently used)."""
        if stmt.name not in self.prepared:
            return False
        self.prepared.move_to_end(stmt.name)
        return True

    def _prepare(self, stmt: Statement, out: bytearray, entry: Entry) -> None:
        """Send stmt's Parse (after evicting the least recently used if full)."""
        self._evict(out)
        out += stmt.parse
        self.prepared[stmt.name] = stmt
        self.counters.server_parses += 1
        self.expected.append(entry)

    def _evict(self, out: bytearray) -> None:
        prepared = self.prepared
        while self.capacity and len(prepared) >= self.capacity:
            name = next(
                (key for key, stmt in prepared.items() if not stmt.held or stmt.clients <= 0),
                None,
            )
            if name is None:  # only statements no other server can have, each a client's:
                return  # kept, over capacity (their servers close when their clients leave)
            stmt = prepared.pop(name)
            out += message(b"C", b"S" + name + b"\x00")
            self.expected.append(Entry(KIND_CLOSE, DROP, stmt))

    # --- server -> client -----------------------------------------------------------------------


def _refuse_reuse(
    rewriter: StatementRewriter, name: bytes, parse_tail: bytes, out: bytearray
) -> None:
    """A Parse of a name the client has: PostgreSQL's 42P05, raised by the server itself on
    the raiser's name (prepared twice, the second time with the client's query, so that a
    syntax error in it comes first, as on a direct connection); the name keeps its
    statement. The failing Parse's entry says whose name to put in the error."""
    rewriter.already_prepared.append(name)
    expected = rewriter.expected
    out += message(b"C", b"S" + RAISER_NAME + b"\x00")
    expected.append(Entry(KIND_CLOSE, DROP))
    out += message(b"P", RAISER_NAME + b"\x00\x00\x00\x00")
    expected.append(Entry(KIND_PARSE, DROP))
    out += message(b"P", RAISER_NAME + b"\x00" + parse_tail)
    expected.append(Entry(KIND_PARSE, REFUSED_REUSE, None, None, name))


def _refuse_long(rewriter: StatementRewriter, body: bytes, out: bytearray) -> None:
    """A named Parse too long to hold (body: its head's): the raiser's Parse of a text that
    fails to parse in its place, which defines nothing and makes the server skip to the
    next Sync as the client's failed Parse would; its error is given as 54000."""
    name_end = body.find(b"\x00")
    name = body[: name_end if name_end >= 0 else 63]
    out += message(b"P", RAISER_NAME + b"\x00" + b"pgtarn refused\x00\x00\x00")
    rewriter.expected.append(Entry(KIND_PARSE, REFUSED_LONG, None, None, name))


def in_sql(name: bytes) -> bytes:
    """A server-side statement name as SQL text writes it: pgtarn's own as they are, a
    client's (a SQL PREPARE held under its client's name) as a quoted identifier."""
    if name.startswith(SERVER_PREFIX):
        return name
    return b'"' + name.replace(b'"', b'""') + b'"'


def too_long(name: bytes) -> str:
    """The 54000 message for a named Parse longer than client_message_buffer."""
    return (
        'prepared statement "' + name.decode("utf-8", "replace") + '" is longer than'
        " client_message_buffer: pgtarn cannot keep its text to prepare it on other servers"
        " (prepare it as the unnamed statement, or raise client_message_buffer)"
    )


def _reuse_unsure(rewriter: StatementRewriter, client: ClientStatements, name: bytes) -> bool:
    """Whether the name was defined by a message whose outcome is still owed, in a batch
    before this one: whether this Parse is refused depends on that outcome, unknown yet, so
    the Parse defines the name (had the first succeeded, PostgreSQL would have refused it).
    In the same batch the refusal is right either way: a failure there makes the server
    skip this Parse too."""
    synced = False
    for entry in reversed(list(rewriter.expected)):
        if entry.client is client and entry.client_name == name:
            return synced or entry.kind == KIND_SYNC
        if entry.kind == KIND_SYNC:
            synced = True
    return False


def _refusal(rewriter: StatementRewriter, client: ClientStatements, found: sqlnames.Scan
             ) -> bytes | None:  # fmt: skip
    """A query that raises the error for a form pgtarn cannot run safely, or None."""
    for use in found.uses:
        known = client.names.get(use.name)
        if (
            use.kind != sqlnames.PREPARE and known is None and use.name.startswith(SERVER_PREFIX)
        ):  # another client's statement
            return raise_error("26000", _missing(use.name))
        if use.kind != sqlnames.EXECUTE and found.statements > 1:
            word = "PREPARE" if use.kind == sqlnames.PREPARE else "DEALLOCATE"
            return raise_error(
                "0A000", f"{word} must be sent as a query of its own in transaction pooling mode"
            )
        if use.kind == sqlnames.PREPARE and known is not None:
            name = use.name.decode("utf-8", "replace")
            return raise_error("42P05", f'prepared statement "{name}" already exists')
        if (
            use.kind != sqlnames.PREPARE
            and known is not None
            and not rewriter.clean
            and known.name not in rewriter.prepared
        ):
            return raise_error(
                "0A000",
                "a prepared statement cannot be run by a simple query in the"
                " middle of an extended-protocol batch in transaction pooling mode;"
                " send Sync first",
            )
    return None


#: Why an unnamed statement EXECUTEs no statement the server lacks but at a batch's start.
_MID_BATCH_EXECUTE: Final = (
    "EXECUTE of a SQL-level prepared statement in the middle of an extended-protocol batch"
    " is not supported in transaction pooling mode"
)


def _refused_parse(body: bytes, pos: int, end: int, message: str, sqlstate: str = "0A000"
                   ) -> bytes:  # fmt: skip
    """A Parse body whose query raises message (SQLSTATE 0A000 unless given) when run."""
    return body[:pos] + raise_error(sqlstate, message)[5:-1] + b"\x00" + body[end:]


def exists(name: bytes) -> str:
    """PostgreSQL's message for a prepared statement name already in use."""
    return 'prepared statement "' + name.decode("utf-8", "replace") + '" already exists'


def _missing(name: bytes) -> str:
    """PostgreSQL's message for a prepared statement name that does not exist."""
    return 'prepared statement "' + name.decode("utf-8", "replace") + '" does not exist'


def batch_end(parts: list[Part], index: int) -> int:
    """Where the batch holding parts[index] ends (its Sync or Query), or -1."""
    for j in range(index, len(parts)):
        part = parts[j]
        if isinstance(part, int) or (isinstance(part, tuple) and part[0] in (SYNC, QUERY)):
            return j
    return -1


def raise_error(sqlstate: str, text: str) -> bytes:
    """A Query whose error is ours, raised by the server so that it lands in order and a
    transaction block fails as it would have."""
    literal = quote_literal(text.replace("$pgtarn$", ""))
    sql = (
        f"DO $pgtarn$BEGIN RAISE EXCEPTION USING ERRCODE = '{sqlstate}', "
        f"MESSAGE = {literal}; END$pgtarn$"
    )
    return message(b"Q", sql.encode() + b"\x00")
