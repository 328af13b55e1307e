"""Fifo: a first-in first-out queue that the compiled hot path reads by index.

A server's ServerStatements queues one entry per reply it is owed (a Sync's ReadyForQuery
for every simple query) and takes it when the reply comes. Compiled, a deque's append,
popleft and [0] are generic Python calls; here they are list reads and writes. Taken slots
hold None (nothing is kept alive by the queue); the storage is kept while the queue empties
and refills, and the taken front is cut off once it is half of the storage, so that its size
stays bounded by the longest the queue has been.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Generic, TypeVar

T = TypeVar("T")

#: The taken front is cut off once it is this long and half of the storage (amortised O(1)).
_COMPACT_AT: Final = 32


class Fifo(Generic[T]):
    """Items, oldest first: ``append`` at the back, ``popleft`` and ``[0]`` at the front."""

    __slots__ = ("head", "slots", "tail")

    def __init__(self) -> None:
        #: slots[head:tail] are the items; the others are None.
        self.slots: list[T | None] = []
        self.head = 0
        self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def __bool__(self) -> bool:
        return self.tail > self.head

    def __getitem__(self, index: int) -> T:
        """The item at index from the front (0: the oldest); IndexError past the back."""
        at = self.head + index
        if index < 0 or at >= self.tail:
            raise IndexError("Fifo index out of range")
        item = self.slots[at]
        assert item is not None
        return item

    def __iter__(self) -> Iterator[T]:
        return iter([self[index] for index in range(len(self))])

    def __repr__(self) -> str:
        return f"Fifo({list(self)!r})"

    def index(self, item: object) -> int:
        """Where item is from the front (by identity), or -1."""
        slots = self.slots
        for at in range(self.head, self.tail):
            if slots[at] is item:
                return at - self.head
        return -1

    def delete(self, index: int) -> None:
        """Take out the item at index from the front (the ones behind it move up)."""
        at = self.head + index
        if index < 0 or at >= self.tail:
            raise IndexError("Fifo index out of range")
        del self.slots[at]
        self.tail -= 1
        if self.head == self.tail:
            self.head = self.tail = 0

    def append(self, item: T) -> None:
        tail = self.tail
        if tail < len(self.slots):
            self.slots[tail] = item
        else:
            self.slots.append(item)
        self.tail = tail + 1

    def popleft(self) -> T:
        """The oldest item, taken out (IndexError when empty)."""
        head = self.head
        if head >= self.tail:
            raise IndexError("pop from an empty Fifo")
        slots = self.slots
        item = slots[head]
        assert item is not None
        slots[head] = None
        head += 1
        if head == self.tail:  # empty: start again at the front, storage kept
            self.head = self.tail = 0
        elif head >= _COMPACT_AT and 2 * head >= len(slots):
            del slots[:head]
            self.tail -= head
            self.head = 0
        else:
            self.head = head
        return item
