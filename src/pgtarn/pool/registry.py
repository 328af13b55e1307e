"""(database, user) -> Pool, the limits that span pools, and applying a reloaded Config."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Generic, Protocol

from ..config.settings import Config, DatabaseEntry, UserEntry
from ..errors import PgtarnError
from .channels import ChannelBoard, ListenerLink, SchemaWatch
from .hosts import HostSet
from .pool import ClientTimeouts, Pool, S, ServerGate
from .split import Split
from .state import HandOffs


class Closable(Protocol):
    """A health checker, as the registry keeps it (server/health.py)."""

    def close(self) -> None: ...


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
        #: Hands off servers given to waiting clients outside their own read, once the
        #: callback is over (Pool.defer; the runtime's; None: they are lent at once).
        self.defer: HandOffs | None = None
        #: schema_change_channel: called at each schema change the pools' listener
        #: connections hear of (the runtime renews its shared prepared statements).
        self.schema_changed: Callable[[], None] | None = None
        self._schema_watch: SchemaWatch | None = None
        #: Opens a pool's listener connection (given by the app, as launch).
        self.open_listener: (
            Callable[[Pool[S], DatabaseEntry, ChannelBoard], ListenerLink] | None
        ) = None
        self.databases: dict[str, DatabaseEntry] = {}
        self.paused = False
        #: Databases paused by PAUSE db / KILL db, and refusing new clients by DISABLE db.
        self.paused_databases: set[str] = set()
        self.disabled: set[str] = set()
        #: A shutdown that waits for servers: clients asking for a server get this error.
        self.refusal: PgtarnError | None = None
        #: workers = N: server slots shared with the other workers (None: a single process).
        self.gate: SharedGate | None = None
        #: read_write_split: the HostSet of each list of servers (by hosts_key), its health
        #: checker (started by the app's start_health) and the splits that use it.
        self.hostsets: dict[str, HostSet] = {}
        self.checkers: dict[str, Closable] = {}
        self.splits: dict[str, list[Split[Pool[S]]]] = {}
        self.start_health: Callable[[HostSet, Pool[S], DatabaseEntry], Closable] | None = None
        #: The replicas' pools of every split (their home pools are in pools).
        self.replica_pools: list[Pool[S]] = []

    def __iter__(self) -> Iterator[Pool[S]]:
        """Every pool, the replicas' too."""
        return iter([*self.pools.values(), *self.replica_pools])

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
            pool.defer = self.defer
            pool.last_used = pool.clock()
            self.pools[key] = pool
            if db.read_write_split != "off":
                self._split(pool, db)
        self.databases[db.name] = db
        return pool

    def watch_schema(self, pool: Pool[Any]) -> None:
        """schema_change_channel: the pool's listener connection LISTENs to it for pgtarn
        (once per pool; from a client's login on, when the pool's servers log in)."""
        channel = self.config.schema_change_channel
        board = pool.board
        if not channel or board is None or self.schema_changed is None:
            return
        watch = self._schema_watch
        if watch is None or watch.channel != channel:
            watch = self._schema_watch = SchemaWatch(channel, self.schema_changed)
        if watch not in board.subscribers.get(channel, ()):
            board.update(watch, frozenset(), frozenset((channel,)), pool.clock())

    # --- read_write_split ---------------------------------------------------------------------

    def _split(self, home: Pool[S], db: DatabaseEntry) -> None:
        """Give a split database's home pool its Split, and the HostSet of its servers its
        health checker (the first pool of those servers lends it its credentials)."""
        key = hosts_key(db)
        hosts = self.hostsets.get(key)
        if hosts is None:
            hosts = self.hostsets[key] = HostSet(
                db.name,
                db.targets(self.config.unix_socket_dir),
                period=db.health_check_period,
                max_lag_bytes=db.max_replica_lag_bytes,
                max_lag_seconds=db.max_replica_lag_seconds,
            )
            if self.start_health is not None:
                self.checkers[key] = self.start_health(hosts, home, db)
        split: Split[Pool[S]] = Split(
            hosts,
            home,
            lambda index: self._replica_pool(home, index),
            mode=db.read_write_split,
            primary_reads=db.primary_reads,
            read_your_writes=db.read_your_writes,
        )
        home.split = split
        self.splits.setdefault(key, []).append(split)
        hosts.changed.append(split.hosts_changed)
        split.hosts_changed(hosts)

    def _replica_pool(self, home: Pool[S], index: int) -> Pool[S]:
        """The pool of a split's replica (made on first read routed to it)."""
        split = home.split
        assert split is not None
        pool: Pool[S] = Pool(home.database, home.user, pool_size=0, pool_mode=home.pool_mode)
        db = self.databases[home.database]
        self._configure(pool, db)
        pool.split = split
        pool.host_index = index
        host = split.hosts.hosts[index]
        pool.connstr = f"{db.server_identity}@{host.key}"  # (apply compares it)
        pool.scram_keys = home.scram_keys
        pool.welcome = home.welcome
        pool.refusal = self.refusal
        if home.paused:
            pool.pause(close_servers=home.pause_closes)
        if self.launch is not None:
            pool.launch = self._launcher(db)
        pool.may_open = self.may_open
        pool.gate = self.gate
        pool.defer = self.defer
        pool.last_used = pool.clock()
        self.replica_pools.append(pool)
        return pool

    def _unsplit(self, home: Pool[S], reason: str) -> None:
        """A home pool leaves its split (freed, or a reload changed its servers or turned the
        split off): its replicas' pools close, and the checker when no split is left."""
        split = home.split
        if split is None:
            return
        home.split = None
        for pool in split.replicas.values():
            pool.close_idle(reason)
            for server in pool.servers():
                server.close_needed = True
            if pool in self.replica_pools:
                self.replica_pools.remove(pool)
        hosts = split.hosts
        if split.hosts_changed in hosts.changed:
            hosts.changed.remove(split.hosts_changed)
        for key, splits in list(self.splits.items()):
            if split in splits:
                splits.remove(split)
                if not splits:
                    del self.splits[key]
                    self.hostsets.pop(key, None)
                    checker = self.checkers.pop(key, None)
                    if checker is not None:
                        checker.close()

    def close_checks(self) -> None:
        """Shutdown: every health checker stops."""
        for checker in self.checkers.values():
            checker.close()
        self.checkers.clear()

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
        pool.login_retry = max(pool.retry_cap, config.server_login_retry)
        pool.wait_notify = float(config.query_wait_notify)
        pool.lifetime = _first(db.server_lifetime, config.server_lifetime)
        pool.reset_query_always = (
            config.server_reset_query if config.server_reset_query_always else None
        )
        pool.idle_timeout = config.server_idle_timeout
        # made from `*` (autodb_idle_timeout frees it), not a NAME_ro alias of an entry
        pool.auto = db.name not in config.databases and not db.reads_only
        user = config.users.get(pool.user) or UserEntry(pool.user)
        # the user's entry over the database's over the global setting, as PgBouncer
        pool.wait_timeout = _first(
            user.query_wait_timeout, _first(db.query_wait_timeout, config.query_wait_timeout)
        )
        pool.client_timeouts = ClientTimeouts(
            query=_first(user.query_timeout, config.query_timeout),
            transaction=_first(user.transaction_timeout, config.transaction_timeout),
            idle_transaction=_first(user.idle_transaction_timeout, config.idle_transaction_timeout),
            idle=_first(user.client_idle_timeout, config.client_idle_timeout),
        )

    def _launcher(self, first: DatabaseEntry) -> Callable[[Pool[S]], S]:
        launch = self.launch
        assert launch is not None

        def launch_current(pool: Pool[S]) -> S:
            return launch(pool, self.server_entry(pool, first))

        return launch_current

    def _listener_opener(
        self, pool: Pool[S], first: DatabaseEntry
    ) -> Callable[[ChannelBoard], ListenerLink] | None:
        open_listener = self.open_listener
        if open_listener is None:
            return None

        def open_current(board: ChannelBoard) -> ListenerLink:
            return open_listener(pool, self.server_entry(pool, first), board)

        return open_current

    def server_entry(self, pool: Pool[S], first: DatabaseEntry) -> DatabaseEntry:
        """The entry a new connection of pool (a server, its listener) connects with: the
        current one (a reload may have changed it since the pool was made), and with
        read_write_split the primary for the home pool (NOTIFY reaches only the primary's
        listeners), the replica's host for a replica's pool."""
        db = self.databases.get(pool.database, first)
        split = pool.split
        if split is not None:
            db = (
                _replica_entry(db, split, pool.host_index)
                if pool.host_index >= 0
                else _write_entry(db, split)
            )
        return db

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
        if max_db and not self._room(pool, max_db + own, lambda p: p.database == pool.database):
            return False
        max_user = self.config.max_user_connections_for(pool.user)
        if max_user and not self._room(pool, max_user + own, lambda p: p.user == pool.user):
            return False
        # workers = N: a slot from the supervisor (listener connections are not counted)
        return self.gate is None or bool(own) or self.gate.may_open(pool)

    def _room(self, pool: Pool[S], limit: int, match: Callable[[Pool[S]], bool]) -> bool:
        pools = [p for p in self if match(p)]
        if sum(p.server_count + (p.board.open_links if p.board else 0) for p in pools) < limit:
            return True
        for other in pools:
            if other is not pool and other.idle and not other.waiting:
                server = other.idle.pop(0)
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
        self._unsplit(pool, "autodb_idle_timeout")
        if not self.pools_of(pool.database):
            self.databases.pop(pool.database, None)

    def tick(self, now: float) -> None:
        """The janitor's visit to every pool."""
        for pool in list(self.pools.values()):
            pool.tick(now)
            if pool.replication is not None:
                pool.replication.tick(now)
        if self.gate is not None:
            self.gate.tick()

    def pools_of(self, database: str | None) -> list[Pool[S]]:
        """The pools of one database, or all of them."""
        return [p for p in self if database is None or p.database == database]

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
        for pool in self:  # a failing pool tries again at once: its credentials may be fixed
            pool.retry_at = 0.0
        for pool in self.replica_pools:
            db = config.find_database(pool.database)
            if db is None or pool.split is None:
                continue
            self._configure(pool, db)
            connstr = f"{db.server_identity}@{pool.split.hosts.hosts[pool.host_index].key}"
            if connstr != pool.connstr:  # new credentials: servers close as the home pool's
                pool.connstr = connstr
                pool.close_idle("connection string changed")
        for pool in list(self.pools.values()):
            db = config.find_database(pool.database)
            if db is None:
                continue
            self._configure(pool, db)
            self.databases[db.name] = db
            self._resplit(pool, db)
            if db.server_identity != pool.connstr:
                pool.connstr = db.server_identity
                for server in pool.servers():
                    server.close_needed = True
                pool.close_idle("connection string changed")
                if pool.board is not None:
                    pool.board.restart("connection string changed")
            while len(pool.idle) and pool.server_count > pool.pool_size:
                pool.idle.pop(0).close("pool_size lowered by reload")

    def _resplit(self, pool: Pool[S], db: DatabaseEntry) -> None:
        """A reload: the split of a home pool follows its entry's keys and servers."""
        split = pool.split
        wanted = db.read_write_split != "off"
        if split is not None and (
            not wanted or self.hostsets.get(hosts_key(db)) is not split.hosts
        ):
            self._unsplit(pool, "read_write_split or the host list changed")
            split = None
        if split is None:
            if wanted:
                self._split(pool, db)
            return
        split.mode = db.read_write_split
        split.primary_reads = db.primary_reads
        split.read_your_writes = db.read_your_writes
        split.hosts.configure(
            db.health_check_period, db.max_replica_lag_bytes, db.max_replica_lag_seconds
        )


def _write_entry(db: DatabaseEntry, split: Split[Pool[S]]) -> DatabaseEntry:
    """A split's entry for a connection that may write: to the primary, or (none known)
    whichever host of the list takes writes."""
    primary = split.write_target()
    if primary is None:
        return replace(db, target_session_attrs="read-write")
    return replace(
        db,
        host=primary.host,
        hosts=(),
        port=primary.port,
        ports=(),
        target_session_attrs="read-write",
    )


def _replica_entry(db: DatabaseEntry, split: Split[Pool[S]], index: int) -> DatabaseEntry:
    """A split's entry for a replica's pool: that host alone (a promoted one serves reads
    too until the checks move them)."""
    host = split.hosts.hosts[index]
    return replace(
        db, host=host.host, hosts=(), port=host.port, ports=(), target_session_attrs=None
    )


def hosts_key(db: DatabaseEntry) -> str:
    """What makes two entries' servers the same (one HostSet, one health checker)."""
    return repr((db.hosts or (db.host,), db.ports or db.port, db.dbname))


def _first(value: float | None, default: float) -> float:
    """A per-database or per-user setting when set, else the global one."""
    return default if value is None else value
