"""A password checked outside the login (PAM, an LDAP server) on an auth thread; the login waits.

A login whose method is pam or ldap (auth_type, or its pg_hba.conf rule) asks the client for
its cleartext password, which the login machine hands over in a CheckPassword event with the
method. The method picks the check: PAM (auth/pam.py: the service auth_pam_service, the
client's address as PAM_RHOST) or an LDAP bind (net/ldapcheck.py: auth_ldap_options, or the
rule's options). Both run in the process's auth threads (net/authpool.py: auth_threads of
them, at most auth_queue_size more checks waiting, past that a login is refused at once),
never in the event loop, and the login goes on with the verdict (password_checked). As
PgBouncer does, the password checked is the one the pool's servers log in to PostgreSQL
with. Neither the password nor ldapbindpasswd is ever logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Protocol

from ..auth.ldap import LdapOptions, parse_ldap_options
from ..auth.pamresult import PamResult, PamUnavailable
from ..errors import AuthFailed, PgtarnError
from ..net.authpool import AuthPool, PoolFull
from ..net.ldapcheck import Outcome, check_ldap_password
from ..proto.client_login import CheckPassword
from ..runtime import CONFIG_ERROR, Runtime
from ..views.states import ClientState
from .access import peer_address
from .interfaces import LoginClient

__all__ = ["LDAP_CHECK_TIMEOUT", "PasswordWait", "auth_pool", "check_password", "ldap_options_for"]

log = logging.getLogger("pgtarn.client")

#: Seconds an LDAP login waits for its check, the wait for a free thread included (each
#: request has a timeout of its own: net/ldapcheck.py). A PAM check has no limit but its
#: modules' own, and client_login_timeout.
LDAP_CHECK_TIMEOUT = 30.0
#: The methods checked here, by their names in messages.
_NAMES = {"pam": "PAM", "ldap": "LDAP"}

#: A check's result: PAM's or LDAP's answer, what the check raised, or None (no answer in time).
Result = PamResult | Outcome | BaseException | None


def load_pam() -> Callable[[str, str, str, str], PamResult]:
    """auth/pam.py's check, imported at the first PAM login: its ctypes binding (and the
    modules ctypes brings) would otherwise sit in the memory of every pooler, most of which
    never check a password with PAM."""
    from ..auth.pam import authenticate  # lazy, for the memory (see the docstring)

    return authenticate


def _failed(method: str) -> AuthFailed:
    """PgBouncer's words; PostgreSQL's SQLSTATE for a failed PAM or LDAP login (28000: 28P01
    is for its password methods)."""
    return AuthFailed(f"{_NAMES[method]} authentication failed", sqlstate="28000", severity="FATAL")


class PasswordWait(Protocol):
    """The login a check is for (login.ClientLoginDriver)."""

    @property
    def client(self) -> LoginClient: ...

    def waiting(self) -> bool:
        """Still its client's login, still authenticating: the verdict is wanted."""

    def password_checked(self, error: PgtarnError | None) -> None:
        """The verdict (None: the password is right); the login goes on or fails with it
        (PgtarnError: its next steps refused it)."""


def check_password(login: PasswordWait, event: CheckPassword) -> None:
    """Check the password of CheckPassword as its method says, then hand the verdict to
    the login."""
    client = login.client
    try:
        check, timeout = _check_for(client, event)
    except PgtarnError as error:
        login.password_checked(error)
        return
    client.runtime.spawn(_run(login, event, check, timeout))


def _check_for(
    client: LoginClient, event: CheckPassword
) -> tuple[Callable[[], Result], float | None]:
    """The blocking call that checks event's password and how long the login waits for it;
    PgtarnError when the login ends without a check."""
    method, user, password = event.method, client.user, event.password
    name = _NAMES.get(method)
    if name is None:  # (the login machine hands over no other method)
        raise PgtarnError(f"auth_type {method} is not supported", sqlstate="28000")
    db, config = client.db, client.runtime.config
    # as PgBouncer: PAM chosen by auth_type, LDAP chosen either way, refuse an auth_user
    if (
        db is not None
        and (db.auth_user or config.auth_user)
        and (method == "ldap" or config.auth_type == "pam")
    ):
        log.error("%r %s can't be used together with database authentication", client, name)
        raise PgtarnError(CONFIG_ERROR, sqlstate="08006")
    if method == "pam":
        address = peer_address(client.addr)
        rhost = "[local]" if address is None else str(address)
        return partial(load_pam(), config.auth_pam_service, user, password, rhost), None
    options = ldap_options_for(client)
    return partial(check_ldap_password, options, user, password), LDAP_CHECK_TIMEOUT


@lru_cache(maxsize=4)
def _configured(text: str) -> LdapOptions:
    return parse_ldap_options(text)


def ldap_options_for(client: LoginClient) -> LdapOptions:
    """The LDAP options of this client's login, whose method is ldap: auth_ldap_options, or
    its pg_hba.conf rule's, matched again on the same facts (after a RELOAD, the new rules
    decide, as for a login that starts then; a rule that is no longer ldap refuses)."""
    runtime = client.runtime
    config = runtime.config
    if config.auth_type == "hba":
        hba = runtime.hba
        rule = (
            None
            if hba is None
            else hba.match(
                local=client.addr == "unix",
                tls=client.tls is not None,
                database=client.database,
                user=client.user,
                address=peer_address(client.addr),
                replication=client.replication == "physical",
            )
        )
        if rule is None or rule.ldap is None:
            log.warning("%r LDAP authentication: its pg_hba.conf rule changed", client)
            raise _failed("ldap")
        return rule.ldap
    if config.auth_type != "ldap":
        log.warning("%r LDAP authentication: auth_type changed", client)
        raise _failed("ldap")
    try:
        return _configured(config.auth_ldap_options)
    except ValueError as exc:  # (refused at load: only a bug gets here)
        log.error("auth_ldap_options: %s", exc)
        raise _failed("ldap") from None


def auth_pool(runtime: Runtime) -> AuthPool:
    """The process's auth threads (workers = N: each worker's), made at the first check,
    after any fork (threads do not survive one), and anew when a RELOAD changed
    auth_threads or auth_queue_size (the old pool finishes what it was given)."""
    config = runtime.config
    pool = runtime.auth_pool
    if pool is None or (pool.threads, pool.waiting) != (
        config.auth_threads,
        config.auth_queue_size,
    ):
        if pool is not None:
            pool.close()
        pool = runtime.auth_pool = AuthPool(config.auth_threads, config.auth_queue_size)
    return pool


async def _run(
    login: PasswordWait, event: CheckPassword, check: Callable[[], Result], timeout: float | None
) -> None:
    client = login.client
    runtime, method = client.runtime, event.method
    pool = auth_pool(runtime)
    outcome: Result
    try:
        outcome = await pool.run(check, timeout, lambda: client.state is not ClientState.CLOSED)
    except PoolFull:
        log.warning(
            "%r %s authentication refused: no room for its check (auth_threads = "
            "%d, auth_queue_size = %d, all taken)",
            client,
            _NAMES[method],
            pool.threads,
            pool.waiting,
        )
        outcome = PgtarnError(
            f"too many {_NAMES[method]} authentication requests in progress", sqlstate="53300"
        )
    except Exception as exc:  # the login must end, whatever the check did
        outcome = exc
    if not login.waiting():
        return  # it left, or client_login_timeout closed it, while the check ran
    error = _verdict(client, method, outcome)
    if error is None and client.db is not None:  # its pool's servers log in with it
        runtime.found_secret(client.db, client.user, event.password)
    try:
        login.password_checked(error)
    except PgtarnError as failure:  # the login's next steps may refuse it
        client.close(failure)


def _verdict(client: LoginClient, method: str, outcome: Result) -> PgtarnError | None:
    """None if the check let the user in; else the error the login ends with (the reason is
    logged: the client learns no more than that PAM or the LDAP server said no)."""
    name = _NAMES[method]
    if isinstance(outcome, PgtarnError):  # refused before any check (no room for it)
        return outcome
    if isinstance(outcome, PamUnavailable):
        log.error("%r PAM is not available: %s", client, outcome)
        return PgtarnError(CONFIG_ERROR, sqlstate="08006")
    if isinstance(outcome, BaseException):
        log.error("%r %s check failed: %s: %s", client, name, type(outcome).__name__, outcome)
        return _failed(method)
    if outcome is None:  # (PAM has no time limit: only an LDAP check gets here)
        log.warning("%r %s authentication: no answer within %g s", client, name, LDAP_CHECK_TIMEOUT)
        return _failed(method)
    if isinstance(outcome, PamResult):
        for message in outcome.messages:
            log.warning("%r PAM error: %s", client, message)
    if outcome.ok:
        return None
    log.warning(
        "%r %s", client, outcome.reason if isinstance(outcome, PamResult) else outcome.detail
    )
    return _failed(method)
