"""Find message boundaries in received bytes without copying what we only forward."""

from __future__ import annotations

from struct import Struct
from typing import Final

from mypy_extensions import i64

from ..errors import ProtocolViolation
from .msgtypes import READY_FOR_QUERY

_HEADER = Struct("!cI")
_UINT32 = Struct("!I")
#: A scanner between messages holds this (shared): its own bytearray only once a message
#: is cut across chunks, so thousands of idle connections hold no empty buffer each. That
#: bytearray is never empty, so ``_buf is not _NO_BYTES`` says a message is begun (compiled,
#: a pointer comparison where a truth test of bytes or bytearray is a generic call).
_NO_BYTES: Final = b""

#: (message type, message body, offset in the fed chunk just past the message)
Event = tuple[int, bytes, int]
#: Sets of message types as 256-byte tables (1 at each type in the set), shared by every
#: scanner of the same set: feed looks a type up by indexing, which the compiled build does
#: without a call (a frozenset lookup is a hash and a call).
_TABLES: dict[frozenset[int], bytes] = {}


_NO_TYPES: frozenset[int] = frozenset()
#: Shared scanners (shared_scanner), by what they watch; few combinations occur.
_SHARED: dict[tuple[frozenset[int], int, frozenset[int] | None, int], MessageScanner] = {}
#: No message is too long to buffer (stream_over's default).
NEVER_STREAM: Final = 2**32
#: How much of the body of a message too long to hold its owner reads (at most): the names
#: of a Bind or Parse, the start of a text, the first fields of an ErrorResponse.
HEAD_SIZE: Final = 8192


class _LastLent:
    """The shared scanner asked for last, and its arguments: at a welcome the relay asks
    for the same one as the welcome before, where the lookup by a tuple of them boxes two
    ints and hashes the tuple."""

    __slots__ = ("bodies", "max_size", "scanner", "stream_over", "watch")

    def __init__(self) -> None:
        self.watch: frozenset[int] | None = None
        self.bodies: frozenset[int] | None = None
        self.max_size = -1
        self.stream_over = -1
        self.scanner: MessageScanner | None = None


_LAST_LENT: Final = _LastLent()


def shared_scanner(
    watch: frozenset[int],
    max_size: int = 2**31 - 1,
    bodies: frozenset[int] | None = None,
    stream_over: int = NEVER_STREAM,
) -> MessageScanner:
    """The scanner lent to every owner with these arguments (see MessageScanner.kept)."""
    last = _LAST_LENT
    scanner = last.scanner
    if (
        scanner is not None
        and watch is last.watch
        and bodies is last.bodies
        and max_size == last.max_size
        and stream_over == last.stream_over
    ):
        return scanner
    key = (watch, max_size, bodies, stream_over)
    scanner = _SHARED.get(key)
    if scanner is None:
        scanner = _SHARED[key] = MessageScanner(watch, max_size, bodies, stream_over=stream_over)
        scanner.home = scanner
    last.watch, last.bodies, last.scanner = watch, bodies, scanner
    last.max_size, last.stream_over = max_size, stream_over
    return scanner


def _types(table: bytes) -> frozenset[int]:
    return frozenset(code for code in range(256) if table[code])


def _table(types: frozenset[int]) -> bytes:
    table = _TABLES.get(types)
    if table is None:
        table = _TABLES[types] = bytes(1 if code in types else 0 for code in range(256))
    return table


class MessageScanner:
    """Walks typed messages (1-byte type + 4-byte length) across arbitrary chunk boundaries.

    Only message types in ``watch`` are reported, with their whole body (or ``b""`` for types
    not in ``bodies``, when given: counting messages then costs no copy); every other message
    is skipped by length, so a large DataRow or CopyData is never buffered. The caller forwards
    the chunk it fed (or slices of it, using the offsets in the events).

    A watched message declaring more than ``stream_over`` bytes that a chunk does not hold
    whole is not buffered either: feed stops at it, as if the chunk ended there, and says
    where it begins (``big_at``); its owner takes it from there in pieces (proto.streaming).
    With ``heads``, such a message is reported instead at its end with the first HEAD_SIZE
    bytes of its body only, the rest skipped (an owner that passes every chunk on as it is
    and reads only the first fields of a message: a server's ErrorResponse).
    """

    __slots__ = (
        "_bodies",
        "_buf",
        "_heads",
        "_owed_head",
        "_owed_type",
        "_skip",
        "_stop",
        "_watch",
        "big_at",
        "big_start",
        "error_at",
        "held",
        "home",
        "max_size",
        "released",
        "stream_over",
    )

    def __init__(
        self,
        watch: frozenset[int],
        max_size: int = 2**31 - 1,
        bodies: frozenset[int] | None = None,
        stop: frozenset[int] = frozenset(),
        stream_over: int = NEVER_STREAM,
        heads: bool = False,
    ) -> None:
        # The sets are kept as their shared tables only (thousands of idle scanners).
        self._watch = _table(watch)
        self._bodies = _table(watch if bodies is None else bodies)
        #: Watched types after which a feed stops scanning (a Terminate: what follows it is
        #: never read, so a bad length there must not fail the feed). Feed nothing more then.
        self._stop = _table(stop)
        self.max_size = max_size
        self.stream_over = stream_over
        self._heads = heads
        #: heads: the message being skipped, to report at its end with its head (0: none).
        self._owed_type = 0
        self._owed_head = b""
        self._skip = 0
        self._buf: bytes | bytearray = _NO_BYTES
        #: After feed: how many bytes at the end of the chunk belong to a watched message
        #: not yet complete (a caller that rewrites messages holds them back).
        self.held = 0
        #: After feed: bytes held back earlier (a header) that turned out to start a message
        #: that is not watched: a caller that holds bytes back sends them before the chunk.
        self.released = b""
        #: After a bad length: where its header starts in the chunk fed (everything before
        #: it is whole messages, or the rest of one begun earlier), or -1 when that header
        #: began in an earlier chunk.
        self.error_at = -1
        #: After feed: where a watched message longer than stream_over begins in the chunk
        #: fed (-1: none), its first bytes held from an earlier chunk being big_start; the
        #: events and held are those of the chunk up to there, and the scanner is at a
        #: boundary, as if the message had never come (its owner passes it on in pieces).
        self.big_at = -1
        self.big_start = b""
        #: A scanner shared by many owners (shared_scanner): itself; one that took a shared
        #: one's state (kept): that shared one; None: its owner's alone.
        self.home: MessageScanner | None = None

    def kept(self) -> MessageScanner:
        """The scanner to keep after a chunk, for one lent from a shared scanner: the shared
        one while at a message boundary (its state is then a new scanner's, the same for
        every owner), or one of its own while a message is cut across chunks, the state
        moved there and the shared one left new. A scanner of its owner alone: itself.

        Thousands of idle connections then hold no scanner each. An owner must call this
        after every feed on a lent scanner, whatever the feed raised, before any other
        owner feeds it."""
        home = self.home
        if home is None:
            return self
        if not self._skip and self._buf is _NO_BYTES:  # at a boundary: nothing of its own
            return home
        if home is not self:
            return self
        own = MessageScanner(_NO_TYPES)
        own._watch, own._bodies, own._stop = self._watch, self._bodies, self._stop
        own.max_size, own.stream_over = self.max_size, self.stream_over
        own._heads, own._owed_type, own._owed_head = self._heads, self._owed_type, self._owed_head
        own._skip, own._buf, own.held = self._skip, self._buf, self.held
        own.released, own.error_at, own.home = self.released, self.error_at, self
        self._skip, self._buf, self.held, self.released, self.error_at = 0, _NO_BYTES, 0, b"", -1
        return own

    def to_boundary(self, data: bytes) -> int:
        """How many bytes at the start of data end the message begun in an earlier chunk,
        before feeding data: 0 when none was begun, -1 when data does not end it (or its
        length is bad, which feed reports)."""
        if self._skip:
            return self._skip if self._skip <= len(data) else -1
        buf = self._buf
        if not buf:
            return 0
        head = bytes(buf[:5]) + data[: max(0, 5 - len(buf))]
        if len(head) < 5:
            return -1
        length: int = _UINT32.unpack_from(head, 1)[0]
        if length < 4 or length > self.max_size:
            return -1
        rest = 1 + length - len(buf)
        return rest if rest <= len(data) else -1

    def rewatch(self, watch: frozenset[int]) -> None:
        """Report these types from now on, each with its body (a scanner of its owner alone:
        a message under way is finished as it began)."""
        self._watch = self._bodies = _table(watch)

    def watches(self, msg_type: int) -> bool:
        """Whether msg_type is reported."""
        return self._watch[msg_type] != 0

    @property
    def watch(self) -> frozenset[int]:
        """The message types reported."""
        return _types(self._watch)

    @property
    def bodies(self) -> frozenset[int]:
        """The reported types whose bodies come with them."""
        return _types(self._bodies)

    @property
    def at_boundary(self) -> bool:
        """True when no message is partly received."""
        return self._skip == 0 and not self._buf

    @property
    def buffered(self) -> int:
        """Bytes of a watched message (or of a header) begun but not complete."""
        return len(self._buf)

    # The two common chunks, recognised without making events: compiled, a scan by hand
    # costs less than feed's list, tuples and body slices. Each answers True only where feed
    # would return exactly that message and leave the scanner at a boundary, as feed does.

    def one_whole(self, data: bytes, msg_type: int) -> bool:
        """Whether data is one whole message of msg_type (a watched type), begun at a message
        boundary: feed would return it alone."""
        n: i64 = len(data)
        if n < 5 or data[0] != msg_type or self._skip or self._buf is not _NO_BYTES:
            return False
        high: i64 = data[1]  # (as in feed)
        upper: i64 = data[2]
        lower: i64 = data[3]
        low: i64 = data[4]
        length = high << 24 | upper << 16 | lower << 8 | low
        if length != n - 1 or length > self.max_size or not self._watch[msg_type]:
            return False
        self.held = 0
        self.released = b""
        return True

    def ends_at_ready(self, data: bytes) -> bool:
        """Whether data is whole messages none of which is watched, then a ReadyForQuery (a
        watched type), begun at a message boundary: feed would return that ReadyForQuery
        alone, as the last six bytes of data (a server's usual reply)."""
        n: i64 = len(data)
        last = n - 6  # where the ReadyForQuery starts
        if last < 0 or data[last] != READY_FOR_QUERY or self._skip or self._buf is not _NO_BYTES:
            return False
        if data[last + 1] or data[last + 2] or data[last + 3] or data[last + 4] != 5:
            return False
        watch = self._watch
        if not watch[READY_FOR_QUERY]:
            return False
        max_size: i64 = self.max_size
        pos: i64 = 0
        while pos < last:
            if last - pos < 5:
                return False
            high: i64 = data[pos + 1]  # (as in feed)
            upper: i64 = data[pos + 2]
            lower: i64 = data[pos + 3]
            low: i64 = data[pos + 4]
            length = high << 24 | upper << 16 | lower << 8 | low
            if length < 4 or length > max_size or watch[data[pos]]:
                return False
            pos += 1 + length
        if pos != last:
            return False
        self.held = 0
        self.released = b""
        return True

    def _check_length(self, msg_type: int, length: int, at: int = -1) -> None:
        if length < 4 or length > self.max_size:
            self.error_at = at
            raise ProtocolViolation(
                f"invalid message length {length} for message type {chr(msg_type)!r}"
            )

    def feed(self, data: bytes) -> list[Event]:
        """Scan one received chunk; return the watched messages completed in it."""
        events: list[Event] = []
        n: i64 = len(data)
        pos: i64 = 0
        self.held = 0
        self.released = b""
        if self.big_at >= 0:
            self.big_at = -1
            self.big_start = b""
        if self._skip:
            if self._skip > n:
                self._skip -= n
                return events
            pos = self._skip
            self._skip = 0
            if self._owed_type:  # (heads: a long message skipped, reported at its end)
                events.append((self._owed_type, self._owed_head, pos))
                self._owed_type = 0
                self._owed_head = b""
        if self._buf:
            first = pos
            pos = self._resume(data, pos, events)
            if self.big_at >= 0:  # (a large message's header, held: the rest streams)
                return events
            if pos < 0:
                if self._buf:
                    self.held = n - first
                return events
            if events and self._stop[events[0][0]]:
                return events
        watch = self._watch
        bodies = self._bodies
        stop = self._stop
        max_size: i64 = self.max_size
        while pos < n:
            if n - pos < 5:
                self._buf = bytearray(data[pos:])
                self.held = n - pos
                break
            msg_type = data[pos]
            # By hand: compiled, four byte reads and shifts cost less than a call to unpack.
            # The bytes are annotated i64, not converted: the shifts are then C arithmetic,
            # and pure Python makes no call.
            high: i64 = data[pos + 1]
            upper: i64 = data[pos + 2]
            lower: i64 = data[pos + 3]
            low: i64 = data[pos + 4]
            length = high << 24 | upper << 16 | lower << 8 | low
            if length < 4 or length > max_size:
                # Keep the bad header: every later feed fails on it again (via _resume) and
                # nothing more is buffered, whatever the caller does after the error.
                self._buf = bytearray(data[pos : pos + 5])
                self._check_length(msg_type, length, pos)
            end = pos + 1 + length
            if watch[msg_type]:
                if end > n:
                    if length > self.stream_over:
                        if not self._heads:  # its owner takes it in pieces
                            self.big_at = pos
                            break
                        if n - pos >= 5 + HEAD_SIZE:  # its head is here: the rest skipped
                            self._owed_type = msg_type
                            self._owed_head = data[pos + 5 : pos + 5 + HEAD_SIZE]
                            self._skip = end - n
                            break
                    self._buf = bytearray(data[pos:])
                    self.held = n - pos
                    break
                events.append((msg_type, data[pos + 5 : end] if bodies[msg_type] else b"", end))
                if stop[msg_type]:
                    break
            elif end > n:
                self._skip = end - n
                break
            pos = end
        return events

    def _resume(self, data: bytes, pos: int, events: list[Event]) -> int:
        """Complete a message whose start was buffered; return the next position or -1."""
        buf = self._buf
        assert isinstance(buf, bytearray)  # (only called with a message begun)
        n = len(data)
        prior = len(buf)  # bytes of this message from earlier chunks
        if len(buf) < 5:
            take = min(5 - len(buf), n - pos)
            buf += data[pos : pos + take]
            pos += take
            if len(buf) < 5:
                return -1
        msg_type = buf[0]
        length: int = _UINT32.unpack_from(buf, 1)[0]
        self._check_length(msg_type, length)
        total = 1 + length
        if length > self.stream_over and self._watch[msg_type] and total - len(buf) > n - pos:
            if self._heads:
                return self._resume_head(data, pos, events, msg_type, total)
            # a large message whose header came cut: its owner takes it in pieces
            self.big_start = bytes(buf[:prior])
            self.big_at = pos - (len(buf) - prior)
            self._buf = _NO_BYTES
            return -1
        if not self._watch[msg_type]:
            self.released = bytes(buf[:prior])
            self._buf = _NO_BYTES
            remaining = total - 5
            if remaining > n - pos:
                self._skip = remaining - (n - pos)
                return -1
            return pos + remaining
        need = total - len(buf)
        if need > n - pos:
            buf += data[pos:]
            return -1
        buf += data[pos : pos + need]
        pos += need
        events.append((msg_type, bytes(buf[5:]) if self._bodies[msg_type] else b"", pos))
        self._buf = _NO_BYTES
        return pos

    def _resume_head(
        self, data: bytes, pos: int, events: list[Event], msg_type: int, total: int
    ) -> int:
        """heads: a long message begun in an earlier chunk, its head gathered (at most), then
        the rest skipped; the next position or -1 (as _resume)."""
        buf = self._buf
        assert isinstance(buf, bytearray)
        n = len(data)
        take = min(5 + HEAD_SIZE - len(buf), n - pos)
        buf += data[pos : pos + take]
        pos += take
        if len(buf) < 5 + HEAD_SIZE:
            return -1
        head = bytes(buf[5:])
        self._buf = _NO_BYTES
        remaining = total - len(buf)
        if remaining > n - pos:
            self._skip = remaining - (n - pos)
            self._owed_type = msg_type
            self._owed_head = head
            return -1
        events.append((msg_type, head, pos + remaining))
        return pos + remaining


class StartupReader:
    """Collects the untyped startup-phase packet (length + body) across chunks."""

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = 10000) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of a packet begun but not complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> tuple[bytes | None, bytes]:
        """Return (packet body or None when incomplete, bytes left over after the packet)."""
        if not self._buf and len(data) >= 8:
            # a whole packet in one chunk, as a client sends it: sliced, not gathered
            length = _UINT32.unpack_from(data, 0)[0]
            if 8 <= length <= self.max_size and len(data) >= length:
                return data[4:length], data[length:]
        self._buf += data
        if len(self._buf) < 4:
            return None, b""
        length = _UINT32.unpack_from(self._buf, 0)[0]
        if length < 8 or length > self.max_size:
            del self._buf[4:]  # keep only the bad length: later feeds fail again, bounded
            raise ProtocolViolation(f"invalid startup packet length {length}")
        if len(self._buf) < length:
            return None, b""
        body = bytes(self._buf[4:length])
        rest = bytes(self._buf[length:])
        self._buf = bytearray()
        return body, rest


def split_messages(data: bytes) -> list[tuple[int, bytes]]:
    """Split bytes holding only whole typed messages (used for messages we built ourselves)."""
    out = []
    pos = 0
    while pos < len(data):
        msg_type, length = _HEADER.unpack_from(data, pos)
        out.append((msg_type[0], data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out
