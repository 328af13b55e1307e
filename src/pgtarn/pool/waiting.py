"""The clients of a pool waiting for a server: first come first served, with when each began.

Under load (more clients than servers) every transaction queues its client here and takes
the first one out when a server comes back. A deque and a dict of start times by id() did
that with three generic method calls and two ints made per transaction when compiled; here
it is two lists read and written by index. Popped slots hold None (no client is kept alive
by the queue); the storage is kept while the queue empties and refills, and the taken front
is cut off once it is half of the storage, so its size stays bounded by the longest queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Generic, TypeVar

W = TypeVar("W")

#: The taken front is cut off once it is this long and half of the storage (amortised O(1)).
_COMPACT_AT: Final = 32


class WaitQueue(Generic[W]):
    """Waiting clients, oldest first, each with the monotonic time it began to wait."""

    __slots__ = ("head", "tail", "times", "waiters")

    def __init__(self) -> None:
        #: waiters[head:tail] wait, times[head:tail] when each began; other slots: None, 0.0.
        self.waiters: list[W | None] = []
        self.times: list[float] = []
        self.head = 0
        self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def __bool__(self) -> bool:
        return self.tail > self.head

    def __iter__(self) -> Iterator[W]:
        return iter([waiter for waiter, _since in self.items()])

    def __contains__(self, waiter: object) -> bool:
        return self._index(waiter) >= 0

    def __repr__(self) -> str:
        return f"WaitQueue({self.items()!r})"

    def append(self, waiter: W, since: float) -> None:
        """waiter waits from since on, after everyone here."""
        tail = self.tail
        if tail < len(self.waiters):
            self.waiters[tail] = waiter
            self.times[tail] = since
        else:
            self.waiters.append(waiter)
            self.times.append(since)
        self.tail = tail + 1

    def first_since(self) -> float:
        """When the first waiter began to wait (the queue must not be empty)."""
        return self.times[self.head]

    def popleft(self) -> W:
        """The first waiter, taken out (IndexError when none waits)."""
        head = self.head
        if head >= self.tail:
            raise IndexError("pop from an empty WaitQueue")
        waiter = self.waiters[head]
        assert waiter is not None
        self.waiters[head] = None
        head += 1
        if head == self.tail:  # empty: start again at the front, storage kept
            self.head = self.tail = 0
        elif head >= _COMPACT_AT and 2 * head >= len(self.waiters):
            del self.waiters[:head]
            del self.times[:head]
            self.tail -= head
            self.head = 0
        else:
            self.head = head
        return waiter

    def remove(self, waiter: W) -> None:
        """Take waiter out, wherever it is; ValueError if it does not wait here."""
        index = self._index(waiter)
        if index < 0:
            raise ValueError("not waiting")
        del self.waiters[index]
        del self.times[index]
        self.tail -= 1
        if self.head == self.tail:
            self.head = self.tail = 0

    def since(self, waiter: W) -> float | None:
        """When waiter began to wait; None if it does not wait here."""
        index = self._index(waiter)
        return self.times[index] if index >= 0 else None

    def items(self) -> list[tuple[W, float]]:
        """(waiter, since) for everyone waiting, oldest first."""
        out: list[tuple[W, float]] = []
        for index in range(self.head, self.tail):
            waiter = self.waiters[index]
            assert waiter is not None
            out.append((waiter, self.times[index]))
        return out

    def take_waiting_since(self, since: float) -> list[W]:
        """Take out, in order, every waiter that began to wait at or before since."""
        taken: list[W] = []
        kept: list[tuple[W, float]] = []
        for waiter, began in self.items():
            if began <= since:
                taken.append(waiter)
            else:
                kept.append((waiter, began))
        if taken:
            self.waiters, self.times = [w for w, _ in kept], [t for _, t in kept]
            self.head, self.tail = 0, len(kept)
        return taken

    def _index(self, waiter: object) -> int:
        waiters = self.waiters
        for index in range(self.head, self.tail):
            if waiters[index] is waiter:
                return index
        return -1
