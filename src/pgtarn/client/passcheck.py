"""A client's password checked by an LDAP server: the bind runs in an auth thread, the login waits.

auth_type = ldap (its options: auth_ldap_options), or a pg_hba.conf rule with method ldap (its
options on the line), asks the client for its cleartext password (the login machine's
CheckPassword event); the bind runs in the process's auth threads (net/authpool.py, size
auth_threads), never in the event loop, and the login goes on with the answer: as
PgBouncer does, the checked password is the one its servers log in to PostgreSQL with.
Neither the password nor ldapbindpasswd is ever logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache, partial

from ..auth.ldap import LdapOptions, parse_ldap_options
from ..errors import AuthFailed, PgtarnError
from ..net.authpool import AuthPool, PoolFull
from ..net.ldapcheck import check_ldap_password
from ..proto.client_login import CheckPassword, ClientLogin, Event
from ..runtime import CONFIG_ERROR, Runtime
from ..states import ClientState
from .access import peer_address
from .pam_login import check_password as check_pam
from .transport import ClientTransport

__all__ = ["CHECK_TIMEOUT", "check_password", "ldap_options_for"]

log = logging.getLogger("pgtarn.client")

#: Seconds a login waits for its check, the wait for a free thread included.
CHECK_TIMEOUT = 30.0
#: Checks that may wait for a thread, per thread: past that a login is refused at once.
WAITING_PER_THREAD = 16

GoOn = Callable[[ClientLogin, list[Event]], None]


def _ldap_failed() -> AuthFailed:
    """PgBouncer's words; PostgreSQL's SQLSTATE for a failed LDAP login."""
    return AuthFailed("LDAP authentication failed", sqlstate="28000", severity="FATAL")


@lru_cache(maxsize=4)
def _configured(text: str) -> LdapOptions:
    return parse_ldap_options(text)


def ldap_options_for(client: ClientTransport) -> LdapOptions:
    """The LDAP options of this client's login, whose method is ldap: auth_ldap_options, or
    its pg_hba.conf rule's, matched again on the same facts (after a RELOAD, the new rules
    decide, as for a login that starts then; a rule that is no longer ldap refuses)."""
    runtime = client.runtime
    config = runtime.config
    if config.auth_type == "hba":
        hba = runtime.hba
        rule = None if hba is None else hba.match(
            local=client.addr == "unix", tls=client.tls is not None,
            database=client.database, user=client.user, address=peer_address(client.addr),
            replication=client.replication == "physical")
        if rule is None or rule.ldap is None:
            log.warning("%r: LDAP authentication: its pg_hba.conf rule changed", client)
            raise _ldap_failed()
        return rule.ldap
    if config.auth_type != "ldap":
        log.warning("%r: LDAP authentication: auth_type changed", client)
        raise _ldap_failed()
    try:
        return _configured(config.auth_ldap_options)
    except ValueError as exc:  # (refused at load: only a bug gets here)
        log.error("auth_ldap_options: %s", exc)
        raise _ldap_failed() from None


def _pool(runtime: Runtime) -> AuthPool:
    """The process's auth threads, made at the first check (after any fork: threads do not
    survive one) and anew when auth_threads changed."""
    threads = runtime.config.auth_threads
    pool = runtime.auth_pool
    if pool is None or pool.threads != threads:
        if pool is not None:
            pool.close()  # checks under way end on their own
        pool = runtime.auth_pool = AuthPool(threads, threads * WAITING_PER_THREAD)
    return pool


def check_password(client: ClientTransport, login: ClientLogin, event: CheckPassword,
                   go_on: GoOn) -> None:
    """Check the password of CheckPassword, then go on with the login (go_on: the caller's
    handler of the login machine's events)."""
    if event.method == "pam":  # PAM, on its own threads (pam_login.py)
        check_pam(client, login, event.password, go_on)
        return
    try:
        if event.method != "ldap":
            raise PgtarnError(f"auth_type {event.method} is not supported", sqlstate="28000")
        db, config = client.db, client.runtime.config
        if db is not None and (db.auth_user or config.auth_user):  # as PgBouncer
            log.error("%r: LDAP can't be used together with database authentication", client)
            raise PgtarnError(CONFIG_ERROR, sqlstate="08006")
        options = ldap_options_for(client)
    except PgtarnError as error:
        go_on(login, login.password_checked(error))
        return
    client.runtime.spawn(_check_ldap(client, login, options, event.password, go_on))


async def _check_ldap(client: ClientTransport, login: ClientLogin, options: LdapOptions,
                      password: str, go_on: GoOn) -> None:
    runtime, user = client.runtime, client.user
    pool = _pool(runtime)
    error: PgtarnError | None = None
    try:
        outcome = await pool.run(partial(check_ldap_password, options, user, password),
                                 CHECK_TIMEOUT, lambda: client.state is not ClientState.CLOSED)
    except PoolFull:
        log.warning("%r: LDAP authentication refused: %d checks are under way or waiting "
                    "(auth_threads)", client, pool.limit)
        error = PgtarnError("too many LDAP authentication requests in progress",
                            sqlstate="53300")
        outcome = None
    except Exception as exc:  # the login must end, whatever the check did
        log.error("%r: LDAP check failed: %s: %s", client, type(exc).__name__, exc)
        error, outcome = _ldap_failed(), None
    if client.login is not login or client.state is ClientState.CLOSED:
        return  # the client left meanwhile
    if error is None:
        if outcome is None:
            log.warning("%r: LDAP authentication: no answer within %g s", client,
                        CHECK_TIMEOUT)
            error = _ldap_failed()
        elif not outcome.ok:
            log.warning("%r: %s", client, outcome.detail)
            error = _ldap_failed()
        elif client.db is not None:  # its pool's servers log in with it (no auth_file entry)
            runtime.found_secret(client.db, user, password)
    try:
        go_on(login, login.password_checked(error))
    except PgtarnError as failure:
        client.close(failure)
