"""A split database's pools for one user: the primary's, and one per replica that reads use.

The home pool is the (database, user) pool clients log in to; its servers connect to the
current primary (the registry's launcher asks ``write_target``). Each replica a read goes to
has a pool of its own (``replicas``, made on first use), with the same sizes, whose servers
connect to that host alone. A read goes to the pool with the fewest outstanding transactions
(linked and waiting clients) among the replicas that HostSet.readable allows, and the home
pool when primary_reads is on; with none of them, to the home pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ..session.effects import Kind
from .hosts import REPLICA, HostSet, HostState
from .state import SplitPool

#: The pools of a split (pool.P, seen as a SplitPool).
P = TypeVar("P", bound=SplitPool)


class Split(Generic[P]):
    """The pools of one (database, user) of a split database, and the choice among them."""

    def __init__(
        self,
        hosts: HostSet,
        home: P,
        make: Callable[[int], P],
        *,
        mode: str,
        primary_reads: bool,
        read_your_writes: bool,
    ) -> None:
        self.hosts = hosts
        self.home = home
        #: Opens the pool of host index (given by the registry).
        self.make = make
        #: read_write_split: "explicit" or "auto".
        self.mode = mode
        self.primary_reads = primary_reads
        self.read_your_writes = read_your_writes
        self.replicas: dict[int, P] = {}
        #: Where the next tie between equally loaded pools starts (reads take turns).
        self.turn = 0
        #: The primary the home pool's servers connect to ("" before one is known).
        self.primary_key = ""

    def __repr__(self) -> str:
        return f"<Split {self.home.database}/{self.home.user}>"

    def read_pool(self, since: float) -> P:
        """The pool for a read-only transaction of a client whose last write committed at
        since (monotonic; 0.0: none)."""
        hosts = self.hosts
        readable = hosts.readable(since if self.read_your_writes else 0.0)
        # the primary (always current: a candidate after a write too) comes first
        primary = hosts.primary if self.primary_reads else None
        first = 1 if primary is not None else 0
        count = len(readable) + first
        if not count:
            return self.home
        self.turn += 1  # equally loaded pools take turns
        best = self.home
        best_host = primary
        load = 1 << 30
        replicas = self.replicas
        for offset in range(count):
            at = (self.turn + offset) % count
            if at < first:
                host, pool = primary, self.home
            else:
                host = readable[at - first]
                found = replicas.get(host.index)
                pool = found if found is not None else self._replica(host.index)
            outstanding = len(pool.active) + len(pool.waiting)
            if outstanding < load:
                best, best_host, load = pool, host, outstanding
        if best_host is not None:
            best_host.routed += 1
        return best

    def _replica(self, index: int) -> P:
        pool = self.replicas[index] = self.make(index)
        return pool

    def write_pool(self) -> P:
        """The pool for a transaction that may write: the home pool (counted as routed to
        the primary)."""
        primary = self.hosts.primary
        if primary is not None:
            primary.routed += 1
        return self.home

    def write_target(self) -> HostState | None:
        """The host the home pool's new servers connect to: the primary; None while there
        is none (the launcher then tries the host list for one that takes writes) or two
        claim to be it (``hosts.split_brain``: the launcher refuses)."""
        return self.hosts.primary

    def hosts_changed(self, hosts: HostSet) -> None:
        """Roles, bans or lag changed: the home pool follows the primary (its servers on
        another host close as they are released, waiting clients get a server of the new
        one at once); a replica that is down or promoted loses its idle servers, and the
        clients waiting for one of them wait in the home pool instead."""
        primary = hosts.primary
        key = primary.key if primary is not None else ""
        home = self.home
        if key != self.primary_key:
            self.primary_key = key
            for server in home.servers():
                server.close_needed = True
            home.close_idle("the primary changed")
            if home.board is not None and primary is not None:  # LISTEN on the new one
                home.board.restart("the primary changed")
            if primary is not None and home.failure is not None:
                home.retry_at = 0.0  # a primary appeared: try it now, not after the backoff
        for index, pool in self.replicas.items():
            host = hosts.hosts[index]
            if host.role == REPLICA and host.up:
                continue
            if pool.idle:
                pool.close_idle(f"{host.key} is {host.role if host.up else 'down'}")
            if pool.waiting and not pool.active:
                home.take_waiters_of(pool)

    def client_left(self, client: object) -> None:
        """A client of the home pool is gone: out of the replicas' queues too."""
        for pool in self.replicas.values():
            if pool.waiting:
                pool.cancel_wait(client)

    def login_failed(self, index: int, message: str) -> None:
        """A server of the home pool (index -1) or of a replica's could not log in: the
        health checker looks at once, and a replica is banned meanwhile."""
        if index >= 0:
            self.hosts.ban(index, f"login failed: {message}")
        self.hosts.wake()


class ClientRoute(Generic[P]):
    """One client's way through a split (transaction and statement mode): the kind of the
    transaction it starts (read by the relay from its first bytes), where it goes, and when
    the client's last write committed (read-your-writes)."""

    __slots__ = ("begin", "kind", "reads_only", "split", "writing", "wrote_at")

    def __init__(self, split: Split[P], reads_only: bool) -> None:
        self.split = split
        #: The `_ro` database: every transaction is a read.
        self.reads_only = reads_only
        #: session.readonly's kind of the transaction about to start.
        self.kind = Kind.OTHER
        #: The transaction under way went to the primary as one that may write.
        self.writing = False
        #: When the client's last write transaction ended (monotonic; 0.0: none yet).
        self.wrote_at = 0.0
        #: A bare BEGIN pgtarn answered itself: where its transaction runs depends on the
        #: statement that follows (SET TRANSACTION READ ONLY); sent ahead of it ("": none).
        self.begin = ""

    def pool_for(self, reads_by_default: bool) -> P:
        """The pool of the transaction starting now (reads_by_default: the client set
        default_transaction_read_only)."""
        kind = self.kind
        self.kind = Kind.OTHER
        split = self.split
        if self.begin:  # inside a transaction: only its own access mode makes it a read
            read = kind == Kind.SET_READ_ONLY
        else:
            read = (
                kind == Kind.BEGIN_READ_ONLY
                or kind == Kind.NOTHING
                or (kind == Kind.READ and split.mode == "auto")
            )
        if read or self.reads_only or reads_by_default:
            self.writing = False
            return split.read_pool(self.wrote_at)
        self.writing = True
        return split.write_pool()

    def ended(self) -> None:
        """The transaction ended (its server goes back): a write's end is remembered."""
        if self.writing:
            self.writing = False
            self.wrote_at = self.split.hosts.clock()
