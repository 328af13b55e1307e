"""Blocking calls (PAM checks) on a few threads, a bounded number waiting; results on the loop.

The event loop never waits for one: submit hands the call to a thread and returns; its
result comes back through call_soon_threadsafe. At most `threads` calls run at once and at
most `queue_size` more wait for a thread; past that submit refuses, so that a slow PAM
stack (a server that does not answer, the delay after each failed password) makes new
logins fail at once instead of piling up without end. The threads are daemons: a call that
never returns does not keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class BlockingCalls:
    """A bounded pool of threads for calls that block (see the module docstring)."""

    __slots__ = ("_jobs", "_running", "name", "pending", "queue_size", "threads")

    def __init__(self, name: str, threads: int, queue_size: int) -> None:
        self.name = name
        self.threads = max(1, threads)
        self.queue_size = max(0, queue_size)
        #: Calls submitted whose result has not come back yet (running or waiting).
        self.pending = 0
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._running: list[threading.Thread] = []

    def full(self) -> bool:
        return self.pending >= self.threads + self.queue_size

    def submit(self, call: Callable[[], T], done: Callable[[T | Exception], None]) -> bool:
        """Run call on a thread, then done(its result, or the exception it raised) on this
        event loop; False (and nothing run) when as many calls as allowed are pending."""
        if self.full():
            return False
        loop = asyncio.get_running_loop()

        def job() -> None:
            outcome: T | Exception
            try:
                outcome = call()
            except Exception as exc:  # the caller decides what it means
                outcome = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: the process is ending
                loop.call_soon_threadsafe(self._finished, done, outcome)

        self.pending += 1
        if len(self._running) < min(self.threads, self.pending):
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"pgtarn-{self.name}-{len(self._running) + 1}")
            self._running.append(thread)
            thread.start()
        self._jobs.put(job)
        return True

    def _finished(self, done: Callable[[T | Exception], None], outcome: T | Exception) -> None:
        self.pending -= 1
        done(outcome)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def retire(self) -> None:
        """The threads end once the calls already submitted are done (a RELOAD changed the
        sizes: a new pool takes the new calls)."""
        for _thread in self._running:
            self._jobs.put(None)
