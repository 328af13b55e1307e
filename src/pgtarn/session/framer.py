"""ClientFramer: split a client's stream so that statement messages come out whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ..proto.build import message
from ..proto.framing import NEVER_STREAM, MessageScanner
from ..proto.msgtypes import (
    BATCH_TURN_TYPES,
    EXECUTE,
    NAMING_TYPES,
    QUERY,
    STATEMENT_WATCH_TYPES,
    SYNC,
    TERMINATE,
    TERMINATE_TYPES,
    TEXT_TYPES,
)
from .effects import NAMES_STATEMENTS, SCHEMA_CHANGE, Parsed, first_look, may_change_state
from .tracking import SessionTracker

#: A Sync or Query passed: one ReadyForQuery to come (an item of a ClientFramer part list).
SYNC_MARK: Final = 0
Part = bytes | tuple[int, bytes] | int
#: The session-state hook: (message type, body, ReadyForQuery owed before its batch's) ->
#: a Query to send in its place, b"" to drop it (answered by pgtarn), or None.
TextHook = Callable[[int, bytes, int], bytes | None]


class ClientFramer:
    """Splits a client's stream for statement rewriting, holding back only what it must.

    Built on MessageScanner, which finds the boundaries. Parse, Bind, Describe and Close come
    out whole as (type, body), even when split across chunks (their bytes are held until
    complete); so does a Query that may name SQL-level prepared statements. Every other
    message is passed on as raw bytes as it arrives, so a large CopyData is never buffered;
    a Sync or Query split across chunks is held until complete, then passed on whole. Each
    raw Sync and Query is followed by SYNC_MARK. ``terminated`` is set at a Terminate,
    which is not passed on, and nothing after it is read.
    """

    __slots__ = (
        "_carried",
        "_scanner",
        "_session",
        "_texts",
        "_where",
        "big_at",
        "big_start",
        "max_size",
        "named_effects",
        "plain",
        "schema_change",
        "terminated",
        "whole",
    )

    def __init__(self, max_size: int, stream_over: int = NEVER_STREAM) -> None:
        self.max_size = max_size
        self._scanner = MessageScanner(
            STATEMENT_WATCH_TYPES, max_size, stop=TERMINATE_TYPES, stream_over=stream_over
        )
        #: After feed: where a watched message too long to hold begins in the chunk (-1:
        #: none), and its first bytes held from an earlier chunk (MessageScanner.big_at):
        #: the parts are those of the chunk up to there, the message its caller's.
        self.big_at = -1
        self.big_start = b""
        #: After feed: the parts are exactly the chunk's bytes (nothing held or released).
        self.whole = True
        #: After feed: no part is a whole message to rewrite (only raw bytes and marks).
        self.plain = True
        self.terminated = False
        #: A Query or Parse fed may change the schema (DDL): the reader clears it.
        self.schema_change = False
        #: Session-state tracking (watch): told of texts that may change state.
        self._session: SessionTracker | None = None
        self._texts: TextHook | None = None
        #: The client's named statements that change session state (its texts hook keeps
        #: them): here, as only a client with a framer has Binds to count them at, and the
        #: many idle clients without one then hold no dict.
        self.named_effects: dict[bytes, Parsed] = {}
        #: While the texts hook runs: (chunk, start and end of its message, start of the
        #: batch in the chunk or -1, whether a batch was open before the chunk); and the
        #: Execute messages of the batch left open by the last chunk in which the hook ran
        #: (-1: unknown). For executes_before, which rows read from a batch need.
        self._where: tuple[bytes, int, int, int, bool] | None = None
        self._carried = -1

    def watch(self, session: SessionTracker, texts: TextHook) -> None:
        """Hand texts (Query, Parse) that may change session state to texts, with how many
        ReadyForQuery come before their batch's; every Parse, Bind and Close too while
        named_effects is not empty. texts may return a Query to send in place of one."""
        self._session = session
        self._texts = texts

    def feed(self, data: bytes, outstanding: int = 0, open_before: bool = False
             ) -> tuple[list[Part], int]:  # fmt: skip
        """Parts to send for a chunk, and how many ReadyForQuery they will bring (outstanding:
        how many were owed before it, for the session-state hook; open_before: whether the
        client's batch was open before it, for executes_before).

        A bad length raises ProtocolViolation, and so does every later feed."""
        scanner = self._scanner
        events = scanner.feed(data)
        self.big_at = big_at = scanner.big_at
        if big_at >= 0:  # (rare: a large message, its caller's from there on)
            self.big_start = scanner.big_start
            data = data[:big_at]
        parts: list[Part] = []
        syncs = 0
        released = scanner.released
        whole = not released
        if released:  # the header of a passed-on message, held back by the last feed
            parts.append(released)
        start = 0  # raw bytes from start up to a message are passed on as one slice
        rewritten = False
        session = self._session
        batch_at = -1  # where the last batch begun in this chunk starts
        hooked = False
        for msg_type, body, end in events:
            begin = end - 5 - len(body)
            if msg_type in TEXT_TYPES and first_look(body, msg_type) & SCHEMA_CHANGE:
                self.schema_change = True
            if (
                session is not None
                and msg_type != SYNC
                and (
                    (self.named_effects and msg_type in NAMING_TYPES)
                    or (
                        msg_type in TEXT_TYPES
                        and (session.parse_all or may_change_state(body, msg_type))
                    )
                )
            ):
                assert self._texts is not None
                self._where = (data, begin, end, batch_at, open_before)
                hooked = True
                refusal = self._texts(msg_type, body, outstanding + syncs)
                self._where = None
                if refusal is not None:
                    if begin > start:
                        parts.append(data[start:begin])
                    start = end
                    whole = False
                    syncs += 1  # its ReadyForQuery comes from the server or from pgtarn
                    batch_at = end
                    if refusal:  # a Query PostgreSQL answers with the refusal
                        rewritten = True
                        parts.append((QUERY, refusal[5:]))
                    continue
            if msg_type == SYNC or (msg_type == QUERY and not first_look(body) & NAMES_STATEMENTS):
                # Sync, or a Query naming no statement: passed on as it is
                if begin >= 0:
                    parts.append(data[start:end])  # with the raw bytes before it
                else:  # begun in an earlier chunk, held until now (start is 0)
                    whole = False
                    parts.append(message(bytes((msg_type,)), body))
                parts.append(SYNC_MARK)
                syncs += 1
                start = end
                batch_at = end
                continue
            if begin > start:
                parts.append(data[start:begin])
            elif begin < 0:
                whole = False
            start = end
            if msg_type == TERMINATE:
                self.terminated = True
                self.whole = False
                self.plain = not rewritten
                return parts, syncs
            rewritten = True
            parts.append((msg_type, body))  # Parse, Bind, Describe, Close, a Query naming them
            if msg_type == QUERY:
                syncs += 1
                batch_at = end
        tail = len(data) - scanner.held
        if tail > start:
            parts.append(data[start:tail])
        if hooked or self._carried >= 0:  # (only while the hook reads rows' places)
            self._carried = _executes_left(data, batch_at, open_before, self._carried) \
                if hooked and scanner.at_boundary else -1  # fmt: skip
        self.whole = whole and not scanner.held
        self.plain = not rewritten
        return parts, syncs

    def executes_before(self, query: bool) -> int:
        """While the texts hook runs: how many results of its message's batch come before
        the message's own (Execute messages of the batch before it); -1 when that is unknown
        (the batch began in a chunk the hook did not see), or, for a Bind (query False),
        when no Execute follows it in the chunk before the batch goes on to another Bind."""
        where = self._where
        if where is None:
            return -1
        data, begin, end, batch_at, open_before = where
        if begin < 0:
            return -1
        if batch_at >= 0:
            count = _executes(data, batch_at, begin)
        else:
            before = self._carried if open_before else 0
            if before < 0:
                return -1
            count = before + _executes(data, 0, begin)
        if not query and not _execute_follows(data, end):
            return -1
        return count

    @property
    def hooking(self) -> bool:
        """Whether the texts hook runs now (called from feed)."""
        return self._where is not None

    @property
    def held(self) -> int:
        """Bytes of an incomplete message held back (at most one message: bounded)."""
        return self._scanner.buffered

    @property
    def mid_message(self) -> bool:
        """Part of a message was received and not all of it (some of it may have gone)."""
        return not self._scanner.at_boundary

    @property
    def idle(self) -> bool:
        """Between messages: nothing held back, nothing being passed on."""
        return self._scanner.at_boundary and not self.terminated


def _executes(data: bytes, start: int, end: int) -> int:
    """Execute messages among the whole messages of data[start:end]."""
    count = 0
    pos = start
    while pos + 5 <= end:
        if data[pos] == EXECUTE:
            count += 1
        pos += 1 + int.from_bytes(data[pos + 1 : pos + 5], "big")
    return count


def _executes_left(data: bytes, batch_at: int, open_before: bool, carried: int) -> int:
    """The Execute messages of the batch a chunk (at a message boundary) leaves open."""
    if batch_at >= 0:
        return _executes(data, batch_at, len(data))
    before = carried if open_before else 0
    return -1 if before < 0 else before + _executes(data, 0, len(data))


def _execute_follows(data: bytes, pos: int) -> bool:
    """Whether an Execute comes at pos or after it in data, before a Bind, Sync or Query."""
    while pos + 5 <= len(data):
        msg_type = data[pos]
        if msg_type == EXECUTE:
            return True
        if msg_type in BATCH_TURN_TYPES:
            return False
        pos += 1 + int.from_bytes(data[pos + 1 : pos + 5], "big")
    return False
