"""auth_query: a client's secret looked up in PostgreSQL, as auth_user, by a parameterized query.

Each target (database, auth_user, query) has one connection, opened on first use and kept;
lookups take turns on it. The user name is a bound parameter ($1), never part of the SQL text,
and the connection carries none of the client's startup parameters (PgBouncer's fix of
CVE-2025-12819), so nothing a client sends can change what the query runs; it has the
settings of auth_user and of its database, as any connection of that role has.

The answer tells "no such user" (no row: None) from a role without a password (a NULL
secret: "", which only auth_type = trust lets in). A query that fails is the configuration's
fault: the client is told PgBouncer's "bouncer config error", the log says why.

Found secrets are reused for AUTH_CACHE_SECONDS, then looked up again; a login that fails
with a cached secret drops it at once, so a changed password takes effect on the next try.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from ..config.settings import DatabaseEntry
from ..errors import LoginRefused, PgtarnError
from ..net.sockets import open_connection
from ..proto import build
from ..proto.framing import MessageScanner
from ..proto.messages import parse_data_row
from ..proto.msgtypes import ALL_TYPES, DATA_ROW, ERROR_RESPONSE, READY_FOR_QUERY
from ..proto.server_login import LOGIN_MAX, ServerAuth, ServerLogin, server_error
from ..runtime import CONFIG_ERROR, Runtime
from .login import OwnConnection

log = logging.getLogger("pgtarn.authquery")

AUTH_CACHE_SECONDS = 30.0
#: An unknown name is not asked about again this soon (someone probing names).
MISS_CACHE_SECONDS = 5.0
CACHE_SIZE = 10_000
#: The lookup connection's own startup parameters; nothing comes from clients.
STARTUP = {"application_name": "pgtarn auth_query"}
#: The secret of a role the query returns with a NULL password.
NO_PASSWORD = ""
_MAX_MESSAGE = 1024 * 1024


def _lookup_failed(reason: str) -> PgtarnError:
    return PgtarnError(f"could not look up the user: {reason}", sqlstate="08006")


def _config_error() -> PgtarnError:
    return PgtarnError(CONFIG_ERROR, sqlstate="08006")


class SecretLookup:
    """One auth_query target: its connection, its queue of names, its cache of answers."""

    def __init__(self, runtime: Runtime, db: DatabaseEntry, auth_user: str, query: str) -> None:
        self.runtime = runtime
        self.db = db
        self.auth_user = auth_user
        self.query = query
        self.cache: OrderedDict[str, tuple[str | None, float]] = OrderedDict()
        self.pending: OrderedDict[str, asyncio.Future[str | None]] = OrderedDict()
        self.asking: str | None = None
        self.conn: _LookupConnection | None = None
        self.closed = False
        #: Replaced by a RELOAD: answers what it was asked, then closes.
        self.retiring = False

    async def secret(self, user: str) -> str | None:
        """The secret PostgreSQL has for user (None: no such user; NO_PASSWORD: none)."""
        if self.closed:
            raise _lookup_failed("pgtarn is shutting down")
        cached = self.cache.get(user)
        if cached is not None and time.monotonic() < cached[1]:
            self.cache.move_to_end(user)
            return cached[0]
        future = self.pending.get(user)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self.pending[user] = future
            self._next()
        timeout = self.runtime.config.server_connect_timeout or 15.0
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            # the connection is stuck: everyone waiting gets the error, the next tries anew
            self.reset(_lookup_failed(f"no answer in {timeout:g} s"))
            raise _lookup_failed(f"no answer in {timeout:g} s") from None

    def forget(self, user: str) -> None:
        """A login failed with the cached secret: look it up again next time."""
        self.cache.pop(user, None)

    def close(self) -> None:
        self.closed = True
        self.reset(_lookup_failed("pgtarn is shutting down"))

    def retire(self) -> None:
        """A RELOAD made a new lookup for new logins: finish the pending ones, then close."""
        self.retiring = True
        self._next()

    def reset(self, error: PgtarnError) -> None:
        """Drop the connection and fail every waiting lookup with error."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()
        pending, self.pending = self.pending, OrderedDict()
        self.asking = None
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: waiters may have gone (timed out, closed)

    # --- the connection's reports -----------------------------------------------------------

    def _next(self) -> None:
        """Send the next queued name, opening the connection first if needed."""
        if self.closed or self.asking is not None:
            return
        if not self.pending:
            if self.retiring:
                self.close()
            return
        if self.conn is None:
            self.conn = _LookupConnection(self)
            self.runtime.spawn(self.conn.connect())
            return
        if self.conn.ready:
            self.asking = next(iter(self.pending))
            self.conn.ask(self.query, self.asking)

    def connected(self) -> None:
        self._next()

    def answered(self, secret: str | None) -> None:
        user, self.asking = self.asking, None
        assert user is not None
        future = self.pending.pop(user, None)
        now = time.monotonic()
        self.cache[user] = (secret, now + (AUTH_CACHE_SECONDS if secret else MISS_CACHE_SECONDS))
        self.cache.move_to_end(user)
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        if future is not None and not future.done():
            future.set_result(secret)
        self._next()

    def failed(self, error: PgtarnError) -> None:
        """The query failed for the name asked (the connection itself is fine)."""
        user, self.asking = self.asking, None
        future = self.pending.pop(user, None) if user is not None else None
        if future is not None and not future.done():
            future.set_exception(error)
            future.exception()
        self._next()

    def lost(self, error: PgtarnError) -> None:
        log.warning(
            "auth_query connection to %s as %s: %s", self.db.name, self.auth_user, error.message
        )
        self.conn = None
        self.reset(error)


class _LookupConnection(OwnConnection):
    """The connection a SecretLookup asks through: log in as auth_user, then one query at a
    time (Parse/Bind/Execute/Sync, the name as $1)."""

    def __init__(self, lookup: SecretLookup) -> None:
        runtime = lookup.runtime
        password = runtime.userlist.get(lookup.auth_user)
        if password is not None and password.startswith("SCRAM-SHA-256$"):
            password = None  # a verifier cannot log in by itself: the login says so clearly
        auth = ServerAuth(
            lookup.auth_user, password, channel_binding=runtime.config.server_channel_binding
        )
        super().__init__(
            runtime,
            ServerLogin(auth, lookup.db.dbname, STARTUP, LOGIN_MAX),
            lookup.db.host,
            MessageScanner(ALL_TYPES, _MAX_MESSAGE),
        )
        self.lookup = lookup
        #: The answer under way: the first row's secret (None: no row yet), and what went
        #: wrong (logged at its ReadyForQuery).
        self.secret: str | None = None
        self.error = ""

    async def connect(self) -> None:
        config = self.lookup.runtime.config
        try:
            await open_connection(
                self.lookup.db,
                lambda: self,
                config.server_connect_timeout,
                config.unix_socket_dir,
                self.lookup.runtime.hosts,
            )
        except (TimeoutError, OSError) as exc:
            self._fail(_lookup_failed(f"could not connect to server: {exc or 'timeout'}"))

    # --- the login's reports ----------------------------------------------------------------

    def _on_logged_in(self) -> None:
        self.lookup.connected()

    def _tls_failed(self, exc: Exception) -> None:
        self._fail(_lookup_failed(f"TLS: {exc}"))

    # --- the lookups ------------------------------------------------------------------------

    def _failed(self, error: PgtarnError) -> None:
        """The login or a lookup broke: connection errors as they are, others as lookup
        failures."""
        self._fail(error if error.sqlstate.startswith("08") else _lookup_failed(error.message))

    _malformed = _failed

    def _login_failed(self, error: PgtarnError) -> None:
        """PostgreSQL refused auth_user's login: the clients get its words (as PgBouncer:
        "no such database" is as true of them)."""
        if isinstance(error, LoginRefused):
            log.warning(
                "auth_query connection to %s as %s: server login failed: %s %s",
                self.lookup.db.name,
                self.lookup.auth_user,
                error.severity,
                error.message,
            )
            self._fail(error)
            return
        self._failed(error)

    def _message(self, msg_type: int, body: bytes) -> None:
        if msg_type == DATA_ROW:  # the first row's second column is the secret
            row = parse_data_row(body)
            if len(row) < 2:
                self.error = self.error or "auth_query must return two columns: name, secret"
            elif self.secret is None:
                value = row[1]
                self.secret = NO_PASSWORD if value is None else value.decode("utf-8", "replace")
        elif msg_type == ERROR_RESPONSE:
            self.error = server_error(body, "error in auth_query").message
        elif msg_type == READY_FOR_QUERY:
            secret, error = self.secret, self.error
            self.secret, self.error = None, ""
            if error:
                log.error("%s (%s as %s)", error, self.lookup.db.name, self.lookup.auth_user)
                self.lookup.failed(_config_error())
            else:
                self.lookup.answered(secret)

    def ask(self, query: str, user: str) -> None:
        assert self.transport is not None
        self.transport.write(
            build.parse("", query) + build.bind("", "", [user]) + build.execute() + build.SYNC
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(_lookup_failed("the server closed the connection"))

    def close(self) -> None:
        self._shut(terminate=self.ready)  # a Terminate only once logged in

    def _fail(self, error: PgtarnError) -> None:
        if self.closed:
            return
        self.close()
        if self.lookup.conn is self:
            self.lookup.lost(error)
