"""Client authentication as a sans-IO exchange: feed PasswordMessage bodies, send what it returns.

Which challenge a client gets follows PgBouncer: ``md5`` switches to SCRAM when the stored
secret is a SCRAM verifier; ``plain`` asks for the cleartext password and checks it against
any kind of secret; ``pam`` and ``ldap`` ask for it too, for the caller to check
(``password``). An unknown user gets the same challenge as a known one and fails the same
way, so the error never tells which of user name or password was wrong. An empty secret (a
role auth_query found without a password, or "" in auth_file) matches no password, as in
PgBouncer and PostgreSQL; only ``trust`` lets its user in.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Final

from ..auth.md5 import is_md5_secret, md5_secret, md5_verify
from ..auth.scram import (
    ScramServer,
    ScramVerifier,
    client_key_for,
    forget_salted_passwords,
    make_verifier,
    parse_verifier,
    stored_key_for,
)
from ..errors import AuthFailed, PgtarnError, ProtocolViolation
from . import build
from .messages import parse_password, parse_sasl_initial_response

PASSWORD_AUTH_TYPES = ("md5", "scram-sha-256", "plain")
#: Auth types whose cleartext password something outside the exchange checks (PAM, an LDAP
#: server): the exchange hands the password over (`password`) and waits for the verdict.
CHECKED_ELSEWHERE = frozenset({"pam", "ldap"})


def _failed() -> AuthFailed:
    """A wrong password or an unknown user (plain, md5): PgBouncer's words, which name
    nobody; PostgreSQL's SQLSTATE (28P01)."""
    return AuthFailed("password authentication failed", severity="FATAL")


def _sasl_failed() -> AuthFailed:
    """The same for a SCRAM exchange, in PgBouncer's words."""
    return AuthFailed("SASL authentication failed", severity="FATAL")


class ClientAuth:
    """One client's authentication, given the auth_type and the user's secret (None: unknown;
    "": known, without a password)."""

    def __init__(
        self,
        auth_type: str,
        user: str,
        secret: str | None,
        scram_iterations: int = 4096,
        channel_binding: bytes | None = None,
    ) -> None:
        """channel_binding: on TLS, the hash of pgtarn's certificate (SCRAM-SHA-256-PLUS)."""
        self.user = user
        self.auth_type = auth_type
        self._channel_binding = channel_binding
        self.secret = secret
        self.done = False
        #: SCRAM passthrough keys (ClientKey, ServerKey) once a SCRAM login against a stored
        #: verifier succeeded.
        self.scram_keys: tuple[bytes, bytes] | None = None
        #: The SCRAM login was bound to the TLS channel (SCRAM-SHA-256-PLUS).
        self.channel_bound = False
        self._scram: ScramServer | None = None
        self._md5_salt = b""
        self._iterations = scram_iterations
        self._known = bool(secret)  # (an empty secret fails as an unknown user's)
        self._client_first_seen = False
        #: The cleartext password to be checked elsewhere (CHECKED_ELSEWHERE), once received.
        self.password: str | None = None
        #: Set by the first error: the exchange is over, later messages are refused (a caller
        #: that kept reading could otherwise let a client try password after password).
        self.failed = False
        verifier = parse_verifier(secret) if secret else None
        if auth_type in ("trust", "any"):
            if auth_type == "trust" and secret is None:  # PgBouncer's words
                raise PgtarnError(
                    '"trust" authentication failed', sqlstate="28000", severity="FATAL"
                )
            self.method = "trust"
        elif auth_type == "plain":
            self.method = "plain"
        elif auth_type in CHECKED_ELSEWHERE:
            self.method = "elsewhere"
        elif auth_type == "md5":
            self.method = "scram" if verifier is not None else "md5"
        elif auth_type == "scram-sha-256":
            self.method = "scram"
        else:
            raise PgtarnError(
                f"auth_type {auth_type} is not supported", sqlstate="28000", severity="FATAL"
            )
        self._verifier = verifier

    def start(self) -> bytes:
        """The first message to the client: AuthenticationOk or a challenge."""
        if self.method == "trust":
            self.done = True
            return build.AUTH_OK
        if self.method in ("plain", "elsewhere"):
            return build.authentication(3)
        if self.method == "md5":
            self._md5_salt = secrets.token_bytes(4)
            return build.authentication(5, self._md5_salt)
        self._scram = ScramServer(self._scram_secret(), channel_binding=self._channel_binding)
        return _sasl_offer(tuple(self._scram.mechanisms()))

    def _scram_secret(self) -> ScramVerifier | str:
        if self._verifier is not None:
            return self._verifier
        secret = self.secret
        # (startswith first: is_md5_secret is a Python call, and a regular expression)
        if secret and not (secret.startswith("md5") and is_md5_secret(secret)):
            return _plain_verifier(self.user, secret, self._iterations)
        # Unknown user, no password or an md5 secret (which cannot do SCRAM): run the exchange
        # against a made-up verifier so the failure looks like any wrong password (the same
        # one for the same name, as a stored verifier would be, and as cheap).
        self._known = False
        return _mock_verifier(self.user, self._iterations)

    def feed(self, body: bytes) -> bytes:
        """Handle one PasswordMessage body; return the next message to send."""
        if self.done or self.password is not None:
            raise ProtocolViolation("unexpected password message after authentication")
        if self.failed:
            raise ProtocolViolation("unexpected password message after a failed authentication")
        try:
            return self._feed(body)
        except PgtarnError:
            self.failed = True
            raise

    def _feed(self, body: bytes) -> bytes:
        if self.method == "plain":
            return self._check_plain(parse_password(body))
        if self.method == "elsewhere":
            self.password = _cleartext(parse_password(body))
            return b""
        if self.method == "md5":
            response = parse_password(body)
            if not self._known or self.secret is None:
                raise _failed()
            if self.secret.startswith("SCRAM-SHA-256$") or not md5_verify(
                self.secret, self.user, self._md5_salt, response
            ):
                raise _failed()
            self.done = True
            return build.AUTH_OK
        assert self._scram is not None
        if not self._client_first_seen:
            mechanism, data = parse_sasl_initial_response(body)
            try:
                self._scram.select(mechanism)
            except AuthFailed:  # PostgreSQL's and PgBouncer's words
                raise ProtocolViolation(
                    "client selected an invalid SASL authentication mechanism"
                ) from None
            self._client_first_seen = True
            return build.authentication(11, self._scram.handle_client_first(data))
        try:
            final = self._scram.handle_client_final(body)
        except AuthFailed:
            raise _sasl_failed() from None
        if not self._known:
            raise _sasl_failed()
        if self._verifier is not None:
            self.scram_keys = (self._scram.client_key, self._verifier.server_key)
        self.channel_bound = self._scram.channel_bound
        self.done = True
        return build.authentication(12, final) + build.AUTH_OK

    def checked(self) -> bytes:
        """The password checked elsewhere was right: AuthenticationOk."""
        if self.password is None or self.done or self.failed:
            raise RuntimeError("no password waits for a check")
        self.password = None  # not kept past its check
        self.done = True
        return build.AUTH_OK

    def _check_plain(self, password_bytes: bytes) -> bytes:
        try:
            password = password_bytes.decode()
        except UnicodeDecodeError:
            raise _failed() from None
        secret = self.secret
        if not secret:
            raise _failed()
        verifier = self._verifier
        if verifier is not None:
            client_key = client_key_for(password, verifier.salt, verifier.iterations)
            ok = secrets.compare_digest(stored_key_for(client_key), verifier.stored_key)
            if ok:
                self.scram_keys = (client_key, verifier.server_key)
        elif is_md5_secret(secret):
            ok = secrets.compare_digest(md5_secret(password, self.user), secret)
        else:
            ok = secrets.compare_digest(password.encode(), secret.encode())
        if not ok:
            raise _failed()
        self.done = True
        return build.AUTH_OK


def _cleartext(password: bytes) -> str:
    """A password to check elsewhere; an empty one is refused, as PostgreSQL refuses it,
    since some PAM stacks let an account without a password in with one."""
    if not password:
        raise AuthFailed("empty password returned by client", severity="FATAL")
    if b"\x00" in password:  # C strings: PAM would see only its first part
        raise ProtocolViolation("invalid password packet size")
    try:
        return password.decode()
    except UnicodeDecodeError:
        raise _failed() from None


#: AuthenticationSASL by the mechanisms it offers (one of two lists: built once, not per
#: login; a dictionary, as _PLAIN_VERIFIERS).
_SASL_OFFERS: Final[dict[tuple[str, ...], bytes]] = {}


def _sasl_offer(mechanisms: tuple[str, ...]) -> bytes:
    offer = _SASL_OFFERS.get(mechanisms)
    if offer is None:
        offer = _SASL_OFFERS[mechanisms] = build.auth_sasl(mechanisms)
    return offer


# A plaintext auth_file secret becomes a verifier once (with a salt of its own), not at every
# login: PBKDF2 is the costliest step of a login and would block the event loop each time.
# PostgreSQL likewise keeps one salt per role. Bounded; keyed by the secret text, so a changed
# password (auth_file, auth_query) is a new verifier (docs/authentication.md says why safe).
_PLAIN_VERIFIERS: Final[dict[tuple[str, str, int], ScramVerifier]] = {}
_PLAIN_VERIFIERS_MAX: Final = 4096


def _plain_verifier(user: str, secret: str, iterations: int) -> ScramVerifier:
    # keyed by user too: two users sharing a password must not share a salt either; a
    # dictionary, not lru_cache: compiled, a lookup costs a seventh of the wrapper's call
    key = (user, secret, iterations)
    verifier = _PLAIN_VERIFIERS.get(key)
    if verifier is None:
        if len(_PLAIN_VERIFIERS) >= _PLAIN_VERIFIERS_MAX:  # the oldest goes
            del _PLAIN_VERIFIERS[next(iter(_PLAIN_VERIFIERS))]
        verifier = _PLAIN_VERIFIERS[key] = make_verifier(secret, iterations=iterations)
    return verifier


#: Made-up verifiers are keyed with this: stable for a name while the process lives, unknown
#: outside it, so nobody can tell them from real ones.
_MOCK_KEY = secrets.token_bytes(32)


def _mock_verifier(user: str, iterations: int) -> ScramVerifier:
    # HMACs, not PBKDF2: probing made-up names must cost pgtarn no more than a real login
    # (which, against a stored verifier, runs no PBKDF2 either), and nothing is cached
    name = user.encode("utf-8", "surrogatepass")

    def part(label: bytes) -> bytes:
        return hmac.new(_MOCK_KEY, label + b"\x00" + name, "sha256").digest()

    return ScramVerifier(iterations, part(b"salt")[:16], part(b"stored"), part(b"server"))


def forget_derived_secrets() -> None:
    """RELOAD: drop verifiers and derivations made from secrets that may have changed."""
    _PLAIN_VERIFIERS.clear()
    forget_salted_passwords()
