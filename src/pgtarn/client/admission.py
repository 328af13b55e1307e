"""ClientAdmission: at a client's StartupMessage, whether it may log in and against which secret.

The order is PgBouncer's: max_client_conn; the startup parameters; the database; the client
limits (max_db_client_connections, max_user_client_connections: the admin console is a
database with the global limit, and its sessions count for their user, admin_users get past
both there only); the access rules and auth_type (access.py); the secret, from auth_file or,
for a user it does not name, from auth_query. auth_query's "no such role" refuses the login
at once ("no such user"), as PgBouncer does; the admin console's users are looked up through
the global auth_dbname.

An unknown database is told only after the password exchange (ClientConnection, when the
client authenticated): a client learns which databases exist only once it has proven who it
is. No lookup is made for it, so a user auth_file does not name fails as a wrong password.
"""

from __future__ import annotations

import logging

from ..config import ADMIN_DATABASES, DatabaseEntry
from ..errors import PgtarnError
from ..net.tls import certificate_name, describe, has_certificate
from ..proto.client_login import ClientLogin, Event, Startup, replication_mode
from ..runtime import WorkerLimits
from ..states import ClientState
from ..views import SecretSource
from .access import Connection, auth_method, peer_address
from .relay import ClientRelay

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


class ClientAdmission(ClientRelay):
    """The login's decisions that need the running pooler (see the module docstring)."""

    __slots__ = ()

    def _act(self, login: ClientLogin, events: list[Event]) -> None:
        """Do what the login machine asks (ClientConnection's)."""
        raise NotImplementedError

    def _startup_received(self, login: ClientLogin, startup: Startup) -> None:
        """Who may log in, and how: max_client_conn, the database, the client limits, the
        access rules, the secret."""
        limits = self.runtime.limits
        if limits is not None and not limits.admitted(self):
            # workers = N: the client limits count every worker's clients (a round trip)
            self.runtime.spawn(_admit(self, limits, login, startup))
            return
        config = self.runtime.config
        database = startup.database
        admin = config.is_admin_database(database)
        limit = config.max_client_conn + (ADMIN_RESERVE if admin else 0)
        local_admin = admin and startup.user == "pgbouncer" and self._same_os_user()
        if len(self.runtime.clients) > limit and not local_admin:
            raise PgtarnError(
                "no more connections allowed (max_client_conn)", sqlstate="53300"
            )
        ignored: tuple[str, ...] = (*config.ignore_startup_parameters, "replication")
        if "replication" in startup.params:
            kind = replication_mode(startup.params["replication"])
            if kind:
                self.replication = kind  # (only then: it lives in the client's extras)
                if admin:
                    raise PgtarnError("replication connections to the admin console are not "
                                      "supported", sqlstate="08P01")
                # its own server takes every parameter (replication_params)
                ignored = tuple(startup.params)
        refused = login.check_startup(self.tracked_names(), ignored)
        if refused is not None:
            self._act(login, [refused])
            return
        user = self.user = startup.user
        self.database = database
        self.admin_login = admin
        if config.log_connections:
            log.info("%r login attempt: db=%s user=%s tls=%s", self, database, user,
                     describe(self.tls) or "no")
        if local_admin:
            # As PgBouncer: the OS user running the pooler, over the unix socket.
            self.local_admin = True
            self._begin_auth(login, "any", None)
            return
        if not admin and self.runtime.console_only:
            # a shutdown keeps the unix socket for the console
            raise PgtarnError("pooler is shutting down", sqlstate="57P03")
        db = self.db = None if admin else config.find_database(database)
        known = admin or db is not None  # (an unknown database: told after the password)
        if known:
            self._check_client_limits(db, user)
        connection = Connection(
            local=self.addr == "unix", tls=self.tls is not None,
            address=peer_address(self.addr), certificate=has_certificate(self.tls),
            certificate_name=certificate_name(self.tls),
            os_user=self._peer_os_user)
        try:
            auth_type = auth_method(config, self.runtime.hba, self.runtime.ident, connection,
                                    database, user, self.replication == "physical")
        except PgtarnError as refusal:
            log.info("%r login refused: %s", self, refusal.message)
            raise
        secret = self.runtime.userlist.get(user)
        if secret is None and known and auth_type in LOOKED_UP:
            lookup = self.runtime.secret_lookup(db)  # (None: the admin console)
            if lookup is not None:
                # auth_query: the challenge (its salt) waits for the secret
                self.state = ClientState.AUTH
                self.looked_up = True
                self.runtime.spawn(self._look_up(lookup, auth_type, user))
                self._act(login, login.await_secret())
                return
        self._begin_auth(login, auth_type, secret)

    def _check_client_limits(self, db: DatabaseEntry | None, user: str) -> None:
        """max_db_client_connections and max_user_client_connections of db (None: the admin
        console), as PgBouncer: this client counts; admin_users are let past both on the
        admin console."""
        config = self.runtime.config
        if db is None:
            if user in config.admin_users:
                return
            max_db = config.max_db_client_connections
        else:
            max_db = config.max_db_client_connections_for(db)
        max_user = config.max_user_client_connections_for(user)
        if not max_db and not max_user:
            return
        clients = self.runtime.clients.values()
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
        try:
            secret = await lookup.secret(user)
            login = self.login
            if self.state is ClientState.AUTH and login is not None and login.awaiting_secret:
                # still there, still waiting
                if secret is None:  # PgBouncer's answer: its mock login skips auth_query
                    lookup.forget(user)  # (a role made next is found at its next login)
                    self.login_failed()
                    raise PgtarnError("no such user", sqlstate="28000")
                if secret and self.db is not None:
                    self.runtime.found_secret(self.db, user, secret)
                self._begin_auth(login, auth_type, secret)
        except PgtarnError as error:
            self.close(error)

    def _begin_auth(self, login: ClientLogin, auth_type: str, secret: str | None) -> None:
        """Send the first authentication message (a challenge, or AuthenticationOk)."""
        self.state = ClientState.AUTH
        self._act(login, login.begin_auth(auth_type, secret,
                                          self.runtime.config.scram_iterations))

    def login_failed(self) -> None:
        """The log line of a refused login (log_connections), in PgBouncer's words."""
        if self.runtime.config.log_connections:
            log.info("%r login failed: db=%s user=%s", self, self.database, self.user)

    def tracked_names(self) -> tuple[str, ...]:
        return TRACKED_DEFAULT + tuple(self.runtime.config.track_extra_parameters)


async def _admit(client: ClientAdmission, limits: WorkerLimits, login: ClientLogin,
                 startup: Startup) -> None:
    """workers = N: the supervisor says whether the client limits let one more client in
    (this worker's clients, counted here, and the other workers'); then the login goes on."""
    config = client.runtime.config
    database, user = startup.database, startup.user
    admin = config.is_admin_database(database)
    local_admin = admin and user == "pgbouncer" and client._same_os_user()
    max_clients = 0 if local_admin else config.max_client_conn + (
        ADMIN_RESERVE if admin else 0)
    db = None if admin else config.find_database(database)
    if db is not None:
        database = db.name
    # as _check_client_limits: an unknown database and the operator are not limited
    exempt = local_admin or (admin and user in config.admin_users) or (not admin and db is None)
    max_db = 0 if exempt else (config.max_db_client_connections if db is None
                               else config.max_db_client_connections_for(db))
    max_user = 0 if exempt else config.max_user_client_connections_for(user)
    clients = client.runtime.clients.values()
    if admin:  # the console's two names are one database
        database = ADMIN_DATABASES[0]
        local_db = 1 + sum(1 for c in clients if config.is_admin_database(c.database)) \
            if max_db else 0
    else:
        local_db = 1 + sum(1 for c in clients if c.database == database) if max_db else 0
    local_user = 1 + sum(1 for c in clients if c.user == user) if max_user else 0
    refused = await limits.admit(client, database, user, False,
                                 [max_clients, max_db, max_user, len(clients), local_db,
                                  local_user])
    if client.state is ClientState.CLOSED:
        limits.left(client)
        return
    try:
        if refused is not None:
            raise PgtarnError(REFUSALS.get(refused, f"no more connections allowed "
                                                    f"({refused})"), sqlstate="53300")
        client._startup_received(login, startup)
    except PgtarnError as error:
        client.close(error)
