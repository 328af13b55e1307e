"""The live state that connections share: config, auth_file entries, pools, cancel keys."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from mypy_extensions import mypyc_attr

from .auth.hba import HbaRules, IdentMaps
from .config.settings import ADMIN_DATABASES, RESERVED_AUTH_DBNAME, Config, DatabaseEntry
from .errors import PgtarnError
from .net.authpool import AuthPool
from .net.peers import PeerCancels
from .net.sockets import HostChooser, TcpOption, tcp_options
from .net.transport import SocketWatch, socket_watch
from .pool.handoffs import hand_off
from .pool.pool import Pool, PooledServer
from .pool.registry import Registry, SharedGate
from .pool.stats import PoolStats, Totals
from .proto.cancelkey import Key, index_of, make_key
from .proto.welcome import WelcomeCache
from .session.fifo import Fifo
from .session.prepared import StatementCache
from .views.protocols import ClientView, SecretSource, ServerView

log = logging.getLogger("pgtarn")

#: What a client is told when the configuration does not let it log in (PgBouncer's words).
CONFIG_ERROR = "bouncer config error"
#: At most this many secrets found by auth_query are kept for server logins.
FOUND_SECRETS = 10_000
#: At most this many distinct sets of client parameters are shared (Runtime.shared_params).
SHARED_PARAMS = 1024


@dataclass
class ReloadReport:
    """What a reload did: settings changed, and changes that take effect only at restart."""

    changed: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    error: str | None = None
    #: What the admin console is told besides (a SET whose TLS files cannot be loaded yet).
    warnings: list[str] = field(default_factory=list)


class Control(Protocol):
    """What the admin console asks of the running process."""

    def reload(self) -> ReloadReport: ...

    def apply(self, config: Config, source: str = "reload") -> ReloadReport: ...

    def shutdown(self, mode: str) -> None: ...


class Coordinator(Protocol):
    """A worker's link to its supervisor and the other workers (workers = N; see
    workers/link.py). Messages are JSON objects routed by their ``kind``."""

    index: int
    count: int

    def handle(
        self,
        kind: str,
        handler: Callable[
            [dict[str, Any], list[int]], dict[str, Any] | Awaitable[dict[str, Any]] | None
        ],
    ) -> None: ...

    def send(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None: ...

    def broadcast(self, message: dict[str, Any], others: bool = True) -> None: ...

    def to_worker(self, index: int, message: dict[str, Any]) -> None: ...

    async def ask_worker(
        self, index: int, message: dict[str, Any], timeout: float
    ) -> dict[str, Any] | None: ...

    # (5.0: workers/link.py's GATHER_TIMEOUT; compiled, a default of ... is refused as a float)
    async def gather(
        self, message: dict[str, Any], timeout: float = 5.0
    ) -> list[dict[str, Any]]: ...


class WorkerLimits(SharedGate, Protocol):
    """workers = N: the limits shared with the other workers (workers/slots.py): the pools'
    server slots, and client admission at login."""

    def take(
        self, client: object, database: str, user: str, admin: bool, limits: list[int]
    ) -> bool: ...

    async def admit(
        self, client: object, database: str, user: str, admin: bool, limits: list[int]
    ) -> str | None: ...

    def admitted(self, client: object) -> bool: ...

    def left(self, client: object) -> None: ...


class HandOffSteps:
    """The hand-offs of servers released outside their own read (pool/handoffs.py), run
    together once the reads under way are over: at the end of the loop's batch of reads
    (SocketWatch.after_reads), or soon."""

    __slots__ = ("later", "pending", "run_step", "watch")

    def __init__(self) -> None:
        #: (pool, server) in the order released; one released during the run is run too.
        self.pending: Fifo[tuple[Pool[Any], PooledServer]] = Fifo()
        self.watch: SocketWatch | None = None  # the running loop's, found at the first ask
        self.run_step: Callable[[], None] = self.run  # (one bound method, kept)
        #: Tests without a loop: what calls run once "the reads are over".
        self.later: Callable[[Callable[[], None]], None] | None = None

    def due(self, pool: Pool[Any], server: Any) -> None:
        pending = self.pending
        pending.append((pool, server))
        if len(pending) > 1:
            return
        later = self.later
        if later is not None:
            later(self.run_step)
            return
        watch = self.watch
        if watch is None:
            watch = self.watch = socket_watch(asyncio.get_running_loop())
        watch.after_reads(self.run_step)

    def run(self) -> None:
        """Every hand-off due."""
        pending = self.pending
        while pending:
            pool, server = pending.popleft()
            try:
                hand_off(pool, server)
            except Exception:  # (a client failed taking its server: the others go on)
                log.exception("%r: a hand-off of %r failed", pool, server)


#: Makes the auth_query lookup for (target database, auth_user, query); given by the app.
LookupFactory = Callable[["Runtime", DatabaseEntry, str, str], SecretSource]


# Compiled, so that the connections' calls at each login (new_key, add_client, shared_params,
# ...) are C calls; the tests' doubles subclass it.
@mypyc_attr(allow_interpreted_subclasses=True)
class Runtime:
    """Everything a client or server connection needs from the running pooler.

    It holds connections only through the views (``views/protocols.py``): the connection layers sit
    above it and the composition root wires in what must be made (servers, lookups).
    """

    def __init__(self, config: Config, userlist: dict[str, str]) -> None:
        self.config = config
        #: tcp_options(config), for each new connection (App.apply renews it with config).
        self.tcp_options: tuple[TcpOption, ...] = tcp_options(config)
        self.userlist = userlist
        self.registry: Registry[PooledServer] = Registry(config)
        #: Servers released to waiting clients are lent once the callback is over.
        self.handoffs = HandOffSteps()
        self.registry.defer = self.handoffs
        #: Every client connection, from accept to close (max_client_conn counts these), by
        #: the BackendKeyData key it gets at accept (new_key), folded (cancelkey.index_of):
        #: the one index of clients, which CancelRequest routing looks keys up in too
        #: (client_by_key). One dict entry and one small int per client, where a set of
        #: clients and a dict of keys took two entries and a larger int (thousands of idle
        #: clients).
        self.clients: dict[int, ClientView] = {}
        #: Clients still logging in (SHOW LISTS' login_clients), and admin console sessions.
        self.logins: set[ClientView] = set()
        self.admin_clients: set[ClientView] = set()
        #: CancelRequests sent on to the other pgtarn of [peers] (SHOW PEER_POOLS).
        self.peers = PeerCancels()
        self.ids: Iterator[int] = itertools.count(1)
        #: Prepared statements by text, shared by every client (transaction mode).
        self.statement_cache = StatementCache()
        self.registry.schema_changed = self.statement_cache.schema_changed
        #: Which host of a [databases] entry's list a new connection tries first.
        self.hosts = HostChooser()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.accepting = True
        #: A shutdown is under way (not the drain after a --reboot handover, whose clients
        #: are still served): the unix socket takes admin console logins only.
        self.console_only = False
        #: In a worker of workers = N, its link to the supervisor; None in a single process.
        self.coordinator: Coordinator | None = None
        #: In a worker of workers = N, the limits it shares with the others; None alone.
        self.limits: WorkerLimits | None = None
        self.on_client_gone: Callable[[], None] = lambda: None
        #: During a rolling restart (reboot.py), in the new process: sends a CancelRequest
        #: whose key is not ours to the old process, whose client it may be.
        self.forward_cancel: Callable[[tuple[int, int]], None] | None = None
        self.control: Control | None = None
        self.started = time.monotonic()
        #: SUSPEND: no socket is read until RESUME.
        self.suspended = False
        #: Admin console traffic, shown as the "pgbouncer" database.
        self.admin_stats = PoolStats()
        #: Per database: totals at the end of the last stats period, and that period's
        #: averages (SHOW STATS, log_stats).
        self.period_totals: dict[str, Totals] = {}
        self.averages: dict[str, Totals] = {}
        self.overall_averages = Totals()
        #: TLS towards clients and towards PostgreSQL (None: off), made from the settings
        #: at start and at each RELOAD.
        self.client_tls: ssl.SSLContext | None = None
        self.server_tls: ssl.SSLContext | None = None
        #: tls-server-end-point data of pgtarn's own certificate (SCRAM-SHA-256-PLUS).
        self.client_tls_binding: bytes | None = None
        #: auth_query lookups by (target database, host, port, dbname, auth_user, query),
        #: made by make_lookup (None: auth_query cannot be used).
        self.lookups: dict[tuple[object, ...], SecretSource] = {}
        self.make_lookup: LookupFactory | None = None
        #: What auth_query found, by (database, user), kept across RELOADs: a pool's new
        #: servers log in with it.
        self.found_secrets: OrderedDict[tuple[str, str], str] = OrderedDict()
        #: (parameter, value a client started with) -> the form a server reported it in, for
        #: the parameters proto/parameters.py has no rule for (TimeZone's spelling).
        self.reported_forms: dict[tuple[str, str], str] = {}
        #: Clients whose tracked parameters are the same share one dict (see shared_params).
        self.params_forms: dict[frozenset[tuple[str, str]], dict[str, str]] = {}
        #: The pools' welcomes by what they are made of (made once, not at each login).
        self.welcomes = WelcomeCache()
        #: auth_hba_file and auth_ident_file, parsed (None: not set).
        self.hba: HbaRules | None = None
        self.ident: IdentMaps | None = None
        #: The threads that run LDAP binds, made at the first (client/passcheck.py).
        self.auth_pool: AuthPool | None = None

    def servers(self) -> list[ServerView]:
        """Every pool's servers, as the layers below see them: the registry knows a server
        only as the pool's base class of one (PooledServer)."""
        return [cast(ServerView, s) for pool in self.registry for s in pool.servers()]

    def shared_params(self, params: dict[str, str]) -> dict[str, str]:
        """The one dict of a client's tracked parameters for every client with the same values.

        A client's dict is replaced on a change, never written (ClientLink.parameter_changed),
        so sharing it is safe. It saves the dict per client, and a server that holds one
        client's values is known to hold the next one's without comparing (server.link).
        """
        key = frozenset(params.items())
        shared = self.params_forms.get(key)
        if shared is None:
            if len(self.params_forms) >= SHARED_PARAMS:  # many distinct sets: start again
                self.params_forms.clear()
            shared = self.params_forms[key] = params
        return shared

    # --- clients by key -------------------------------------------------------------------------

    def new_key(self) -> Key:
        """A BackendKeyData key for a new client (proto/cancelkey.py: peer_id, this worker),
        whose index no client here has."""
        coordinator = self.coordinator
        worker = None if coordinator is None else coordinator.index
        while True:
            key = make_key(self.config.peer_id, worker)
            if index_of(key) not in self.clients:
                return key

    def add_client(self, key: Key, client: ClientView) -> bool:
        """client (accepted, with its key: key) is one of this process's clients; False if its
        key's index is another client's (a key that came with a handed-over client). The key
        is passed: a ClientView's attribute is a lookup by name where the caller's is not."""
        index = index_of(key)
        if index in self.clients:
            return self.clients[index] is client
        self.clients[index] = client
        return True

    def remove_client(self, key: Key, client: ClientView) -> bool:
        """client (with its key: key) is no longer one of this process's clients; False if it
        was not."""
        index = index_of(key)
        if self.clients.get(index) is not client:
            return False
        del self.clients[index]
        return True

    def has_client(self, client: ClientView) -> bool:
        return self.clients.get(index_of(client.cancel_key)) is client

    def key_taken(self, key: Key) -> bool:
        """Some client here has key's index (a handed-over client's key cannot be kept)."""
        return index_of(key) in self.clients

    def client_by_key(self, key: Key) -> ClientView | None:
        """The client this process gave key to (a CancelRequest's), if it is still here."""
        client = self.clients.get(index_of(key))
        return client if client is not None and client.cancel_key == key else None

    def forget_secret(self, user: str) -> None:
        """A password failed for a secret auth_query found: ask again next time. Every
        lookup forgets it (a few; the one that found it may have been replaced since)."""
        for lookup in self.lookups.values():
            lookup.forget(user)

    def _auth_target(self, db: DatabaseEntry | None) -> tuple[DatabaseEntry, str] | None:
        """Where auth_query looks up the users of db (None: the admin console), as
        PgBouncer: (the database, auth_user); None when it has no auth_user. Refused when
        that database is not configured, disabled, or the admin console."""
        config = self.config
        auth_user = (db.auth_user if db is not None else None) or config.auth_user
        if not auth_user:
            return None
        target_name = (db.auth_dbname if db is not None else None) or config.auth_dbname
        if not target_name:  # the client's own database
            if db is not None:
                return db, auth_user
            target_name = ADMIN_DATABASES[0]  # which is no database of PostgreSQL's
        if config.is_admin_database(target_name):
            # the detail is for the log; the client gets PgBouncer's words
            log.error(RESERVED_AUTH_DBNAME.format(target_name))
            raise PgtarnError(CONFIG_ERROR, sqlstate="08006")
        target = config.find_database(target_name)
        if target is None:
            log.error('authentication database "%s" is not configured', target_name)
            raise PgtarnError(CONFIG_ERROR, sqlstate="08006")
        if target.name in self.registry.disabled:
            raise PgtarnError(
                f'authentication database "{target_name}" is disabled', sqlstate="08P01"
            )
        return target, auth_user

    def secret_lookup(self, db: DatabaseEntry | None) -> SecretSource | None:
        """The auth_query lookup for logins to db (None: the admin console); None when it
        has no auth_user. A PgtarnError refuses the login (_auth_target)."""
        if self.make_lookup is None:
            return None
        target = self._auth_target(db)
        if target is None:
            return None
        database, auth_user = target
        query = (db.auth_query if db is not None else None) or self.config.auth_query
        key = (database.name, database.host, database.port, database.dbname, auth_user, query)
        lookup = self.lookups.get(key)
        if lookup is None:
            lookup = self.lookups[key] = self.make_lookup(self, database, auth_user, query)
        return lookup

    def found_secret(self, db: DatabaseEntry, user: str, secret: str) -> None:
        """auth_query found user's secret at a login to db: keep it for server logins."""
        key = (db.name, user)
        self.found_secrets[key] = secret
        self.found_secrets.move_to_end(key)
        while len(self.found_secrets) > FOUND_SECRETS:
            self.found_secrets.popitem(last=False)

    def looked_up(self, db: DatabaseEntry, user: str) -> str | None:
        """The secret auth_query last found for user, for logging in to PostgreSQL."""
        return self.found_secrets.get((db.name, user))

    def close_lookups(self, shutdown: bool = False) -> None:
        """RELOAD (auth_user, auth_query or their databases may have changed): new logins get
        new lookups, the old ones finish what they were asked. Shutdown: all end now."""
        lookups, self.lookups = self.lookups, {}
        for lookup in lookups.values():
            if shutdown:
                lookup.close()
            else:
                lookup.retire()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a short-lived task that is kept referenced until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task
