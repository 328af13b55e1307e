"""How control messages between the supervisor and its workers are framed (sans-IO).

A message is a JSON object, sent as a 4-byte big-endian length and the UTF-8 text. Both ends
are pgtarn processes, often of different versions during a rolling restart, which is why the
format is JSON and not pickle or marshal: it is versionless and cannot run code. File
descriptors that travel with a message (SCM_RIGHTS) are counted by its ``fds`` key; the
reader hands them over in order.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Final

#: The largest message either side accepts (SHOW CLIENTS rows of every worker fit easily);
#: a longer length closes the channel, as a corrupt stream would.
MAX_MESSAGE: Final = 64 * 1024 * 1024

Message = dict[str, Any]


class WireError(Exception):
    """The stream is not a sequence of control messages."""


def encode(message: Message) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise WireError(f"control message of {len(body)} bytes is over {MAX_MESSAGE}")
    return len(body).to_bytes(4, "big") + body


class MessageReader:
    """Bytes and received file descriptors in, whole messages with their descriptors out."""

    __slots__ = ("buffer", "fds")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.fds: deque[int] = deque()

    def feed(
        self, data: bytes, fds: list[int] | tuple[int, ...] = ()
    ) -> list[tuple[Message, list[int]]]:
        """The messages completed by data; fds came with it and belong to the messages in
        order of their ``fds`` counts."""
        self.fds.extend(fds)
        buffer = self.buffer
        buffer += data
        out: list[tuple[Message, list[int]]] = []
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if size > MAX_MESSAGE:
                raise WireError(f"control message of {size} bytes is over {MAX_MESSAGE}")
            if len(buffer) < 4 + size:
                break
            try:
                message = json.loads(bytes(buffer[4 : 4 + size]))
            except ValueError as exc:
                raise WireError(f"control message is not JSON: {exc}") from None
            del buffer[: 4 + size]
            if not isinstance(message, dict):
                raise WireError("control message is not an object")
            count = message.get("fds", 0)
            if not isinstance(count, int) or count < 0 or count > len(self.fds):
                raise WireError(
                    f"control message names {count!r} descriptors, {len(self.fds)} came"
                )
            out.append((message, [self.fds.popleft() for _ in range(count)]))
        return out

    def close_pending(self, close: Any) -> None:
        """Close descriptors received for messages that never came (the channel ended)."""
        while self.fds:
            close(self.fds.popleft())
