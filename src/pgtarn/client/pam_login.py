"""PAM logins: the cleartext password a client sent is checked by PAM on a thread, then on.

As PgBouncer: the service is asked pam_authenticate and pam_acct_mgmt for the client's user
name, with the client's address as PAM_RHOST; a password PAM accepts is also the one the
pool's servers log in with (unless the database entry has a password of its own). The
checks run on auth_pam_threads threads (blocking.py), with at most auth_pam_queue_size
more waiting: past that a login is refused at once, where PgBouncer stops everything until
its queue has room.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from ..auth.pam import PamResult, PamUnavailable, authenticate
from ..config import Config
from ..errors import AuthFailed, PgtarnError
from ..proto.client_login import ClientLogin, Event
from ..runtime import CONFIG_ERROR
from ..states import ClientState
from .access import peer_address
from .blocking import BlockingCalls
from .transport import ClientTransport

log = logging.getLogger("pgtarn.client")

#: What a client whose password PAM refused is told (PgBouncer's words).
PAM_FAILED = "PAM authentication failed"


def _pam_failed() -> AuthFailed:
    """PgBouncer's words; PostgreSQL's SQLSTATE for a failed PAM login (28000: 28P01 is for
    the password methods only)."""
    return AuthFailed(PAM_FAILED, sqlstate="28000", severity="FATAL")
QUEUE_FULL = "too many logins wait for PAM (auth_pam_queue_size)"

Act = Callable[[ClientLogin, list[Event]], None]

# One pool of threads per process (workers = N: per worker), made at the first PAM login.
_calls: BlockingCalls | None = None


def pam_calls(config: Config) -> BlockingCalls:
    """The threads PAM checks run on, sized as config says (a RELOAD that changed the sizes
    gets new ones; the old ones finish what they were given, then end)."""
    global _calls
    calls = _calls
    if calls is None or (calls.threads, calls.queue_size) != (
            config.auth_pam_threads, config.auth_pam_queue_size):
        if calls is not None:
            calls.retire()
        calls = _calls = BlockingCalls("pam", config.auth_pam_threads,
                                       config.auth_pam_queue_size)
    return calls


def check_password(client: ClientTransport, login: ClientLogin, password: str,
                   act: Act) -> None:
    """Check the password client sent (CheckPassword) with PAM; act(login, events) goes on
    with the login once PAM has answered, unless the client has gone meanwhile."""
    runtime = client.runtime
    config = runtime.config
    db = client.db
    if config.auth_type == "pam" and db is not None and (db.auth_user or config.auth_user):
        log.error("%r: PAM can't be used together with database authentication", client)
        act(login, login.password_checked(PgtarnError(CONFIG_ERROR, sqlstate="08006")))
        return
    user = client.user
    address = peer_address(client.addr)
    rhost = "[local]" if address is None else str(address)

    def done(outcome: PamResult | Exception) -> None:
        if client.login is not login or client.state is not ClientState.AUTH:
            return  # it left, or client_login_timeout closed it, while PAM was at work
        error = _verdict(client, outcome)
        if error is None and db is not None:
            runtime.found_secret(db, user, password)  # for the servers' logins
        try:
            act(login, login.password_checked(error))
        except PgtarnError as refusal:  # the login's next steps may refuse it
            client.close(refusal)

    check = partial(authenticate, config.auth_pam_service, user, password, rhost)
    if not pam_calls(config).submit(check, done):
        log.warning("%r: PAM queue is full, login refused", client)
        act(login, login.password_checked(PgtarnError(QUEUE_FULL, sqlstate="53300",
                                                      severity="FATAL")))


def _verdict(client: ClientTransport, outcome: PamResult | Exception) -> PgtarnError | None:
    """None if PAM let the user in; else the error the login ends with (the reason is
    logged: the client learns no more than that PAM said no)."""
    if isinstance(outcome, PamUnavailable):
        log.error("%r: PAM is not available: %s", client, outcome)
        return PgtarnError(CONFIG_ERROR, sqlstate="08006")
    if isinstance(outcome, Exception):
        log.error("%r: PAM check failed: %r", client, outcome)
        return _pam_failed()
    for message in outcome.messages:
        log.warning("%r: PAM error: %s", client, message)
    if outcome.ok:
        return None
    log.warning("%r: %s", client, outcome.reason)
    return _pam_failed()
