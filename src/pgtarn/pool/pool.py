"""One pool per (database, user): the containers its servers and waiting clients sit in.

Theory of operation. A server is always in exactly one container: ``login`` while it
connects and authenticates, ``idle`` while nobody uses it, ``active`` while it is linked to a
client, ``tested`` while it runs a reset or rollback before going back to ``idle``. Clients
that asked for a server and got none sit in ``waiting``, first come first served. The counts
that SHOW POOLS reports are the sizes of these containers, so they cannot drift.

The pool never touches sockets: it talks to servers and waiting clients through the small
protocols below, and opens new servers through a ``launch`` callback given by the app.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..errors import PgtarnError


class PooledServer(Protocol):
    """What the pool needs of a server connection."""

    def close(self, reason: str) -> None: ...


S = TypeVar("S", bound=PooledServer)


class Waiter(Protocol[S]):  # type: ignore[misc]
    """What the pool needs of a client that waits for a server."""

    def server_assigned(self, server: S) -> None: ...

    def server_unavailable(self, error: PgtarnError) -> None: ...

    def welcome_ready(self) -> None: ...


class Limits(Protocol):
    """Cross-pool limits (max_db_connections, max_user_connections) kept by the registry."""

    def may_open(self, pool: Pool[PooledServer]) -> bool: ...


class Pool(Generic[S]):
    """Servers for one (database, user) pair and the clients waiting for them."""

    def __init__(
        self,
        database: str,
        user: str,
        *,
        pool_size: int,
        pool_mode: str,
        min_pool_size: int = 0,
        launch: Callable[[Pool[S]], S] | None = None,
    ) -> None:
        self.database = database
        self.user = user
        self.pool_size = pool_size
        self.pool_mode = pool_mode
        self.min_pool_size = min_pool_size
        self.launch: Callable[[Pool[S]], S] | None = launch
        self.may_open: Callable[[Pool[S]], bool] = lambda pool: True
        self.idle: deque[S] = deque()
        self.active: set[S] = set()
        self.login: set[S] = set()
        self.tested: set[S] = set()
        self.waiting: deque[Waiter[S]] = deque()
        self.wait_since: dict[int, float] = {}
        #: ParameterStatus values of the first server that logged in, sent to new clients.
        self.welcome: dict[str, str] | None = None
        #: (ClientKey, ServerKey) from a client's SCRAM login, for SCRAM passthrough.
        self.scram_keys: tuple[bytes, bytes] | None = None
        self.connstr = ""
        #: Clients that logged in before any server did, waiting for the welcome parameters.
        self.welcome_waiters: list[Waiter[S]] = []

    def __repr__(self) -> str:
        return f"<Pool {self.database}/{self.user}>"

    # --- sizes --------------------------------------------------------------------------------

    @property
    def server_count(self) -> int:
        return len(self.idle) + len(self.active) + len(self.login) + len(self.tested)

    def has_room(self) -> bool:
        return self.server_count < self.pool_size and self.may_open(self)

    # --- clients ------------------------------------------------------------------------------

    def acquire(self, waiter: Waiter[S]) -> S | None:
        """An idle server for waiter now, or None after queueing it (served FIFO)."""
        if self.idle and not self.waiting:
            server = self.idle.pop()
            self.active.add(server)
            return server
        self.waiting.append(waiter)
        self.wait_since[id(waiter)] = time.monotonic()
        self._grow()
        return None

    def cancel_wait(self, waiter: Waiter[S]) -> None:
        """Take a waiter out of the queue (it left or timed out)."""
        try:
            self.waiting.remove(waiter)
        except ValueError:
            return
        self.wait_since.pop(id(waiter), None)

    def max_wait(self, now: float) -> float:
        """Age in seconds of the oldest waiting client."""
        if not self.waiting:
            return 0.0
        return now - self.wait_since.get(id(self.waiting[0]), now)

    # --- servers ------------------------------------------------------------------------------

    def _grow(self) -> None:
        """Open servers while clients wait and limits allow."""
        pending = len(self.waiting) - len(self.login)
        while pending > 0 and self.launch is not None and self.has_room():
            self.login.add(self.launch(self))
            pending -= 1

    def fill_min(self) -> None:
        """Open servers up to min_pool_size."""
        while self.server_count < self.min_pool_size and self.launch and self.has_room():
            self.login.add(self.launch(self))

    def wait_welcome(self, waiter: Waiter[S]) -> None:
        """Queue a client for the first server's ParameterStatus values; open a server."""
        self.welcome_waiters.append(waiter)
        if not self.login and self.server_count < self.pool_size and self.launch is not None:
            self.login.add(self.launch(self))

    def cancel_welcome(self, waiter: Waiter[S]) -> None:
        if waiter in self.welcome_waiters:
            self.welcome_waiters.remove(waiter)

    def server_ready(self, server: S, params: dict[str, str]) -> None:
        """A server finished logging in."""
        self.login.discard(server)
        if self.welcome is None:
            self.welcome = dict(params)
        waiters, self.welcome_waiters = self.welcome_waiters, []
        for waiter in waiters:
            waiter.welcome_ready()
        self._to_idle(server)

    def server_login_failed(self, server: S, error: PgtarnError) -> None:
        """A server could not log in: waiting clients get the error when no server is left."""
        self.login.discard(server)
        if self.server_count == 0:
            waiters = list(self.waiting)
            self.waiting.clear()
            self.wait_since.clear()
            waiters.extend(self.welcome_waiters)
            self.welcome_waiters = []
            for waiter in waiters:
                waiter.server_unavailable(error)

    def release(self, server: S) -> None:
        """A linked server is clean again: hand it to the first waiter or make it idle."""
        self.active.discard(server)
        self.tested.discard(server)
        self._to_idle(server)

    def begin_reset(self, server: S) -> None:
        """A server left its client and runs a reset or rollback before reuse."""
        self.active.discard(server)
        self.tested.add(server)

    def _to_idle(self, server: S) -> None:
        if self.waiting:
            waiter = self.waiting.popleft()
            self.wait_since.pop(id(waiter), None)
            self.active.add(server)
            waiter.server_assigned(server)
        else:
            self.idle.append(server)

    def server_closed(self, server: S) -> None:
        """A server is gone, from whatever container it was in; replace it if clients wait."""
        if server in self.active:
            self.active.discard(server)
        elif server in self.login:
            self.login.discard(server)
        elif server in self.tested:
            self.tested.discard(server)
        else:
            with contextlib.suppress(ValueError):
                self.idle.remove(server)
        if self.waiting:
            self._grow()

    def close_idle(self, reason: str) -> None:
        """Close every idle server (reload with a new connection string, shutdown)."""
        while self.idle:
            self.idle.pop().close(reason)
