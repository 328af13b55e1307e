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

The work is split in three modules: statements.py (the cache and a client's names),
rewrite.py (StatementRewriter: client messages for one server) and this one
(ServerStatements: what a server's replies mean for them). This module is the face of the
feature: it re-exports what the connections use, so they import from one place.
"""

from __future__ import annotations

from typing import Final

from ..proto.messages import parse_fields
from ..proto.msgtypes import BIND_COMPLETE, PARAMETER_DESCRIPTION, PARSE_COMPLETE
from .rewrite import (
    AS_PARSE_COMPLETE,
    DROP,
    FORWARD,
    HIDDEN_ENTRY,
    KIND_BIND,
    KIND_CHECK,
    KIND_CLOSE,
    KIND_DESCRIBE,
    KIND_PARSE,
    KIND_SYNC,
    NOOP_CLOSE,
    REFUSED_LONG,
    REFUSED_REUSE,
    RESULT_TYPE_CHANGED_ERROR,
    SERVER_PREFIX,
    SYNC_ENTRY,
    UNDO_CEDED,
    UNDO_CHECK,
    UNDO_DEALLOCATED,
    UNDO_DEFINED,
    UNDO_PRELUDE,
    Entry,
    StatementRewriter,
    batch_end,
    exists,
    raise_error,
    too_long,
)
from .stale import description_digest, means_stale, reads_description
from .statements import (
    FORGETS_ALL,
    ClientStatements,
    PreparedCounters,
    Statement,
    StatementCache,
)

__all__ = [
    "AS_PARSE_COMPLETE",
    "DROP",
    "ERROR_FORWARD",
    "ERROR_HIDE",
    "ERROR_REPLACE",
    "FORGETS_ALL",
    "FORWARD",
    "HIDDEN_ENTRY",
    "NOOP_CLOSE",
    "READY_FORWARD",
    "READY_RETRY",
    "READY_UNHIDE",
    "ClientStatements",
    "PreparedCounters",
    "ServerStatements",
    "Statement",
    "StatementCache",
    "raise_error",
]

ERROR_FORWARD: Final = 0
ERROR_HIDE: Final = 1
ERROR_REPLACE: Final = 2

READY_FORWARD: Final = 0
READY_RETRY: Final = 1
READY_UNHIDE: Final = 2


class ServerStatements(StatementRewriter):
    """The statements one server has prepared, and the replies it still owes about them."""

    def reply(self, msg_type: int) -> int:
        """A ParseComplete, BindComplete or CloseComplete: what to do with it.

        Returns FORWARD, DROP or AS_PARSE_COMPLETE (send a ParseComplete in its place).
        """
        want = (
            KIND_PARSE
            if msg_type == PARSE_COMPLETE
            else KIND_BIND
            if msg_type == BIND_COMPLETE
            else KIND_CLOSE
        )
        expected = self.expected
        while expected and expected[0].kind != want and expected[0].kind != KIND_SYNC:
            self._skipped(expected.popleft())  # cannot happen with a well-behaved server
        if not expected or expected[0].kind != want:
            return FORWARD
        return expected.popleft().action

    def description(self, msg_type: int, body: bytes, cache: StatementCache) -> None:
        """A ParameterDescription, RowDescription or NoData (read while ``describing``): the
        reply to a client's Describe of a statement is what its clients are told, recorded
        once; the reply to pgtarn's check of a statement prepared afresh must match it, or
        the statement's Binds raise PostgreSQL's error in their place on this server (as on
        the backend where the client prepared it), and its next Parse is fresh."""
        expected = self.expected
        if not expected or expected[0].kind not in (KIND_DESCRIBE, KIND_CHECK):
            return  # a portal's, or a simple query's
        if msg_type == PARAMETER_DESCRIPTION:
            self._parameters = body
            return
        head = expected.popleft()
        self.describing -= 1
        parameters, self._parameters = self._parameters, b""
        stmt = head.stmt
        assert stmt is not None
        told = description_digest(parameters, msg_type, body)
        if head.kind == KIND_DESCRIBE:
            if stmt.told is None:
                stmt.told, stmt.told_parameters = told, parameters
        elif told != stmt.told:
            if len(self.refused) >= max(self.capacity, 1):
                self.refused.clear()
            self.refused[stmt.name] = RESULT_TYPE_CHANGED_ERROR
            cache.detach(stmt)

    def error(self, body: bytes, cache: StatementCache, whole: bool = True) -> int:
        """An ErrorResponse: ERROR_FORWARD, ERROR_HIDE (held back in ``withheld``: the batch
        will be sent again) or ERROR_REPLACE (send ``replacement`` instead).

        A Bind or EXECUTE that failed because the statement was prepared against an older
        schema (stale.STALE_ERRORS) renews that statement, so that the next attempt
        prepares it again; one a client described keeps its name (the client's driver must
        see the error and prepare it again, as on a direct connection), and any error of a
        statement lets the next Parse of its text prepare it afresh. The batch is sent again,
        the client none the wiser, only when nothing of it ran and the client reads the new
        description in it (stale.reads_description), and the error came whole (not whole:
        body is the head of an error too long to hold, which could not be given to the
        client if the batch were not sent again after all).
        """
        self.failed = True
        self.last_error = body
        expected = self.expected
        if expected and expected[0].action == REFUSED_REUSE and b"C42P05\x00" in body:
            self.raising = None  # (any error ends its batch: a raise after it never comes)
            self.replacement = _as_postgresql_words("42P05", exists(expected[0].client_name))
            return ERROR_REPLACE
        if expected and expected[0].action == REFUSED_LONG and b"C42601\x00" in body:
            self.raising = None
            self.replacement = _as_postgresql_words("54000", too_long(expected[0].client_name))
            return ERROR_REPLACE
        raising = self.raising
        if raising is not None:
            self.raising = None
            sqlstate, text, reply = raising
            if b"C" + sqlstate.encode() + b"\x00" in body and text.encode() in body:
                self.replacement = _as_postgresql_words(sqlstate, reply)
                return ERROR_REPLACE
        if not expected:
            return ERROR_FORWARD
        head = expected[0]
        stale = head.executes or (
            (head.stmt,) if head.kind == KIND_BIND and head.stmt else self.stale_candidates
        )
        if stale and means_stale(body):
            described = False
            for stmt in stale:
                if stmt.described or stmt.held:  # (held: its text is not known)
                    described = True
                    cache.detach(stmt)
                else:
                    # The old name stays in this server's LRU (its key), so that it is
                    # closed when evicted; the renewed name is prepared afresh on next use.
                    cache.renew(stmt)
            if (
                whole
                and not described
                and head.batch is not None
                and head.owner is not None
                and self._retry is None
                and batch_end(head.batch, head.at) >= 0
                and reads_description(head.batch, head.at)
            ):
                self._retry = (head.owner, head.batch, head.at)
                self.withheld = body
                return ERROR_HIDE
        elif stale:
            for stmt in stale:
                cache.detach(stmt)
        if b"RFetchPreparedStatement\x00" in body:  # PostgreSQL's, not pgtarn's raiser's
            self._lost(body)
        failed = self._failed_prelude
        if failed is not None and b"C26000\x00" in body and b'"' + failed[0] + b'"' in body:
            # "prepared statement pgtarn_s7 does not exist": the client gets the real cause.
            self._failed_prelude = None
            self.replacement = failed[1]
            return ERROR_REPLACE
        return ERROR_FORWARD

    def _lost(self, body: bytes) -> None:
        """A 26000 naming a statement pgtarn took this server to have: dropped behind its
        back (a DEALLOCATE ALL it did not see, from a client whose statements it does not
        follow): prepared again at its next use, rather than failing at each."""
        text = parse_fields(body).get("M", "")
        name = text[text.find('"') + 1 : text.rfind('"')].encode()
        if name.startswith(SERVER_PREFIX):
            self.prepared.pop(name, None)

    def ready(self, status: bytes, client: ClientStatements | None) -> int:
        """A ReadyForQuery: READY_FORWARD, READY_RETRY (swallow it and send ``resend``: the
        batch again, its statement prepared afresh) or READY_UNHIDE (send ``withheld`` first).

        client: the statements of the client linked now (a retry is for that client only).
        """
        expected = self.expected
        if not self.failed:  # the common cases, inlined
            if expected and expected[0] is SYNC_ENTRY:  # a simple query's, counted
                expected.popleft()
                return READY_FORWARD
            if not expected and self._retry is None:  # nothing owed: _ready's outcome
                self.stale_candidates = ()
                self._failed_prelude = None
                return READY_FORWARD
        failed = self.failed
        self.failed = False
        sync = self._ready()
        if sync is None or sync.action not in (UNDO_PRELUDE, UNDO_CHECK, UNDO_CEDED):
            self._failed_prelude = None  # it was for the query that followed the prelude
        if sync is not None and sync.action != FORWARD and failed:
            self._undo(sync)
        if sync is not None and sync.action == UNDO_CHECK:
            self.checking = False
            self.resume = True  # the client's parts held for the check go now
            stmt = sync.stmt
            if failed and stmt is not None and stmt.name not in self.refused:
                # the statement could not be prepared as its clients know it: they get why
                fields = parse_fields(self.last_error)
                self.refused[stmt.name] = (
                    fields.get("C", "XX000"),
                    fields.get("M", "cannot prepare the statement"),
                )
                self._failed_prelude = None
        retry = self._retry
        if retry is None:
            return READY_FORWARD
        self._retry = None
        owner, parts, at = retry
        if status == b"I" and not expected and self.clean and client is owner:
            self.resend = self._encode(owner, parts, at, batch_end(parts, at) + 1, False)
            return READY_RETRY
        return READY_UNHIDE

    def take_hidden(self) -> bool:
        """Whether a batch of pgtarn's own is next (call at a ReadyForQuery boundary)."""
        expected = self.expected
        if expected and expected[0] is HIDDEN_ENTRY:
            expected.popleft()
            return True
        return False

    def _ready(self) -> Entry | None:
        """ReadyForQuery: what was queued before its Sync and did not come never will.
        Returns the entry of that Sync."""
        expected = self.expected
        self.stale_candidates = ()
        skipped = []
        sync = None
        while expected:
            entry = expected.popleft()
            if entry.kind == KIND_SYNC:
                sync = entry
                break
            if entry is not HIDDEN_ENTRY:
                skipped.append(entry)
        for entry in reversed(skipped):  # undone last first, like an undo log
            self._skipped(entry)
        return sync

    def _undo(self, sync: Entry) -> None:
        """A simple query that defined, dropped or prepared a statement failed."""
        if sync.action == UNDO_CEDED:  # the client gets why where its query names it
            self._failed_prelude = (sync.client_name, self.last_error)
            return
        stmt = sync.stmt
        assert stmt is not None
        if sync.action == UNDO_PRELUDE and b"C42P05\x00" in self.last_error:
            return  # already there: prepared before, by a query whose outcome was unknown
        if sync.action == UNDO_DEALLOCATED:
            assert sync.client is not None
            sync.client.undefine(sync.client_name, None, stmt)
            if sync.previous is not None:  # the server had it and still has it
                self.prepared[stmt.name] = stmt
            return
        if self.prepared.get(stmt.name) is stmt:
            del self.prepared[stmt.name]
        if sync.action == UNDO_DEFINED:
            assert sync.client is not None
            sync.client.undefine(sync.client_name, stmt, None)
        else:
            self._failed_prelude = (stmt.name, self.last_error)

    def _skipped(self, entry: Entry) -> None:
        if entry.kind in (KIND_DESCRIBE, KIND_CHECK):
            self.describing -= 1
            self._parameters = b""
            return
        if entry.client is not None:
            # The client's Parse or Close failed or was skipped after an error: the name
            # means what it meant before.
            entry.client.undefine(entry.client_name, entry.stmt, entry.previous)
        stmt = entry.stmt
        if stmt is None:
            return
        if entry.kind == KIND_PARSE:
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
        self._synced(SYNC_ENTRY)


def _as_postgresql_words(sqlstate: str, text: str) -> bytes:
    """An ErrorResponse body for an error pgtarn raised in a statement's place: for a result
    type that changed, with the routine PostgreSQL names (asyncpg tells a stale statement
    from other errors of SQLSTATE 0A000 by it, and prepares it again)."""
    fields = [b"SERROR", b"VERROR", b"C" + sqlstate.encode(), b"M" + text.encode()]
    if (sqlstate, text) == RESULT_TYPE_CHANGED_ERROR:
        fields += [b"Fplancache.c", b"RRevalidateCachedQuery"]
    return b"\x00".join(fields) + b"\x00\x00"
