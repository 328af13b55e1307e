"""One pool per (database, user): the containers its servers and waiting clients sit in.

Theory of operation. A server is always in exactly one container: ``login`` while it
connects and authenticates, ``idle`` while nobody uses it, ``active`` while it is linked to a
client, ``tested`` while it runs a reset, rollback or health check before going back to
``idle``, ``being_canceled`` while released with a CancelRequest for its backend in flight
(cancels.py). Clients that asked for a server and got none are in ``waiting``, first come
first served; those that logged in before any server did wait in ``welcome_waiters``.
Logged-in clients are counted (``logged_in``; each client knows whether it joined, so it
leaves the count once). SHOW POOLS reports that count and the sizes of these containers.

Hand-offs. A server released while clients wait is not lent inside the callback that
released it (most often its own read of a ReadyForQuery): it is put with the active ones,
marked, and lent to the first waiting client once that callback is over (handoffs.py).

Servers are opened on demand, up to ``pool_size``; ``reserve_pool_size`` more once the
oldest client waited ``reserve_pool_timeout``; ``min_pool_size`` ahead of demand. When a
server cannot be opened the pool is *failing*: it keeps its waiters and retries, one attempt
at a time with a doubling delay, so that clients are served as soon as PostgreSQL is back;
they wait until query_timeout or query_wait_timeout (waits.py). A login error
that will not pass by itself (a wrong password, no such database) goes to the waiting
clients at once, unless a server of the pool will come back to serve them; retries then
back off up to ``login_retry`` (server_login_retry), and clients that arrive meanwhile with
no server to serve them get the cached error instead of waiting.

Lifetimes. A released server older than ``lifetime`` (server_lifetime) is closed instead of
going idle; the janitor closes idle servers older than that, or unused for ``idle_timeout``
(server_idle_timeout, never below min_pool_size), and gives up on clients that waited
``wait_timeout`` (query_wait_timeout), or their pool's query_timeout, for a server.

The pool never touches sockets: it talks to servers and waiting clients through the small
protocols below, and opens new servers through a ``launch`` callback given by the app.

Long: Pool is the one owner of the containers described above; its operations move servers and
clients between them and must be read together to keep each one in exactly one container.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from mypy_extensions import mypyc_attr

from ..errors import PgtarnError
from ..session.prepared import PreparedCounters
from .channels import ChannelBoard
from .failing import login_failed, refused_from_cache
from .idle import IdleServers
from .lifetimes import expire_idle
from .state import HandOffs, ReplicationLink, Unavailable
from .stats import PoolStats
from .waiting import WaitQueue
from .waits import expire_waiters

if TYPE_CHECKING:  # a pool holds its Split, which sees pools as state.SplitPool
    from .split import Split


@mypyc_attr(allow_interpreted_subclasses=True)
class PooledServer:
    """What the pool needs of a server connection: the first base of every server connection.

    A base class, not a typing.Protocol: in the compiled build the pool then reads these
    fields from the object itself, where through a Protocol each read is a Python attribute
    lookup (and a float made each time), five per transaction.
    """

    __slots__ = ("close_needed", "connstr", "created_at", "handoff_at", "in_read", "last_used")

    connstr: str
    #: Monotonic: opened; last linked, released or checked.
    created_at: float
    last_used: float
    #: Close when next released (RECONNECT, or a reload changed the connection string).
    close_needed: bool
    #: Inside its own read: a release then hands it off at the end of that read.
    in_read: bool
    #: Released at this time while clients waited: to be handed off once the callback is
    #: over (handoffs.py); 0.0: not.
    handoff_at: float

    def close(self, reason: str, wait: bool = False) -> None:
        """wait (workers = N): until PostgreSQL closes, so that its backend is gone."""
        raise NotImplementedError

    def start_check(self) -> None:
        """Run the health check; release to the pool when it passes, close when not."""
        raise NotImplementedError


S = TypeVar("S", bound=PooledServer)


class ServerGate(Protocol):
    """workers = N: server slots shared with the other workers (workers/slots.py); None in
    a single process. A pool opens a server only when the registry's may_open and its gate let
    it; the gate learns when a server left, and keeps its slot for a waiting client or gives it
    back."""

    def may_open(self, pool: Pool[Any]) -> bool:
        """Whether pool may open one more server now."""

    def server_gone(self, pool: Pool[Any]) -> None:
        """A server of pool is gone."""

    def gives_back(self, pool: Pool[Any], server: PooledServer) -> bool:
        """Whether server, released to pool, is closed (by the gate) for its slot to go to
        another worker; asked only while pool.owed, which the gate keeps."""


#: A waiter's server type (a waiter of some servers takes any of them: contravariant).
Lent = TypeVar("Lent", bound=PooledServer, contravariant=True)


@mypyc_attr(allow_interpreted_subclasses=True)
class Waiter(Generic[Lent]):
    """What the pool needs of a client that waits for a server: a base of every client
    connection. A base class, not a typing.Protocol, as PooledServer: compiled, handing a
    server to the first waiter (once per transaction under load) is then a C call."""

    __slots__ = ()

    def server_assigned(self, server: Lent) -> None:
        raise NotImplementedError

    def server_unavailable(self, error: PgtarnError) -> None:
        raise NotImplementedError

    def waiting_too_long(self) -> None:
        """Queued longer than query_wait_notify: tell the client (once)."""
        raise NotImplementedError


class WelcomeWaiter(Unavailable, Protocol):
    """A client that logged in before any server of the pool did: it waits for the server
    parameters it is to be welcomed with."""

    def welcome_ready(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ClientTimeouts:
    """The client timeouts of a pool's clients, in seconds (0: off), read by the janitor."""

    query: float = 0.0  # query_timeout: waiting for a server, or running
    transaction: float = 0.0  # transaction_timeout
    idle_transaction: float = 0.0  # idle_transaction_timeout
    idle: float = 0.0  # client_idle_timeout

    @property
    def any(self) -> bool:
        return bool(self.query or self.transaction or self.idle_transaction or self.idle)


class Pool(Generic[S]):
    """Servers for one (database, user) pair and the clients waiting for them.

    Long: the containers and every move between them are one invariant (a server is in
    exactly one container); split, each move would be read against the other half.
    """

    def __init__(
        self,
        database: str,
        user: str,
        *,
        pool_size: int,
        pool_mode: str,
        min_pool_size: int = 0,
        reserve_pool_size: int = 0,
        reserve_pool_timeout: float = 5.0,
        launch: Callable[[Pool[S]], S] | None = None,
    ) -> None:
        self.database = database
        self.user = user
        self.pool_size = pool_size
        self.pool_mode = pool_mode
        self.min_pool_size = min_pool_size
        self.reserve_pool_size = reserve_pool_size
        self.reserve_pool_timeout = reserve_pool_timeout
        #: Idle servers unused for longer than this are checked before reuse (None: never).
        self.check_delay: float | None = None
        #: server_connect_timeout: a login taking longer is given up on (and with
        #: query_wait_timeout = 0, a failing pool's clients after waiting as long: waits.py).
        self.connect_timeout = 15.0
        #: Longest delay between two attempts to open a server while failing.
        self.retry_cap = 1.0
        #: The same after a login error that will not pass by itself (server_login_retry).
        self.login_retry = 15.0
        #: Waiting clients are told after this many seconds (query_wait_notify; 0: never).
        self.wait_notify = 0.0
        #: server_lifetime: older servers close when released or idle (0: after one client).
        self.lifetime = 3600.0
        #: server_reset_query if server_reset_query_always, else None (read at each unlink).
        self.reset_query_always: str | None = None
        #: server_idle_timeout: idle servers unused this long are closed (0: never).
        self.idle_timeout = 600.0
        #: query_wait_timeout: clients waiting this long for a server are closed (0: never).
        self.wait_timeout = 120.0
        self.client_timeouts = ClientTimeouts()
        #: Made from the "*" entry; freed by autodb_idle_timeout once unused since last_used.
        self.auto = False
        self.last_used = 0.0
        self.launch: Callable[[Pool[S]], S] | None = launch
        self.may_open: Callable[[Pool[S]], bool] = lambda pool: True
        self.gate: ServerGate | None = None  # workers = N: shared server slots (None: alone)
        #: workers = N: servers this pool owes the gate (closed as released, their slots going
        #: to another worker); a count here, so that a release calls the gate only then.
        self.owed = 0
        self.clock: Callable[[], float] = time.monotonic
        #: Prepared statements clients and servers of this pool made and ran (statistics).
        self.prepared_counters = PreparedCounters()
        #: Traffic of this pool's clients and servers (statistics).
        self.stats = PoolStats()
        #: Logged-in clients (READY), waiting or not: counted (each knows it joined).
        self.logged_in = 0
        self.idle: IdleServers[S] = IdleServers()
        self.active: set[S] = set()
        self.login: set[S] = set()
        self.tested: set[S] = set()
        #: Servers held for the CancelRequests in flight for them, by server (cancels.py).
        self.being_canceled: set[S] = set()
        self.cancels: dict[S, int] = {}
        self.cancel_requests = 0
        self.waiting: WaitQueue[Waiter[S]] = WaitQueue()
        #: The runtime's, which hands off servers released while clients wait once the
        #: callback under way is over (handoffs.py; given by the registry; None: at once).
        self.defer: HandOffs | None = None
        #: Clients that logged in before any server did, waiting for the welcome parameters.
        self.welcome_waiters: list[WelcomeWaiter] = []
        #: id(welcome waiter) -> when it began to wait (waiting keeps its own times).
        self.wait_since: dict[int, float] = {}
        #: ParameterStatus values of the first server that logged in, sent to new clients.
        self.welcome: dict[str, str] | None = None
        #: (ClientKey, ServerKey) from a client's SCRAM login, for SCRAM passthrough.
        self.scram_keys: tuple[bytes, bytes] | None = None
        self.connstr = ""
        #: Set while new work gets no server (shutdown, PAUSE): servers go idle, clients wait.
        self.paused = False
        #: PAUSE/KILL: servers are closed as they are released instead of going idle.
        self.pause_closes = False
        #: A shutdown that waits for servers: a client that would wait gets this instead.
        self.refusal: PgtarnError | None = None
        #: The last error opening a server, until a server logs in again.
        self.failure: PgtarnError | None = None
        self.failures = 0
        self.retry_at = 0.0
        #: The last failure will not pass by itself (a wrong password, no such database).
        self.refused = False
        #: The channels its clients LISTEN to, and its listener connection (transaction and
        #: statement mode; given by the registry).
        self.board: ChannelBoard | None = None
        #: read_write_split: this (database, user)'s pools; a replica's pool: its host's index.
        self.split: Split[Pool[S]] | None = None
        self.host_index = -1
        #: Its replication clients' own servers and those waiting for room (replication.py).
        self.replication: ReplicationLink | None = None

    def __repr__(self) -> str:
        return f"<Pool {self.database}/{self.user}>"

    # --- sizes --------------------------------------------------------------------------------

    @property
    def server_count(self) -> int:
        return (
            len(self.idle)
            + len(self.active)
            + len(self.login)
            + len(self.tested)
            + len(self.being_canceled)
            + (len(self.replication) if self.replication is not None else 0)
        )

    def has_room(self, reserve: bool = False) -> bool:
        limit = self.pool_size + (self.reserve_pool_size if reserve else 0)
        return self.server_count < limit and self.may_open(self)

    # --- clients ------------------------------------------------------------------------------

    @property
    def active_client_count(self) -> int:
        """SHOW POOLS' cl_active: logged in and not waiting for a server."""
        return self.logged_in - len(self.waiting)

    @property
    def client_count(self) -> int:
        """Clients past the password: logged in, or waiting for the first server's welcome."""
        return self.logged_in + len(self.welcome_waiters)

    @property
    def waiting_client_count(self) -> int:
        """SHOW POOLS' cl_waiting: waiting for a server, or for the first one's welcome."""
        return (
            len(self.waiting)
            + len(self.welcome_waiters)
            + (len(self.replication.waiting) if self.replication is not None else 0)
        )

    def client_joined(self, client: Waiter[S]) -> None:
        """A client finished logging in to this pool (once)."""
        self.logged_in += 1

    def client_left(self, client: Waiter[S], joined: bool) -> None:
        """A client is gone: out of this pool's containers (and its replicas'), uncounted if
        it had joined."""
        if joined:
            self.logged_in -= 1
        if self.waiting:
            self.cancel_wait(client)
        self.cancel_welcome(client)
        if self.split is not None:
            self.split.client_left(client)
        if self.replication is not None:
            self.replication.cancel(client)

    def acquire(self, waiter: Waiter[S], prefer: S | None = None, now: float = 0.0) -> S | None:
        """An idle server for waiter now (prefer if it is idle), or None after queueing it
        (served FIFO). now: the caller's reading of the clock, if it has one."""
        now = self.last_used = now or self.clock()
        if not self.waiting.count and not self.paused:
            if prefer is not None and self.idle and self.idle.top() is not prefer \
                    and prefer in self.idle:  # fmt: skip
                self.idle.remove(prefer)  # (a scan of at most the pool's size)
                self.idle.append(prefer)
            while self.idle:
                server = self.idle.pop()
                if self.check_delay is not None and now - server.last_used > self.check_delay:
                    self.tested.add(server)
                    server.start_check()
                    continue
                self.active.add(server)
                self.stats.wait.observe(0.0)  # assigned without waiting
                return server
        if self.refusal is not None:
            waiter.server_unavailable(self.refusal)
            return None
        if self.failure is not None and refused_from_cache(self, waiter, now):
            return None
        self.waiting.append(waiter, now)
        # Grow only when the servers coming (logging in, being reset) are too few and there
        # is room; the reserve pool is the janitor's call.
        if (
            self.waiting.count > len(self.login) + len(self.tested)
            and len(self.active) < self.pool_size  # (under load all are lent: none counted)
            and self.server_count < self.pool_size
        ):
            self._grow(now)
        return None

    def take_waiters_of(self, other: Pool[S]) -> None:
        """other's waiting clients wait here instead, after this pool's own (a replica went
        down: its readers go to the primary), keeping how long they waited."""
        now = self.clock()
        while other.waiting:
            since = other.waiting.first_since()
            self.waiting.append(other.waiting.popleft(), since)
        if not self.paused:
            self._serve_waiters()
            self._grow(now)

    def cancel_wait(self, waiter: Waiter[S]) -> None:
        """Take a waiter out of the queue (it left or timed out)."""
        with contextlib.suppress(ValueError):  # not waiting
            self.waiting.remove(waiter)

    def max_wait(self, now: float) -> float:
        """Age in seconds of the oldest waiting client (for a server, or for the first one)."""
        oldest = min(now, self.waiting.first_since()) if self.waiting else now
        if self.welcome_waiters:
            oldest = min(oldest, self.wait_since.get(id(self.welcome_waiters[0]), now))
        return now - oldest

    def wait_welcome(self, waiter: WelcomeWaiter) -> None:
        """Queue a client for the first server's ParameterStatus values; open a server."""
        now = self.clock()
        if self.failure is not None and refused_from_cache(self, waiter, now):
            return
        self.welcome_waiters.append(waiter)
        self.wait_since[id(waiter)] = now
        if not self.login and self._may_launch(now) and self.has_room():
            self._open()

    def cancel_welcome(self, waiter: object) -> None:
        if waiter in self.welcome_waiters:
            self.welcome_waiters.remove(waiter)
            self.wait_since.pop(id(waiter), None)

    # --- opening servers ------------------------------------------------------------------------

    def _open(self) -> None:
        assert self.launch is not None
        self.login.add(self.launch(self))

    def _may_launch(self, now: float) -> bool:
        if self.paused or self.launch is None:
            return False
        # While failing: one attempt at a time, after the backoff delay.
        return self.failure is None or (not self.login and now >= self.retry_at)

    def _grow(self, now: float, reserve: bool = False) -> None:
        """Open servers while clients wait and limits allow."""
        if not self._may_launch(now):
            return
        # Servers logging in or being reset will serve waiters soon: count them as coming.
        need = len(self.waiting) - len(self.login) - len(self.tested)
        if self.failure is not None:
            need = min(need, 1)
        while need > 0 and self.has_room(reserve):
            self._open()
            need -= 1

    def fill_min(self, now: float) -> None:
        """Open servers up to min_pool_size."""
        while self.server_count < self.min_pool_size and self._may_launch(now) and self.has_room():
            self._open()

    def tick(self, now: float) -> None:
        """The janitor's periodic visit: login timeouts, lifetimes, waits, retries, reserve."""
        for server in [s for s in self.login if now - s.created_at > self.connect_timeout]:
            # PgBouncer's words first: log readers match "closing because: connect timeout"
            server.close(f"connect timeout (server_connect_timeout = {self.connect_timeout:g} s)")
        if self.tested:
            # a reset or health check is a short round trip: unanswered for as long as a
            # login may take, the server is gone or stuck (a waiting client gets another)
            for server in [s for s in self.tested if now - s.last_used > self.connect_timeout]:
                server.close("server_connect_timeout: reset or check not answered")
        if self.idle:
            expire_idle(self, now)
        if self.waiting or self.welcome_waiters:
            expire_waiters(self, now)  # query_timeout, query_wait_timeout, failing
        if self.waiting and self.wait_notify > 0:
            for waiter, since in self.waiting.items():  # oldest first: stop at a young one
                if now - since < self.wait_notify:
                    break
                waiter.waiting_too_long()
        if self.waiting:
            reserve = self.reserve_pool_size > 0 and self.max_wait(now) >= self.reserve_pool_timeout
            self._grow(now, reserve)
        elif self.welcome_waiters and not self.login and self._may_launch(now) and self.has_room():
            self._open()
        self.fill_min(now)
        if self.board is not None:
            self.board.tick(now, self.connect_timeout, self.idle_timeout)

    def refuse_waiting(self, error: PgtarnError) -> None:
        """Clients waiting now, and those that would wait from now on, get error."""
        self.refusal = error
        self.fail_waiters(error, float("inf"))

    def fail_waiters(self, error: PgtarnError, since: float) -> None:
        """Give error to every waiting client that began to wait at or before since."""
        wait_since = self.wait_since

        def young(waiter: Unavailable) -> bool:
            return wait_since.get(id(waiter), 0.0) > since

        failed: list[Unavailable] = [*self.waiting.take_waiting_since(since)]
        failed += [w for w in self.welcome_waiters if not young(w)]
        if not failed:
            return
        self.welcome_waiters = [w for w in self.welcome_waiters if young(w)]
        for waiter in failed:
            self.wait_since.pop(id(waiter), None)
            waiter.server_unavailable(error)

    # --- servers ------------------------------------------------------------------------------

    def server_ready(self, server: S, params: dict[str, str]) -> None:
        """A server finished logging in."""
        self.login.discard(server)
        self.failure = None
        self.failures = 0
        self.refused = False
        if self.welcome is None:
            self.welcome = dict(params)
        waiters, self.welcome_waiters = self.welcome_waiters, []
        for waiter in waiters:
            self.wait_since.pop(id(waiter), None)
            waiter.welcome_ready()
        self._to_idle(server)

    def server_login_failed(self, server: S, error: PgtarnError, retry: bool) -> None:
        """A server could not connect or log in; retry: the cause may pass (failing.py)."""
        login_failed(self, server, error, retry)

    def release(self, server: S, now: float = 0.0) -> None:
        """A linked server is clean again (active, or tested after its reset or check): to
        the first waiter, or idle (now: as acquire)."""
        held = True  # in active: a server lent on stays there (no set removal and addition)
        tested = self.tested
        if len(tested) and server in tested:  # (rarely not empty; len: compiled, no call)
            tested.discard(server)
            held = False
        if self.cancels and server in self.cancels:  # (rarely not empty, as tested)
            self.active.discard(server)
            self.being_canceled.add(server)  # until its last cancel ends (cancels.py)
            return
        if self.owed and self.gate is not None:
            self.active.discard(server)
            held = False
            if self.gate.gives_back(self, server):
                return
        self._to_idle(server, now, held)

    def begin_reset(self, server: S) -> None:
        """A server left its client and runs a reset or rollback before reuse."""
        self.active.discard(server)
        self.tested.add(server)

    def _to_idle(self, server: S, now: float = 0.0, held: bool = False) -> None:
        """A server free again goes to the first waiter, idle, or closed. held: it is in
        active still, where a server lent on stays; otherwise it leaves active first."""
        if server.connstr != self.connstr:
            reason = "connection string changed"
        elif server.close_needed:
            reason = "reconnect requested"
        elif server.last_used - server.created_at > self.lifetime:
            reason = "server_lifetime"
        elif self.paused and self.pause_closes:
            reason = "pool paused"
        elif self.waiting.count and not self.paused:
            if not held:
                self.active.add(server)
            if self.defer is not None and server.in_read:
                # (the hot path under load: its ReadyForQuery) lent once its read is over
                server.handoff_at = now or self.clock()  # (handoffs.py)
                return
            # lend it to the first waiting client
            waiting = self.waiting
            waited = (now or self.clock()) - waiting.first_since()
            waiter = waiting.popleft()
            self.stats.wait.observe(waited if waited > 0.0 else 0.0)  # (queued after it came)
            waiter.server_assigned(server)
            return
        elif self.server_count - (1 if held else 0) >= self.pool_size:
            # a reserve server nobody waits for, or the pool shrank by a reload
            reason = "pool is over its size"
        else:
            if held:
                self.active.discard(server)
            self.idle.append(server)
            return
        if held:  # (out of every container before it closes: its connection_lost comes later)
            self.active.discard(server)
        server.close(reason)

    def _serve_waiters(self) -> None:
        """An idle server to each waiting client (RESUME, another pool's waiters taken):
        marked, lent once the callback under way is over (handoffs.py), or at once."""
        defer = self.defer
        for _ in range(min(len(self.waiting), len(self.idle))):
            server = self.idle.pop()
            if defer is None:
                self._to_idle(server)  # to the first waiter
            else:
                self.active.add(server)
                server.handoff_at = self.clock()
                defer.due(self, server)

    def server_closed(self, server: S) -> None:
        """A server is gone, from whatever container it was in; replace it if clients wait."""
        if server in self.active:
            self.active.discard(server)
        elif server in self.login:
            self.login.discard(server)
        elif server in self.tested or server in self.being_canceled:
            self.tested.discard(server)
            self.being_canceled.discard(server)
        else:
            with contextlib.suppress(ValueError):
                self.idle.remove(server)
        if self.gate is not None:
            self.gate.server_gone(self)
        if self.waiting:
            self._grow(self.clock())

    def close_idle(self, reason: str) -> None:
        """Close every idle server (reload with a new connection string, shutdown)."""
        while self.idle:
            self.idle.pop().close(reason)

    def servers(self) -> list[S]:
        """Every server of the pool, in whatever container."""
        return [*self.active, *self.idle, *self.tested, *self.login, *self.being_canceled]

    @property
    def busy(self) -> bool:
        """Some server is lent, being reset or canceled, or logging in (PAUSE waits)."""
        return bool(self.active or self.tested or self.login or self.being_canceled)

    # --- pause / resume -------------------------------------------------------------------------

    def pause(self, close_servers: bool = False) -> None:
        """Stop lending servers: new work waits; released servers go idle, or with
        close_servers (PAUSE) are closed, idle ones at once."""
        self.paused = True
        if close_servers:
            self.pause_closes = True
            self.close_idle("pool paused")

    def resume(self) -> None:
        """Lend servers again: idle ones to the waiting clients, in order; open more."""
        self.paused = False
        self.pause_closes = False
        self._serve_waiters()
        if self.waiting:
            self._grow(self.clock())
        if self.board is not None:
            self.board.resume()  # notifications held while paused


def open_granted(pool: Pool[S], unused: bool = False) -> None:
    """workers = N: a server slot came: open the servers the pool's waiting clients and
    min_pool_size need (as acquire, wait_welcome and the janitor would have); with nobody
    waiting, one server if the slot is unused."""
    now = pool.clock()
    if pool.waiting:
        pool._grow(
            now, pool.reserve_pool_size > 0 and pool.max_wait(now) >= pool.reserve_pool_timeout
        )
    elif pool.welcome_waiters and not pool.login and pool._may_launch(now) and pool.has_room():
        pool._open()
    elif unused and not pool.welcome_waiters and pool._may_launch(now) and pool.has_room():
        # the client that asked was served by a released server meanwhile; a single process
        # would have opened this server all the same when it waited: opened, where giving
        # the slot back made each such wait a round trip and a release
        pool._open()
    pool.fill_min(now)
