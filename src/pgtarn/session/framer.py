"""ClientFramer: split a client's stream so that statement messages come out whole."""

from __future__ import annotations

from struct import Struct

from . import sqlnames

_I = Struct("!I")

#: A Sync or Query passed: one ReadyForQuery to come (an item of a ClientFramer part list).
SYNC_MARK = 0
_REWRITTEN = frozenset(b"PBDC")
_SYNCS = frozenset(b"SQ")
Part = bytes | tuple[int, bytes] | int


class ClientFramer:
    """Splits a client's stream for statement rewriting, holding back only what it must.

    Parse, Bind, Describe and Close come out whole as (type, body), even when split across
    chunks (their bytes are held until complete); so does a Query that may name SQL-level
    prepared statements (a Query is held until complete). Every other message is passed on
    as raw bytes as it arrives, so a large CopyData is never buffered. Each raw Sync and
    Query is followed by SYNC_MARK. ``terminated`` is set at a Terminate, which is not
    passed on.
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

                # Keep just the bad header: later feeds fail on it again, holding nothing more.
                self._held[:] = data[pos : pos + 5]
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
            if msg_type == 0x51:  # Query: held until complete, a tuple if it may name statements
                if end > n:
                    break
                if sqlnames.may_name_statements(data[pos + 5 : end]):
                    if pos > start:
                        parts.append(data[start:pos])
                    parts.append((msg_type, data[pos + 5 : end]))
                    syncs += 1
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
