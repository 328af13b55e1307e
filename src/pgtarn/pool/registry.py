"""(database, user) -> Pool, the limits that span pools, and applying a reloaded Config."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, Protocol

from ..config import Config, DatabaseEntry, UserEntry
from ..errors import PgtarnError
from .channels import ChannelBoard, ListenerLink
from .pool import ClientTimeouts, Pool, S, ServerGate


class SharedGate(ServerGate, Protocol):
    """workers = N: the server slots of every pool, shared with the other workers."""

    def share(self, total: int) -> int:
        """This worker's part of a min_pool_size meant for the whole pgtarn."""

    def tick(self) -> None:
        """The janitor's visit: slots held with no server nor client to use them go back."""


class Registry(Generic[S]):
    """All pools of the running pooler."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pools: dict[tuple[str, str], Pool[S]] = {}
        self.launch: Callable[[Pool[S], DatabaseEntry], S] | None = None
        #: Opens a pool's listener connection (given by the app, as launch).
        self.open_listener: Callable[[Pool[S], DatabaseEntry, ChannelBoard], ListenerLink] \
            | None = None
        self.databases: dict[str, DatabaseEntry] = {}
        self.paused = False
        #: Databases paused by PAUSE db / KILL db, and refusing new clients by DISABLE db.
        self.paused_databases: set[str] = set()
        self.disabled: set[str] = set()
        #: A shutdown that waits for servers: clients asking for a server get this error.
        self.refusal: PgtarnError | None = None
        #: workers = N: server slots shared with the other workers (None: a single process).
        self.gate: SharedGate | None = None

    def __iter__(self) -> Iterator[Pool[S]]:
        return iter(list(self.pools.values()))

    def get_pool(self, db: DatabaseEntry, client_user: str) -> Pool[S]:
        """The pool for a database entry and a client; a forced user shares one pool."""
        server_user = db.user or client_user
        key = (db.name, server_user)
        pool = self.pools.get(key)
        if pool is None:
            pool = Pool(db.name, server_user, pool_size=0, pool_mode="session")
            self._configure(pool, db)
            pool.connstr = db.server_identity
            if self.paused or db.name in self.paused_databases:
                pool.pause(close_servers=db.name in self.paused_databases)
            pool.refusal = self.refusal
            if self.launch is not None:
                pool.launch = self._launcher(db)
            pool.board = ChannelBoard(self._listener_opener(pool, db))
            pool.may_open = self.may_open
            pool.gate = self.gate
            pool.last_used = pool.clock()
            self.pools[key] = pool
        self.databases[db.name] = db
        return pool

    def _configure(self, pool: Pool[S], db: DatabaseEntry) -> None:
        """Sizes, mode and timings of a pool from the config."""
        config = self.config
        pool.pool_size = config.pool_size_for(db, pool.user)
        pool.pool_mode = config.pool_mode_for(db, pool.user)
        pool.min_pool_size = config.min_pool_size_for(db)
        if self.gate is not None:
            pool.min_pool_size = self.gate.share(pool.min_pool_size)
        pool.reserve_pool_size = config.reserve_pool_size_for(db, pool.user)
        pool.reserve_pool_timeout = config.reserve_pool_timeout
        pool.check_delay = config.server_check_delay if config.server_check_query else None
        pool.connect_timeout = config.server_connect_timeout or 15.0
        pool.retry_cap = max(0.05, min(1.0, config.server_login_retry))
        pool.wait_notify = float(config.query_wait_notify)
        pool.lifetime = _first(db.server_lifetime, config.server_lifetime)
        pool.idle_timeout = config.server_idle_timeout
        pool.wait_timeout = _first(db.query_wait_timeout, config.query_wait_timeout)
        # made from `*` (autodb_idle_timeout frees it), not a NAME_ro alias of an entry
        pool.auto = db.name not in config.databases and not db.reads_only
        user = config.users.get(pool.user) or UserEntry(pool.user)
        pool.client_timeouts = ClientTimeouts(
            query=_first(user.query_timeout, config.query_timeout),
            transaction=config.transaction_timeout,
            idle_transaction=_first(user.idle_transaction_timeout,
                                    config.idle_transaction_timeout),
            idle=_first(user.client_idle_timeout, config.client_idle_timeout),
        )

    def _launcher(self, first: DatabaseEntry) -> Callable[[Pool[S]], S]:
        launch = self.launch
        assert launch is not None

        def launch_current(pool: Pool[S]) -> S:
            # The entry may have changed by a reload since the pool was made.
            return launch(pool, self.databases.get(pool.database, first))

        return launch_current

    def _listener_opener(self, pool: Pool[S], first: DatabaseEntry
                         ) -> Callable[[ChannelBoard], ListenerLink] | None:
        open_listener = self.open_listener
        if open_listener is None:
            return None

        def open_current(board: ChannelBoard) -> ListenerLink:
            return open_listener(pool, self.databases.get(pool.database, first), board)

        return open_current

    def may_open_listener(self, pool: Pool[S]) -> bool:
        """Whether pool's listener connection (counted already) may connect within
        max_db_connections / max_user_connections."""
        return self.may_open(pool, own=1)

    def may_open(self, pool: Pool[S], own: int = 0) -> bool:
        """max_db_connections / max_user_connections across pools.

        At a limit, an idle server of another pool under the same limit is closed to make
        room, so that one pool's idle servers cannot starve another pool's waiting clients.
        """
        db = self.databases.get(pool.database)
        max_db = self.config.max_db_connections_for(db) if db is not None else 0
        if max_db and not self._room(pool, max_db + own,
                                     lambda p: p.database == pool.database):
            return False
        max_user = self.config.max_user_connections_for(pool.user)
        if max_user and not self._room(pool, max_user + own, lambda p: p.user == pool.user):
            return False
        # workers = N: a slot from the supervisor (listener connections are not counted)
        return self.gate is None or bool(own) or self.gate.may_open(pool)

    def _room(self, pool: Pool[S], limit: int, match: Callable[[Pool[S]], bool]) -> bool:
        pools = [p for p in self.pools.values() if match(p)]
        if sum(p.server_count + (p.board.open_links if p.board else 0) for p in pools) < limit:
            return True
        for other in pools:
            if other is not pool and other.idle and not other.waiting:
                server = other.idle.popleft()
                reason = "evicted for another pool at a connection limit"
                if self.gate is None:
                    server.close(reason)
                else:  # workers = N: its slot goes once PostgreSQL closed (workers/slots.py)
                    server.close(reason, wait=True)
                return True
        return False

    def free(self, pool: Pool[S]) -> None:
        """Forget an unused pool (autodb_idle_timeout), closing its idle servers."""
        pool.close_idle("autodb_idle_timeout")
        if pool.board is not None:
            pool.board.close("autodb_idle_timeout")
        self.pools.pop((pool.database, pool.user), None)
        if not self.pools_of(pool.database):
            self.databases.pop(pool.database, None)

    def tick(self, now: float) -> None:
        """The janitor's visit to every pool."""
        for pool in list(self.pools.values()):
            pool.tick(now)
        if self.gate is not None:
            self.gate.tick()

    def pools_of(self, database: str | None) -> list[Pool[S]]:
        """The pools of one database, or all of them."""
        return [p for p in self.pools.values() if database is None or p.database == database]

    def pause(self, database: str | None = None, close_servers: bool = False) -> None:
        """Lend no server (of one database, or any) until resume."""
        if database is None:
            self.paused = True
        else:
            self.paused_databases.add(database)
        for pool in self.pools_of(database):
            pool.pause(close_servers)
            if pool.board is not None:  # notifications wait in PostgreSQL's queue
                pool.board.hold(True)

    def resume(self, database: str | None = None) -> None:
        """Undo a global pause (databases paused by name stay paused), or one database's."""
        if database is None:
            self.paused = False
        else:
            self.paused_databases.discard(database)
        for pool in self.pools_of(database):
            if not self.paused and pool.database not in self.paused_databases:
                pool.resume()

    def refuse_waiting(self, error: PgtarnError) -> None:
        """From now on no client waits for a server: those waiting, and those that ask for
        one later, get error (the shutdown that waits for servers)."""
        self.refusal = error
        for pool in self:
            pool.refuse_waiting(error)

    def is_paused(self, database: str) -> bool:
        return self.paused or database in self.paused_databases

    def apply(self, config: Config) -> None:
        """Take a reloaded config: sizes and modes now, changed connection strings on release."""
        self.config = config
        for pool in self.pools.values():
            db = config.find_database(pool.database)
            if db is None:
                continue
            self._configure(pool, db)
            self.databases[db.name] = db
            if db.server_identity != pool.connstr:
                pool.connstr = db.server_identity
                for server in pool.servers():
                    server.close_needed = True
                pool.close_idle("connection string changed")
                if pool.board is not None:
                    pool.board.restart("connection string changed")
            while len(pool.idle) and pool.server_count > pool.pool_size:
                pool.idle.popleft().close("pool_size lowered by reload")


def _first(value: float | None, default: float) -> float:
    """A per-database or per-user setting when set, else the global one."""
    return default if value is None else value
