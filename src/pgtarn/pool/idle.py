"""The idle servers of a pool: a stack that keeps its storage when it empties.

A pool lends its most recently used idle server first (the top of the stack) and adds a
released one on top. A plain list would do the same, but CPython frees a list's storage when
its last item is popped and allocates it again at the next append (through the C library,
since a request of zero bytes bypasses Python's allocator), and a pool with fewer idle servers
than clients goes from one idle server to none and back once per transaction. Here the slots
stay, and a popped slot holds None.

It answers the list operations that the pool and SHOW commands use: append, pop (the top, or
any index), remove, membership, iteration from the bottom, len and truth.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

S = TypeVar("S")


class IdleServers(Generic[S]):
    """Idle servers, oldest first; ``pop()`` takes the newest."""

    __slots__ = ("count", "slots")

    def __init__(self) -> None:
        #: slots[:count] are the servers; the slots past count are None and kept.
        self.slots: list[S | None] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[S]:
        return iter(self._servers())

    def __contains__(self, server: object) -> bool:
        slots = self.slots
        return any(slots[index] is server for index in range(self.count))

    def __repr__(self) -> str:
        return f"IdleServers({self._servers()!r})"

    def append(self, server: S) -> None:
        count = self.count
        if count < len(self.slots):
            self.slots[count] = server
        else:
            self.slots.append(server)
        self.count = count + 1

    def pop(self, index: int = -1) -> S:
        """The server at index (the newest by default; 0 is the oldest), taken out."""
        count = self.count
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("pop from an empty or shorter IdleServers")
        slots = self.slots
        server = slots[index]
        assert server is not None
        if index < count - 1:  # (not the top: the ones above move down)
            del slots[index]
            slots.append(None)
        else:
            slots[index] = None
        self.count = count - 1
        return server

    def top(self) -> S | None:
        """The newest idle server, or None."""
        return self.slots[self.count - 1] if self.count else None

    def remove(self, server: S) -> None:
        """Take server out, wherever it is; ValueError if it is not here (as a list)."""
        slots = self.slots
        for index in range(self.count):
            if slots[index] is server:
                self.pop(index)
                return
        raise ValueError("server not idle")

    def _servers(self) -> list[S]:
        servers: list[S] = []
        slots = self.slots
        for index in range(self.count):
            server = slots[index]
            assert server is not None
            servers.append(server)
        return servers
