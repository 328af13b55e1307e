"""LongReply: one reply too long to hold, of a server that keeps prepared statements.

Where prepared statements are kept (transaction mode), the relay holds back each message it
watches until it is whole, so that one can be dropped or replaced. A watched message longer
than client_message_buffer that a chunk does not hold whole (MessageScanner.big_at) is not
held: the relay makes a LongReply for it and hands it every byte until the message ends.

- an ErrorResponse or a DataRow (rows read while a tracked session's lock calls run): its
  head (header and HEAD_SIZE bytes of body, what the decision reads: severity, SQLSTATE,
  the start of the message, the first columns) is gathered, the relay decides from it
  whether the message goes on as it comes (its rest passed on piece by piece) or is
  dropped as it comes (replaced by pgtarn's own error, or a reply to pgtarn's own query);
- any other type (no reply PostgreSQL sends that long is read in part): gathered whole, as
  before (max_packet_size bounds it), then relayed as usual.

Bytes in, bytes out: the relay writes what feed returns, so a client that does not read
stops its server from being read (flow control), and nothing is held here but the head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ..proto.framing import HEAD_SIZE
from ..proto.msgtypes import LONG_REPLY_HEAD_TYPES

_UNDECIDED: Final = 0
_PASS: Final = 1  # passed on as it comes
_DROP: Final = 2  # dropped as it comes
_WHOLE: Final = 3  # gathered whole, then relayed as usual

#: The relay's decision on a head: (message type, the first HEAD_SIZE bytes of its body) ->
#: the bytes to send in its place, or None to pass the message on as it comes.
Decide = Callable[[int, bytes], bytes | None]


class LongReply:
    """A server's message too long to hold, on its way to the client (see the module)."""

    __slots__ = ("_decide", "_gathered", "_how", "left", "msg_type")

    def __init__(self, header: bytes, decide: Decide) -> None:
        """header: at least the message's first 5 bytes (its length already checked)."""
        self.msg_type = header[0]
        #: Bytes of the message not yet fed.
        self.left = 1 + int.from_bytes(header[1:5], "big")
        self._decide = decide
        self._how = _UNDECIDED if self.msg_type in LONG_REPLY_HEAD_TYPES else _WHOLE
        self._gathered = bytearray()

    @property
    def done(self) -> bool:
        """Every byte of the message was fed."""
        return self.left == 0

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Take what of data is the message's: returns (what to send the client now, the
        bytes to relay as usual once the message is done: what followed it in data, after
        the message itself when it was gathered whole)."""
        take = min(self.left, len(data))
        self.left -= take
        part = data if take == len(data) else data[:take]
        rest = b"" if self.left or take == len(data) else data[take:]
        how = self._how
        out = b""
        if how == _PASS:
            out = part
        elif how == _UNDECIDED:
            need = 5 + HEAD_SIZE - len(self._gathered)
            self._gathered += part[:need]
            if len(self._gathered) == 5 + HEAD_SIZE or not self.left:
                head = bytes(self._gathered)
                self._gathered = bytearray()
                replacement = self._decide(self.msg_type, head[5:])
                if replacement is None:
                    self._how = _PASS
                    out = head + part[need:] if need < len(part) else head
                else:
                    self._how = _DROP
                    out = replacement
        elif how == _WHOLE:
            self._gathered += part
            if not self.left:
                rest = bytes(self._gathered) + rest
                self._gathered = bytearray()
        return out, rest
