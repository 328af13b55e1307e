"""The clients of a pool waiting for a server: first come first served, with when each began.

Under load (more clients than servers) every transaction queues its client here and takes
the first one out when a server comes back. A deque and a dict of start times by id() did
that with three generic method calls and two ints made per transaction when compiled; here
it is two Fifos (session/fifo.py) side by side, read and written by index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from ..session.fifo import Fifo

W = TypeVar("W")


class WaitQueue(Generic[W]):
    """Waiting clients, oldest first, each with the monotonic time it began to wait."""

    __slots__ = ("times", "waiters")

    def __init__(self) -> None:
        #: waiters[i] began to wait at times[i].
        self.waiters: Fifo[W] = Fifo()
        self.times: Fifo[float] = Fifo()

    def __len__(self) -> int:
        return len(self.waiters)

    def __bool__(self) -> bool:
        return bool(self.waiters)

    def __iter__(self) -> Iterator[W]:
        return iter(self.waiters)

    def __contains__(self, waiter: object) -> bool:
        return self.waiters.index(waiter) >= 0

    def __repr__(self) -> str:
        return f"WaitQueue({self.items()!r})"

    def append(self, waiter: W, since: float) -> None:
        """waiter waits from since on, after everyone here."""
        self.waiters.append(waiter)
        self.times.append(since)

    def first_since(self) -> float:
        """When the first waiter began to wait (IndexError when none waits)."""
        return self.times[0]

    def popleft(self) -> W:
        """The first waiter, taken out (IndexError when none waits)."""
        self.times.popleft()
        return self.waiters.popleft()

    def remove(self, waiter: W) -> None:
        """Take waiter out, wherever it is; ValueError if it does not wait here."""
        index = self.waiters.index(waiter)
        if index < 0:
            raise ValueError("not waiting")
        self.waiters.delete(index)
        self.times.delete(index)

    def since(self, waiter: W) -> float | None:
        """When waiter began to wait; None if it does not wait here."""
        index = self.waiters.index(waiter)
        return self.times[index] if index >= 0 else None

    def items(self) -> list[tuple[W, float]]:
        """(waiter, since) for everyone waiting, oldest first."""
        return list(zip(self.waiters, self.times, strict=True))

    def take_waiting_since(self, since: float) -> list[W]:
        """Take out, in order, every waiter that began to wait at or before since."""
        items = self.items()
        taken = [waiter for waiter, began in items if began <= since]
        if taken:
            self.waiters, self.times = Fifo(), Fifo()
            for waiter, began in items:
                if began > since:
                    self.append(waiter, began)
        return taken
