"""Threads for password checks that block (PAM, an LDAP bind), bounded: the loop never waits.

Each check runs in one of `threads` threads, started as checks come; at most `waiting` more
wait for one, and a check asked for beyond that is refused at once (PoolFull), so that
clients that send passwords faster than PAM or the LDAP server answers cannot pile up work
without end. A client has one password per login, so it holds one check at most. Its caller
may wait for the result a bounded time; a check that has not started by then is dropped, one
under way ends on its own (its own timeouts bound it) and its result is thrown away. The
threads are daemon threads: a check under way never holds up pgtarn's exit
(concurrent.futures' pool would wait for it).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["AuthPool", "PoolFull"]

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[[], Any]]


class PoolFull(Exception):
    """Every thread is busy and the waiting line is full."""


class AuthPool:
    """Threads that run blocking checks; see the module docstring."""

    def __init__(self, threads: int, waiting: int, name: str = "auth") -> None:
        self.threads = max(1, threads)
        self.waiting = max(0, waiting)
        self.limit = self.threads + self.waiting
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # pending is counted down in the threads too
        self._pending = 0
        self._closed = False
        self._started: list[threading.Thread] = []  # only the event loop's thread adds

    @property
    def pending(self) -> int:
        """Checks running or waiting for a thread."""
        return self._pending

    async def run(
        self,
        check: Callable[[], T],
        timeout: float | None,
        wanted: Callable[[], bool] = lambda: True,
    ) -> T | None:
        """check() in a thread; None when it did not end within timeout seconds (None: no
        limit but the check's own), or when wanted() (asked as it starts) says nobody waits
        for it any more. PoolFull when there is no room for it. An exception of check() is
        raised here."""
        with self._lock:
            if self._closed or self._pending >= self.limit:
                raise PoolFull
            self._pending += 1
            pending = self._pending
        if len(self._started) < min(self.threads, pending):
            thread = threading.Thread(
                target=self._work, daemon=True, name=f"pgtarn-{self.name}-{len(self._started)}"
            )
            self._started.append(thread)
            thread.start()
        future: Future[T | None] = Future()
        self._jobs.put((future, lambda: check() if wanted() else None))
        waited = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait((waited,), timeout=timeout)
        finally:
            # not started (nor cancelled already by close): it never will be
            if not future.done() and future.cancel():
                self._done()
        if not done:
            return None
        result: T | None = waited.result()
        return result

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, call = job
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited (and counted down then)
            # counted down before the caller can see the result, so that it sees the room
            try:
                result = call()
            except BaseException as exc:  # handed to the caller, as an executor would
                self._done()
                future.set_exception(exc)
            else:
                self._done()
                future.set_result(result)

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1

    def close(self) -> None:
        """No more checks (a RELOAD changed the sizes: a new pool takes the new ones); those
        given already still run, then the threads end."""
        with self._lock:
            self._closed = True
        for _ in self._started:  # behind the checks waiting: a queue is first in, first out
            self._jobs.put(None)
