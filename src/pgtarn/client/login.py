"""ClientLoginDriver: a client's login, from its first packet until it authenticated.

The connection owns one from accept and drops it at the welcome, so an idle client holds
none. The driver feeds the client's bytes to the sans-IO machine (proto/client_login.py)
and acts on its events: the TLS wrap, a CancelRequest handed on, the StartupMessage's
decisions, a PAM or LDAP check (passcheck.py). Once the password exchange succeeded the
connection takes over (LoginClient.authenticated: the pool or the admin console); a
failure closes it. The driver talks to its connection through interfaces.LoginClient.

At the StartupMessage, whether the client may log in and against which secret, in
PgBouncer's order: max_client_conn; the startup parameters; the database; the client
limits (max_db_client_connections, max_user_client_connections: the admin console is a
database with the global limit, and its sessions count for their user, admin_users get past
both there only); the access rules and auth_type (access.py); the secret, from auth_file
or, for a user it does not name, from auth_query. auth_query's "no such role" refuses the
login at once ("no such user"), as PgBouncer does; the admin console's users are looked up
through the global auth_dbname.

An unknown database is told only after the password exchange (by the connection, once the
client authenticated): a client learns which databases exist only once it has proven who
it is. No lookup is made for it, so a user auth_file does not name fails as a wrong
password.
"""

from __future__ import annotations

import logging
from typing import Final, assert_never

from ..config.settings import ADMIN_DATABASES, Config, DatabaseEntry
from ..errors import AuthFailed, PgtarnError
from ..net.tls import ALPN, certificate_name, describe, has_certificate
from ..proto.client_login import (
    Authenticated,
    CancelRequested,
    CheckPassword,
    ClientLogin,
    Close,
    Event,
    Failed,
    Send,
    Startup,
    StartupReceived,
    TlsRequested,
    replication_mode,
)
from ..runtime import WorkerLimits
from ..views.protocols import SecretSource
from ..views.states import ClientState
from .access import Connection, auth_method, fixed_method, peer_address
from .interfaces import LoginClient
from .passcheck import check_password

log = logging.getLogger("pgtarn.client")

TRACKED_DEFAULT = (
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
)
#: Methods that need the user's secret, which auth_query may find when auth_file has none.
LOOKED_UP = frozenset({"md5", "scram-sha-256", "plain", "trust", "any"})
#: Admin console logins allowed past max_client_conn, so an operator can get in when full.
ADMIN_RESERVE = 10
#: What a client refused by a limit counted across workers is told (PgBouncer's words).
REFUSALS = {
    "max_client_conn": "no more connections allowed (max_client_conn)",
    "max_db_client_connections": "client connections exceeded (max_db_client_connections)",
    "max_user_client_connections": "client connections exceeded (max_user_client_connections)",
}


class LoginSettings:
    """What a login reads of its configuration, read once per Config.

    A Config is an interpreted frozen dataclass: compiled code reads each of its fields
    through the generic attribute lookup (about 450 instructions), and its methods are
    Python calls; a login read nine fields and called four methods. Here they are C fields
    and a plain dictionary, made again when the runtime's Config is another (RELOAD, SET)."""

    __slots__ = (
        "auth_type",
        "client_limits",
        "config",
        "databases",
        "ignored",
        "log_connections",
        "log_disconnections",
        "login_notify_message",
        "max_client_conn",
        "not_admin",
        "scram_iterations",
        "tracked",
    )

    def __init__(self, config: Config) -> None:
        self.config = config
        #: The parameters a client's welcome reports and its links keep in step.
        self.tracked: tuple[str, ...] = TRACKED_DEFAULT + tuple(config.track_extra_parameters)
        #: Startup parameters a client may send that are not sent on ("replication": its
        #: own rules).
        self.ignored: tuple[str, ...] = (*config.ignore_startup_parameters, "replication")
        self.max_client_conn: int = config.max_client_conn
        self.log_connections: bool = bool(config.log_connections)
        self.log_disconnections: bool = bool(config.log_disconnections)
        self.login_notify_message: str = config.login_notify_message
        self.scram_iterations: int = config.scram_iterations
        #: The auth type of every login when no fact about its connection matters (None:
        #: access.auth_method decides each).
        self.auth_type: str | None = fixed_method(config)
        #: The databases by name as entries name them (aliases and `*`: find_database).
        self.databases: dict[str, DatabaseEntry] = {
            name: db for name, db in config.databases.items() if name != "*"
        }
        #: Names of the admin console that a database entry takes over.
        self.not_admin: frozenset[str] = frozenset(
            name for name in ADMIN_DATABASES if name in config.databases
        )
        #: Whether any client limit applies (max_db_client_connections,
        #: max_user_client_connections: global, a database's or a user's).
        self.client_limits: bool = bool(
            config.max_db_client_connections
            or config.max_user_client_connections
            or any(_positive(db.max_db_client_connections) for db in config.databases.values())
            or any(_positive(u.max_user_client_connections) for u in config.users.values())
        )

    def is_admin_database(self, name: str) -> bool:
        """Config.is_admin_database."""
        return name in ADMIN_DATABASES and name not in self.not_admin

    def find_database(self, name: str) -> DatabaseEntry | None:
        """Config.find_database: an entry of that name, else its read-only alias or `*`."""
        db = self.databases.get(name)
        return db if db is not None else self.config.find_database(name)


def _positive(limit: int | None) -> bool:
    return limit is not None and limit > 0


class _LastSettings:
    """The LoginSettings of the configuration last asked about."""

    __slots__ = ("settings",)

    def __init__(self) -> None:
        self.settings: LoginSettings | None = None


_LAST: Final = _LastSettings()


def login_settings(config: Config) -> LoginSettings:
    """config's LoginSettings (made once per Config)."""
    last = _LAST.settings
    if last is None or last.config is not config:
        last = _LAST.settings = LoginSettings(config)
    return last


def tracked_names(config: Config) -> tuple[str, ...]:
    """The parameters a client's welcome reports and its links keep in step."""
    return login_settings(config).tracked


class ClientLoginDriver:
    """One client's login (see the module docstring)."""

    __slots__ = ("admin_login", "client", "local_admin", "looked_up", "machine")

    def __init__(self, client: LoginClient) -> None:
        # The flags first: compiled, one-byte fields side by side pack together.
        #: It asked for the admin console (the client's db stays None).
        self.admin_login = False
        #: The pooler's own OS user over the unix socket, logging in to the admin console.
        self.local_admin = False
        #: The secret came from auth_query (forgotten when the password fails).
        self.looked_up = False
        self.client = client
        #: The login's state machine: bytes in, events out.
        self.machine = ClientLogin()

    def receive(self, data: bytes) -> None:
        """Bytes from the client while it logs in."""
        self.act(self.machine.receive_data(data))

    def act(self, events: list[Event]) -> None:
        """Do what the login machine asks, in order (PgtarnError: the login ends with it)."""
        client = self.client
        # isinstance, not match: compiled, a class pattern is a generic isinstance call and
        # each captured field a generic attribute read
        for index, event in enumerate(events):
            if isinstance(event, Send):
                if index + 1 < len(events) and isinstance(events[index + 1], Authenticated):
                    continue  # AuthenticationOk: the connection sends it with the welcome
                client.write(event.data)
            elif isinstance(event, StartupReceived):
                self._startup_received(event.startup)
            elif isinstance(event, Authenticated):
                last = events[index - 1] if index else None
                client.authenticated(event.scram_keys, last.data if isinstance(last, Send) else b"")
            elif isinstance(event, Failed):
                if isinstance(event.error, AuthFailed):
                    if self.looked_up:  # maybe changed
                        client.runtime.forget_secret(client.user)
                    self.login_failed()
                client.close(event.error, event.response)
            elif isinstance(event, TlsRequested):
                self._tls_requested(event.direct)
            elif isinstance(event, CancelRequested):
                client.cancel_request(event.key)
            elif isinstance(event, CheckPassword):  # PAM or an LDAP server (passcheck.py)
                check_password(self, event)
            elif isinstance(event, Close):
                if event.reason:
                    client.close_reason = event.reason  # logged when the connection is lost
                client.close()
            else:
                assert_never(event)

    # --- passcheck.py's side: a check's verdict ------------------------------------------------

    def waiting(self) -> bool:
        """Still this client's login, still authenticating (a check's verdict is wanted)."""
        client = self.client
        return client.login is self and client.state is ClientState.AUTH

    def password_checked(self, error: PgtarnError | None) -> None:
        self.act(self.machine.password_checked(error))

    # --- TLS ------------------------------------------------------------------------------------

    def _tls_requested(self, direct: bool) -> None:
        """Go on over TLS if it is offered here (not over a unix socket)."""
        client = self.client
        runtime = client.runtime
        context = runtime.client_tls
        if context is None or client.addr == "unix" or client.transport is None:
            self.act(self.machine.refuse_tls())
            return
        start = self.machine.accept_tls()
        if start.reply:
            client.write(start.reply)
        binding = runtime.client_tls_binding
        tls = client.wrap_tls(
            context, start.received, binding, lambda: self._tls_ready(direct), self._tls_failed
        )
        self.machine.tls_started(binding)
        tls.start()

    def _tls_ready(self, direct: bool) -> None:
        client = self.client
        tls = client.tls
        assert tls is not None
        if direct and tls.ssl_object.selected_alpn_protocol() != ALPN:
            # as PostgreSQL 17: direct TLS only with ALPN, so it cannot be mistaken for
            # another protocol's TLS
            client.close(
                PgtarnError(
                    "received direct SSL connection request without ALPN protocol negotiation "
                    "extension",
                    sqlstate="08P01",
                )
            )

    def _tls_failed(self, exc: Exception) -> None:
        client = self.client
        client.close_reason = f"TLS failed: {exc}"
        if client.runtime.config.log_connections:
            log.info("%r TLS failed: %s", client, exc)

    # --- the StartupMessage: who may log in, and how --------------------------------------------

    def _startup_received(self, startup: Startup) -> None:
        """Who may log in, and how: max_client_conn, the database, the client limits, the
        access rules, the secret."""
        client = self.client
        runtime = client.runtime
        limits = runtime.limits
        if limits is not None and not limits.admitted(client):
            # workers = N: the client limits count every worker's clients: a spare place of
            # this worker's, else a round trip to the supervisor
            database, user, numbers = client_limits(client, startup)
            # (admin False: console clients count for their user, as in a single process)
            if not limits.take(client, database, user, False, numbers):
                runtime.spawn(_admit(self, limits, startup, database, user, numbers))
                return
        settings = login_settings(runtime.config)
        database = startup.database
        admin = settings.is_admin_database(database)
        limit = settings.max_client_conn + (ADMIN_RESERVE if admin else 0)
        local_admin = admin and startup.user == "pgbouncer" and client.same_os_user()
        if len(runtime.clients) > limit and not local_admin:
            raise PgtarnError("no more connections allowed (max_client_conn)", sqlstate="53300")
        ignored = settings.ignored
        if "replication" in startup.params:
            kind = replication_mode(startup.params["replication"])
            if kind:
                client.replication = kind  # (only then: it lives in the client's extras)
                if admin:
                    raise PgtarnError(
                        "replication connections to the admin console are not supported",
                        sqlstate="08P01",
                    )
                # its own server takes every parameter (replication_params)
                ignored = tuple(startup.params)
        refused = self.machine.check_startup(settings.tracked, ignored)
        if refused is not None:
            self.act([refused])
            return
        user = client.user = startup.user
        client.database = database
        self.admin_login = admin
        if settings.log_connections:
            log.info(
                "%r login attempt: db=%s user=%s tls=%s",
                client,
                database,
                user,
                describe(client.tls) or "no",
            )
        if local_admin:
            # As PgBouncer: the OS user running the pooler, over the unix socket.
            self.local_admin = True
            self._begin_auth("any", None)
            return
        if not admin and runtime.console_only:
            # a shutdown keeps the unix socket for the console
            raise PgtarnError("pooler is shutting down", sqlstate="57P03")
        db = client.db = None if admin else settings.find_database(database)
        known = admin or db is not None  # (an unknown database: told after the password)
        if known and settings.client_limits:
            self._check_client_limits(db, user)
        auth_type = settings.auth_type
        if auth_type is None:
            auth_type = self._auth_method(settings.config, database, user)
        secret = runtime.userlist.get(user)
        if secret is None and known and auth_type in LOOKED_UP:
            lookup = runtime.secret_lookup(db)  # (None: the admin console)
            if lookup is not None:
                # auth_query: the challenge (its salt) waits for the secret
                client.state = ClientState.AUTH
                self.looked_up = True
                runtime.spawn(self._look_up(lookup, auth_type, user))
                self.act(self.machine.await_secret())
                return
        self._begin_auth(auth_type, secret)

    def _auth_method(self, config: Config, database: str, user: str) -> str:
        """The access rules' auth type for this client (access.auth_method), or its
        refusal, logged."""
        client = self.client
        runtime = client.runtime
        tls = client.tls
        connection = Connection(
            local=client.addr == "unix",
            tls=tls is not None,
            address=peer_address(client.addr),
            # (without TLS, no call: each is a Python call to net/tls.py)
            certificate=tls is not None and has_certificate(tls),
            certificate_name=None if tls is None else certificate_name(tls),
            os_user=client.peer_os_user,
        )
        try:
            return auth_method(
                config,
                runtime.hba,
                runtime.ident,
                connection,
                database,
                user,
                client.replication == "physical",
            )
        except PgtarnError as refusal:
            log.info("%r login refused: %s", client, refusal.message)
            raise

    def _check_client_limits(self, db: DatabaseEntry | None, user: str) -> None:
        """max_db_client_connections and max_user_client_connections of db (None: the admin
        console), as PgBouncer: this client counts; admin_users are let past both on the
        admin console."""
        runtime = self.client.runtime
        config = runtime.config
        if db is None:
            if user in config.admin_users:
                return
            max_db = config.max_db_client_connections
        else:
            max_db = config.max_db_client_connections_for(db)
        max_user = config.max_user_client_connections_for(user)
        if not max_db and not max_user:
            return
        clients = runtime.clients.values()
        if max_db:
            if db is None:
                count = sum(1 for c in clients if config.is_admin_database(c.database))
            else:
                name = db.name
                count = sum(1 for c in clients if c.database == name)
            if count > max_db:
                raise PgtarnError(REFUSALS["max_db_client_connections"], sqlstate="53300")
        if max_user and max_user < sum(1 for c in clients if c.user == user):
            raise PgtarnError(REFUSALS["max_user_client_connections"], sqlstate="53300")

    async def _look_up(self, lookup: SecretSource, auth_type: str, user: str) -> None:
        client = self.client
        try:
            secret = await lookup.secret(user)
            if self.waiting() and self.machine.awaiting_secret:
                # still there, still waiting
                if secret is None:  # PgBouncer's answer: its mock login skips auth_query
                    lookup.forget(user)  # (a role made next is found at its next login)
                    self.login_failed()
                    raise PgtarnError("no such user", sqlstate="28000")
                if secret and client.db is not None:
                    client.runtime.found_secret(client.db, user, secret)
                self._begin_auth(auth_type, secret)
        except PgtarnError as error:
            client.close(error)

    def _begin_auth(self, auth_type: str, secret: str | None) -> None:
        """Send the first authentication message (a challenge, or AuthenticationOk)."""
        client = self.client
        client.state = ClientState.AUTH
        iterations = login_settings(client.runtime.config).scram_iterations
        self.act(self.machine.begin_auth(auth_type, secret, iterations))

    def login_failed(self) -> None:
        """The log line of a refused login (log_connections), in PgBouncer's words."""
        client = self.client
        if client.runtime.config.log_connections:
            log.info("%r login failed: db=%s user=%s", client, client.database, client.user)

    def admin_role(self) -> str | None:
        """The admin console role its login gets: "admin", "stats" or None (refused)."""
        client = self.client
        config = client.runtime.config
        user = client.user
        if self.local_admin or user in config.admin_users:
            return "admin"
        if user in config.stats_users:
            return "stats"
        return None


def client_limits(client: LoginClient, startup: Startup) -> tuple[str, str, list[int]]:
    """workers = N: the pool's database name, the user, and the limits the supervisor checks:
    max_client_conn, max_db_client_connections, max_user_client_connections as they apply to
    this client (0: none), then this worker's own counts for them, this client included."""
    config = client.runtime.config
    database, user = startup.database, startup.user
    admin = config.is_admin_database(database)
    local_admin = admin and user == "pgbouncer" and client.same_os_user()
    max_clients = 0 if local_admin else config.max_client_conn + (ADMIN_RESERVE if admin else 0)
    db = None if admin else config.find_database(database)
    if db is not None:
        database = db.name
    # as _check_client_limits: an unknown database and the operator are not limited
    exempt = local_admin or (admin and user in config.admin_users) or (not admin and db is None)
    max_db = (
        0
        if exempt
        else (
            config.max_db_client_connections
            if db is None
            else config.max_db_client_connections_for(db)
        )
    )
    max_user = 0 if exempt else config.max_user_client_connections_for(user)
    clients = client.runtime.clients.values()
    if admin:  # the console's two names are one database
        database = ADMIN_DATABASES[0]
        local_db = (
            1 + sum(1 for c in clients if config.is_admin_database(c.database)) if max_db else 0
        )
    else:
        local_db = 1 + sum(1 for c in clients if c.database == database) if max_db else 0
    local_user = 1 + sum(1 for c in clients if c.user == user) if max_user else 0
    return (
        database,
        user,
        [max_clients, max_db, max_user, len(clients), local_db, local_user],
    )


async def _admit(
    login: ClientLoginDriver,
    limits: WorkerLimits,
    startup: Startup,
    database: str,
    user: str,
    numbers: list[int],
) -> None:
    """workers = N: the supervisor says whether the client limits let one more client in
    (this worker's clients, counted here, and the other workers'); then the login goes on."""
    client = login.client
    refused = await limits.admit(client, database, user, False, numbers)
    if client.state is ClientState.CLOSED:
        limits.left(client)
        return
    try:
        if refused is not None:
            raise PgtarnError(
                REFUSALS.get(refused, f"no more connections allowed ({refused})"), sqlstate="53300"
            )
        login._startup_received(startup)
    except PgtarnError as error:
        client.close(error)
