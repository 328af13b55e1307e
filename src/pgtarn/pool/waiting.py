"""The clients of a pool waiting for a server: first come first served, with when each began.

Under load (more clients than servers) every transaction queues its client here and takes
the first one out when a server comes back, so the queue is a ring of two lists side by
side (the clients and their times), read and written by index with machine ints when
compiled: no list grows or shrinks while its length stays under the longest it has been,
and nothing is shifted. The storage doubles when the ring is full and is kept after.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Generic, TypeVar

from mypy_extensions import i64

W = TypeVar("W")

#: The ring's first size; it doubles when full.
_FIRST_SIZE: Final = 8


class WaitQueue(Generic[W]):
    """Waiting clients, oldest first, each with the monotonic time it began to wait."""

    __slots__ = ("count", "head", "times", "waiters")

    def __init__(self) -> None:
        #: The ring: the i-th waiter from the front is waiters[(head + i) % size] and began
        #: to wait at times[(head + i) % size]; the other slots hold None and 0.0.
        self.waiters: list[W | None] = []
        self.times: list[float] = []
        self.head: i64 = 0
        #: How many wait (read directly on the hot path: a method call costs more).
        self.count: i64 = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[W]:
        return iter([waiter for waiter, _since in self.items()])

    def __contains__(self, waiter: object) -> bool:
        return self._index(waiter) >= 0

    def __repr__(self) -> str:
        return f"WaitQueue({self.items()!r})"

    def _slot(self, index: i64) -> i64:
        """The slot of the index-th waiter from the front."""
        at = self.head + index
        size: i64 = len(self.waiters)
        return at - size if at >= size else at

    def _index(self, waiter: object) -> i64:
        """Where waiter is from the front (by identity), or -1."""
        waiters = self.waiters
        index: i64 = 0
        while index < self.count:
            if waiters[self._slot(index)] is waiter:
                return index
            index += 1
        return -1

    def append(self, waiter: W, since: float) -> None:
        """waiter waits from since on, after everyone here."""
        size: i64 = len(self.waiters)
        if self.count == size:
            self._grow(size)
        at = self._slot(self.count)
        self.waiters[at] = waiter
        self.times[at] = since
        self.count += 1

    def _grow(self, size: i64) -> None:
        """The ring is full: twice the storage, the waiters from its front on."""
        items = self.items()
        new_size = size * 2 if size else _FIRST_SIZE
        self.waiters = [waiter for waiter, _since in items] + [None] * (new_size - size)
        self.times = [since for _waiter, since in items] + [0.0] * (new_size - size)
        self.head = 0

    def first_since(self) -> float:
        """When the first waiter began to wait (IndexError when none waits)."""
        if not self.count:
            raise IndexError("nobody waits")
        return self.times[self.head]

    def popleft(self) -> W:
        """The first waiter, taken out (IndexError when none waits)."""
        if not self.count:
            raise IndexError("pop from an empty WaitQueue")
        head = self.head
        waiters = self.waiters
        waiter = waiters[head]
        assert waiter is not None
        waiters[head] = None
        self.count -= 1
        head += 1
        if head == len(waiters) or not self.count:  # (statements: an int and an i64 in one
            head = 0  # expression would go through a Python int)
        self.head = head
        return waiter

    def remove(self, waiter: W) -> None:
        """Take waiter out, wherever it is; ValueError if it does not wait here."""
        index = self._index(waiter)
        if index < 0:
            raise ValueError("not waiting")
        self._keep([(w, since) for i, (w, since) in enumerate(self.items()) if i != index])

    def since(self, waiter: W) -> float | None:
        """When waiter began to wait; None if it does not wait here."""
        index = self._index(waiter)
        return self.times[self._slot(index)] if index >= 0 else None

    def items(self) -> list[tuple[W, float]]:
        """(waiter, since) for everyone waiting, oldest first."""
        items: list[tuple[W, float]] = []
        index: i64 = 0
        while index < self.count:
            at = self._slot(index)
            waiter = self.waiters[at]
            assert waiter is not None
            items.append((waiter, self.times[at]))
            index += 1
        return items

    def take_waiting_since(self, since: float) -> list[W]:
        """Take out, in order, every waiter that began to wait at or before since."""
        items = self.items()
        taken = [waiter for waiter, began in items if began <= since]
        if taken:
            self._keep([(waiter, began) for waiter, began in items if began > since])
        return taken

    def _keep(self, items: list[tuple[W, float]]) -> None:
        """items, oldest first, are the waiters from now on (the storage kept)."""
        size = len(self.waiters)
        self.waiters = [waiter for waiter, _since in items] + [None] * (size - len(items))
        self.times = [since for _waiter, since in items] + [0.0] * (size - len(items))
        self.head = 0
        self.count = len(items)
