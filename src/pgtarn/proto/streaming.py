"""One large message taken in pieces as it arrives: its head gathered, then the rest passed on.

A message longer than what a connection may hold (client_message_buffer) is never held
whole: MessageScanner stops at its header (big_at), and a MessageStream takes it from
there. It gathers the message's head (its header and the first bytes of its body, enough
for the names and the start of a text that decisions read), then hands out the rest chunk
by chunk, each piece a slice of what was fed; it says where the message ends in the chunk
that ends it, the bytes after that being the next messages'. Bytes in, pieces out: the
owner decides what to send where, and stops reading its socket while it cannot send.
"""

from __future__ import annotations

from ..errors import ProtocolViolation
from .framing import HEAD_SIZE

__all__ = ["HEAD_SIZE", "MessageStream"]


class MessageStream:
    """A message declared longer than its owner may hold, in pieces (see the module)."""

    __slots__ = ("_head", "_want", "head_ready", "left", "length", "msg_type")

    def __init__(self, header: bytes, max_size: int, head_size: int = HEAD_SIZE) -> None:
        """header: at least the message's first 5 bytes (type and length)."""
        if len(header) < 5:
            raise ValueError("a message header is 5 bytes")
        self.msg_type = header[0]
        #: The declared length (the length field, itself included).
        self.length = int.from_bytes(header[1:5], "big")
        if self.length < 4 or self.length > max_size:
            raise ProtocolViolation(
                f"invalid message length {self.length} for message type {chr(self.msg_type)!r}"
            )
        #: Bytes of the message not yet fed.
        self.left = 1 + self.length
        #: The head is gathered (head() may be read).
        self.head_ready = False
        self._head = bytearray()
        self._want = min(5 + head_size, 1 + self.length)

    @property
    def body_size(self) -> int:
        """The declared length of the body (without type and length)."""
        return self.length - 4

    @property
    def done(self) -> bool:
        """Every byte of the message was fed."""
        return self.left == 0

    def head(self) -> bytes:
        """The message's first bytes: header and up to head_size bytes of body."""
        return bytes(self._head)

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """Take the bytes of data that belong to the message: returns (the piece to pass on
        now, how many bytes of data were the message's). While the head is gathered nothing
        is passed on (the piece is b"") and it is then read with head(); the piece that
        completes it does not hold it. The bytes of data past the count are the next
        messages'."""
        take = min(self.left, len(data))
        if take <= 0:
            return b"", 0
        self.left -= take
        if not self.head_ready:
            need = self._want - len(self._head)
            if take <= need:
                self._head += data[:take]
                self.head_ready = len(self._head) == self._want
                return b"", take
            self._head += data[:need]
            self.head_ready = True
            return data[need:take], take
        return (data if take == len(data) else data[:take]), take
