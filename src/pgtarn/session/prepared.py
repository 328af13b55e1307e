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

#: The error PostgreSQL gives when a prepared statement's result type changed (ALTER TABLE).
RESULT_TYPE_CHANGED = b"cached plan must not change result type"

FORWARD = 0
DROP = 1
AS_PARSE_COMPLETE = 2


def _message(msg_type: bytes, body: bytes) -> bytes:
    return msg_type + _I.pack(len(body) + 4) + body


def _cstring(body: bytes, pos: int) -> tuple[bytes, int]:
    end = body.index(b"\x00", pos)
    return body[pos:end], end + 1


@dataclass(eq=False)
class Statement:
    """One distinct prepared statement, as every server knows it."""

    name: bytes
    parse: bytes  # the whole Parse message under the server-side name
    clients: int = 0  # how many client names refer to it


class StatementCache:
    """query text + parameter types -> Statement, shared by all clients of the pooler."""

    def __init__(self) -> None:
        self._by_key: dict[bytes, Statement] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_key)

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
        stmt.clients -= 1
        if stmt.clients <= 0:
            key = _key(stmt)
            if self._by_key.get(key) is stmt:
                del self._by_key[key]

    def renew(self, stmt: Statement) -> None:
        """The statement's plan went stale on some server: give it a new server-side name, so
        every server prepares it afresh on next use (the old ones age out of their LRU)."""
        key = _key(stmt)
        stmt.name = b"pgtarn_%d" % next(self._ids)
        stmt.parse = _message(b"P", stmt.name + b"\x00" + key)

    def retain(self, stmt: Statement) -> None:
        """A client name refers to stmt again (a redefinition was undone)."""
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


@dataclass
class _Entry:
    kind: int
    action: int = FORWARD
    stmt: Statement | None = None
    client: ClientStatements | None = None
    client_name: bytes = b""
    previous: Statement | None = None


# Entries with nothing to undo are shared (never changed once made).
_SYNC_ENTRY = _Entry(_SYNC)
_BIND_ENTRY = _Entry(_BIND)
_PARSE_ENTRY = _Entry(_PARSE)
_CLOSE_ENTRY = _Entry(_CLOSE)


class ServerStatements:
    """The statements one server has prepared, and the replies it still owes about them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.prepared: OrderedDict[bytes, Statement] = OrderedDict()
        self.expected: deque[_Entry] = deque()
        #: Counters for statistics: Parses sent to the server, Parses avoided.
        self.parses = 0
        self.reused = 0

    @property
    def idle(self) -> bool:
        """No reply about statements is owed (the server can change hands)."""
        return not self.expected

    # --- client -> server ---------------------------------------------------------------------

    def rewrite(self, client: ClientStatements, messages: Iterable[tuple[int, bytes]]) -> bytes:
        """What to send this server for complete client messages (type, body)."""
        out = bytearray()
        for msg_type, body in messages:
            if msg_type == 0x50:  # Parse
                self._parse(client, body, out)
            elif msg_type == 0x42:  # Bind: portal, statement, ...
                _portal, pos = _cstring(body, 0)
                name, end = _cstring(body, pos)
                stmt = client.names.get(name) if name else None
                if stmt is None:
                    out += _message(b"B", body)
                    self.expected.append(_BIND_ENTRY)
                else:
                    self._ensure(stmt, out)
                    out += _message(b"B", body[:pos] + stmt.name + body[end - 1 :])
                    self.expected.append(_Entry(_BIND, FORWARD, stmt))
            elif msg_type in (0x44, 0x43):  # Describe, Close: kind, name
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
                else:
                    # Other clients may use the statement: forget the name, keep the server's.
                    previous = client.names.get(name)
                    client.forget(name)
                    out += NOOP_CLOSE
                    self.expected.append(_Entry(_CLOSE, FORWARD, None, client, name, previous))
            else:
                out += _message(bytes((msg_type,)), body)
                if msg_type in (0x53, 0x51):  # Sync, Query: a ReadyForQuery to come
                    self.expected.append(_SYNC_ENTRY)
        return bytes(out)

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
            return chunk
        out = bytearray()
        for part in parts:
            if isinstance(part, int):
                self.expected.append(_SYNC_ENTRY)
            elif isinstance(part, tuple):
                out += self.rewrite(client, (part,))
            else:
                out += part
        return bytes(out)

    def _parse(self, client: ClientStatements, body: bytes, out: bytearray) -> None:
        name, pos = _cstring(body, 0)
        if not name:
            out += _message(b"P", body)
            self.expected.append(_PARSE_ENTRY)
            return
        stmt, previous = client.define(name, body[pos:])
        if self._has(stmt):
            out += NOOP_CLOSE
            self.expected.append(
                _Entry(_CLOSE, AS_PARSE_COMPLETE, stmt, client, name, previous))
        else:
            self._prepare(stmt, out, _Entry(_PARSE, FORWARD, stmt, client, name, previous))

    def _ensure(self, stmt: Statement, out: bytearray) -> None:
        """Prepare stmt on this server first if it lacks it; the client never sees that."""
        if not self._has(stmt):
            self._prepare(stmt, out, _Entry(_PARSE, DROP, stmt))

    def _has(self, stmt: Statement) -> bool:
        """Whether this server has stmt (then it becomes the most recently used)."""
        if stmt.name not in self.prepared:
            return False
        self.prepared.move_to_end(stmt.name)
        self.reused += 1
        return True

    def _prepare(self, stmt: Statement, out: bytearray, entry: _Entry) -> None:
        """Send stmt's Parse (after evicting the least recently used if full)."""
        self._evict(out)
        out += stmt.parse
        self.prepared[stmt.name] = stmt
        self.parses += 1
        self.expected.append(entry)

    def _evict(self, out: bytearray) -> None:
        while self.capacity and len(self.prepared) >= self.capacity:
            name, stmt = self.prepared.popitem(last=False)
            out += _message(b"C", b"S" + name + b"\x00")
            self.expected.append(_Entry(_CLOSE, DROP, stmt))

    # --- server -> client -----------------------------------------------------------------------

    def reply(self, msg_type: int) -> int:
        """A ParseComplete, CloseComplete or ReadyForQuery from the server: what to do with it.

        Returns FORWARD, DROP or AS_PARSE_COMPLETE (send a ParseComplete in its place).
        """
        if msg_type == 0x5A:
            self._ready()
            return FORWARD
        want = _PARSE if msg_type == 0x31 else _BIND if msg_type == 0x32 else _CLOSE
        expected = self.expected
        while expected and expected[0].kind != want and expected[0].kind != _SYNC:
            self._skipped(expected.popleft())  # cannot happen with a well-behaved server
        if not expected or expected[0].kind != want:
            return FORWARD
        return expected.popleft().action

    def error(self, body: bytes, cache: StatementCache) -> None:
        """An ErrorResponse: a Bind that failed because the statement's result type changed
        renews that statement, so that the next attempt prepares it again."""
        expected = self.expected
        if (expected and expected[0].kind == _BIND and expected[0].stmt is not None
                and b"C0A000\x00" in body and RESULT_TYPE_CHANGED in body):
            stmt = expected[0].stmt
            self.prepared.pop(stmt.name, None)
            cache.renew(stmt)

    def _ready(self) -> None:
        """ReadyForQuery: what was queued before its Sync and did not come never will."""
        expected = self.expected
        if expected and expected[0] is _SYNC_ENTRY:  # the common case: nothing skipped
            expected.popleft()
            return
        skipped = []
        while expected:
            entry = expected.popleft()
            if entry.kind == _SYNC:
                break
            skipped.append(entry)
        for entry in reversed(skipped):  # undone last first, like an undo log
            self._skipped(entry)

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
        self.expected.append(_SYNC_ENTRY)


#: A simple query that makes a server forget its prepared statements.
FORGETS_ALL = re.compile(rb"(?i)\b(?:discard\s+all|deallocate\s+(?:prepare\s+)?all)\b")


#: A Sync or Query passed: one ReadyForQuery to come (an item of a ClientFramer part list).
SYNC_MARK = 0
_REWRITTEN = frozenset(b"PBDC")
_SYNCS = frozenset(b"SQ")
Part = bytes | tuple[int, bytes] | int


class ClientFramer:
    """Splits a client's stream for statement rewriting, holding back only what it must.

    Parse, Bind, Describe and Close come out whole as (type, body), even when split across
    chunks (their bytes are held until complete); every other message is passed on as raw
    bytes as it arrives, so a large CopyData is never buffered. Each Sync and Query is
    followed by SYNC_MARK. ``terminated`` is set at a Terminate, which is not passed on.
    """

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        #: After feed: the parts are exactly the chunk's bytes (nothing held or released).
        self.whole = True
        self._held = bytearray()  # the start of a message not yet complete
        self._skip = 0  # bytes of a passed-on message still to come
        self._mark_after_skip = False
        self.terminated = False

    def feed(self, data: bytes) -> tuple[list[Part], int]:
        """Parts to send for a chunk, and how many ReadyForQuery they will bring."""
        parts: list[Part] = []
        syncs = 0
        pos = 0
        n = len(data)
        self.whole = True
        if self._skip:
            take = min(self._skip, n)
            parts.append(data[:take])
            self._skip -= take
            pos = take
            if self._skip == 0 and self._mark_after_skip:
                self._mark_after_skip = False
                parts.append(SYNC_MARK)
                syncs += 1
        if self._held and pos < n:
            self.whole = False
            data = bytes(self._held) + data[pos:]
            self._held.clear()
            n = len(data)
            pos = 0
        start = pos  # raw bytes from start to pos are passed on as one slice
        while pos < n and not self.terminated:
            if n - pos < 5:
                break
            msg_type = data[pos]
            length = _I.unpack_from(data, pos + 1)[0]
            if length < 4 or length > self.max_size:
                from ..errors import ProtocolViolation

                raise ProtocolViolation(
                    f"invalid message length {length} for message type {chr(msg_type)!r}")
            end = pos + 1 + length
            if msg_type in _REWRITTEN:
                if end > n:
                    break
                if pos > start:
                    parts.append(data[start:pos])
                parts.append((msg_type, data[pos + 5 : end]))
                start = pos = end
                continue
            if msg_type == 0x58:  # Terminate
                if pos > start:
                    parts.append(data[start:pos])
                self.terminated = True
                self.whole = False
                return parts, syncs
            if end > n:  # passed on as it comes
                self._skip = end - n
                self._mark_after_skip = msg_type in _SYNCS
                pos = n
                break
            pos = end
            if msg_type in _SYNCS:
                parts.append(data[start:pos])
                parts.append(SYNC_MARK)
                syncs += 1
                start = pos
        if pos > start:
            parts.append(data[start:pos])
        if pos < n:
            self.whole = False
            self._held += data[pos:]
            if len(self._held) > self.max_size + 5:
                from ..errors import ProtocolViolation

                raise ProtocolViolation("message too large")
        return parts, syncs

    @property
    def idle(self) -> bool:
        """Between messages: nothing held back, nothing being passed on."""
        return not self._held and not self._skip and not self.terminated

    @staticmethod
    def plain(parts: list[Part]) -> bool:
        """No message in parts needs the statement bookkeeping of a server."""
        return all(not isinstance(p, tuple) for p in parts)
