"""What a pool's rules and parts see of a pool, and it of them: typing.Protocols, no code.

pool.py builds on its rules (failing.py, waits.py, lifetimes.py), which act on a pool, and is
built on by its parts (split.py's Split, replication.py's ReplicationServers), which it holds.
Both directions go through this module, so no import runs back up to pool.py: the rules take
a PoolState and a split holds SplitPools (Pool meets both), and Pool holds its replication
servers as a ReplicationLink.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any, Protocol

from ..errors import PgtarnError
from .channels import ChannelBoard
from .idle import IdleServers


class Unavailable(Protocol):
    """What the pool needs of any client it may have to give up on."""

    def server_unavailable(self, error: PgtarnError) -> None: ...


class SplitLink(Protocol):
    """What a pool's rules use of its read/write split (split.Split)."""

    def login_failed(self, index: int, message: str) -> None: ...


class SplitPool(Protocol):
    """A pool as its read/write split (split.Split) reads and changes it (pool.Pool)."""

    database: str
    user: str
    idle: IdleServers[Any]
    active: set[Any]
    waiting: Any
    board: ChannelBoard | None
    failure: PgtarnError | None
    retry_at: float

    def servers(self) -> list[Any]: ...

    def close_idle(self, reason: str) -> None: ...

    def cancel_wait(self, waiter: Any) -> None: ...

    def take_waiters_of(self, other: Any) -> None: ...


class ReplicationLink(Protocol):
    """What a pool and those that read it use of its replication servers
    (replication.ReplicationServers)."""

    @property
    def waiting(self) -> Sized: ...

    def __len__(self) -> int: ...

    def cancel(self, client: object) -> None: ...

    def tick(self, now: float) -> None: ...

    def gone(self, server: Any) -> None: ...


class QueryTimeout(Protocol):
    """The one client timeout a pool's waiters end by (pool.ClientTimeouts)."""

    @property
    def query(self) -> float: ...


class PoolState(Protocol):
    """A pool as its rules read and change it (pool.Pool)."""

    connstr: str
    idle: IdleServers[Any]
    active: set[Any]
    login: set[Any]
    tested: set[Any]
    being_canceled: set[Any]
    lifetime: float
    idle_timeout: float
    wait_timeout: float
    connect_timeout: float
    retry_cap: float
    login_retry: float
    min_pool_size: int
    clock: Callable[[], float]
    failure: PgtarnError | None
    failures: int
    retry_at: float
    refused: bool
    paused: bool
    host_index: int
    board: ChannelBoard | None

    @property
    def split(self) -> SplitLink | None: ...

    @property
    def client_timeouts(self) -> QueryTimeout: ...

    @property
    def server_count(self) -> int: ...

    def fail_waiters(self, error: PgtarnError, since: float) -> None: ...

    def max_wait(self, now: float) -> float: ...

    def servers(self) -> list[Any]: ...

    def close_idle(self, reason: str) -> None: ...


class HandOffs(Protocol):
    """What hands off the servers given to waiting clients outside a read of their own, once
    the callback under way is over (runtime.HandOffSteps, a pool's defer; handoffs.py)."""

    def due(self, pool: Any, server: Any) -> None: ...
