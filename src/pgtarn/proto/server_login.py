"""Logging in to PostgreSQL, sans-IO: SSLRequest, StartupMessage, authentication, ReadyForQuery.

ServerLogin is the whole conversation up to the first ReadyForQuery: raw bytes in, events
out (StartTls, Send, LoggedIn), PgtarnError raised when the login cannot go on. ServerAuth
is its authentication part, one message at a time, for callers that frame messages
themselves (test and benchmark clients).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..auth.md5 import is_md5_secret, md5_response
from ..auth.scram import MECHANISM_PLUS, ScramClient, choose_mechanism, parse_sasl_mechanisms
from ..errors import LoginRefused, PgtarnError, ProtocolViolation, TlsFailed
from . import build
from .framing import MessageScanner
from .messages import (
    parse_authentication,
    parse_backend_key_data,
    parse_fields,
    parse_parameter_status,
)
from .msgtypes import (
    ALL_TYPES,
    AUTHENTICATION,
    BACKEND_KEY_DATA,
    ERROR_RESPONSE,
    NEGOTIATE_PROTOCOL_VERSION,
    NOTICE_RESPONSE,
    PARAMETER_STATUS,
    READY_FOR_QUERY,
)

AUTH_OK = 0
AUTH_CLEARTEXT = 3
AUTH_MD5 = 5
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12

#: No message of a server's login is anywhere near this big: a larger length is garbage, and
#: is refused at once instead of waiting (until server_connect_timeout) for that many bytes.
LOGIN_MAX = 1 << 20

#: PgBouncer's words before a login failure of pgtarn's own making (not PostgreSQL's).
LOGIN_FAILED = "server login failed: "


def server_error(body: bytes, context: str) -> PgtarnError:
    """A PgtarnError carrying the SQLSTATE and message of a server's ErrorResponse."""
    fields = parse_fields(body)
    text = fields.get("M") or "server error without message"
    sqlstate = fields.get("C")
    if not sqlstate:  # PostgreSQL always sends one: this server is broken
        return ProtocolViolation(f"{context}: {text}", severity="FATAL")
    return PgtarnError(f"{context}: {text}", sqlstate=sqlstate, severity="FATAL")


def login_refused(body: bytes) -> PgtarnError:
    """The ErrorResponse that ended a login: LoginRefused with PostgreSQL's SQLSTATE and
    message, word for word (as PgBouncer, it is the close reason and what clients get)."""
    fields = parse_fields(body)
    text = fields.get("M") or "server error without message"
    sqlstate = fields.get("C")
    if not sqlstate:  # PostgreSQL always sends one: this server is broken
        return ProtocolViolation(f"{LOGIN_FAILED}{text}", severity="FATAL")
    return LoginRefused(text, sqlstate=sqlstate, severity="FATAL")


class ServerAuth:
    """Authenticates pgtarn to PostgreSQL: feed it the server's messages, send what it returns.

    Credentials are a plaintext password, an md5 secret (``md5...``), or SCRAM passthrough keys
    (the ClientKey recovered from a client's proof and the ServerKey of the stored verifier).
    """

    def __init__(
        self,
        user: str,
        password: str | None,
        scram_keys: tuple[bytes, bytes] | None = None,
        channel_binding: str = "prefer",
    ) -> None:
        """channel_binding: server_channel_binding (disable, prefer, require)."""
        self.user = user
        self.channel_binding = channel_binding
        #: Set once TLS is up: the hash of the server's certificate (tls-server-end-point),
        #: or b"" on TLS without usable binding data.
        self.tls_binding: bytes | None = None
        #: The SCRAM exchange was bound to the TLS channel.
        self.channel_bound = False
        self.password = password
        self.scram_keys = scram_keys
        self.params: dict[str, str] = {}
        self.backend_key: tuple[int, int] = (0, 0)
        self.done = False
        self._scram: ScramClient | None = None
        self._scram_final_seen = False
        #: The last Authentication message was AuthenticationOk (accepted): only then may
        #: ReadyForQuery end the login, or a server could skip authentication (and SCRAM's
        #: proof that it knows the secret) by sending ReadyForQuery straight away.
        self._authenticated = False

    def feed(self, msg_type: int, body: bytes) -> bytes:
        """Handle one server message; return bytes to send (possibly empty)."""
        if msg_type == AUTHENTICATION:
            return self._auth(body)
        if msg_type == PARAMETER_STATUS:
            name, value = parse_parameter_status(body)
            self.params[name] = value
            return b""
        if msg_type == BACKEND_KEY_DATA:
            self.backend_key = parse_backend_key_data(body)
            return b""
        if msg_type == READY_FOR_QUERY:
            if not self._authenticated:
                raise ProtocolViolation("server sent ReadyForQuery before AuthenticationOk")
            self.done = True
            return b""
        if msg_type == ERROR_RESPONSE:
            raise login_refused(body)
        if msg_type in (NOTICE_RESPONSE, NEGOTIATE_PROTOCOL_VERSION):
            return b""
        raise ProtocolViolation(f"unexpected message {chr(msg_type)!r} during server login")

    def _auth(self, body: bytes) -> bytes:
        code, payload = parse_authentication(body)
        self._authenticated = False
        if code == AUTH_OK:
            if self._scram is not None and not self._scram_final_seen:
                raise ProtocolViolation("server skipped the SCRAM final message")
            if self.channel_binding == "require" and not self.channel_bound:
                # as libpq's channel_binding=require: a server that lets us in without a
                # bound SCRAM exchange (trust, md5, ...) has not proven it is the server
                raise PgtarnError(
                    "channel binding is required, but the server authenticated pgtarn without it",
                    sqlstate="08006",
                )
            self._authenticated = True
            return b""
        if code in (AUTH_CLEARTEXT, AUTH_MD5) and self.channel_binding == "require":
            # not even an md5 hash goes to a server that has not proven who it is
            raise PgtarnError(
                "channel binding is required, but the server asked for a "
                f"{'cleartext' if code == AUTH_CLEARTEXT else 'md5'} password",
                sqlstate="08006",
            )
        if code == AUTH_CLEARTEXT:
            if (
                self.password is None
                or is_md5_secret(self.password)
                or self.password.startswith("SCRAM-SHA-256$")
            ):
                raise self._no_password("cleartext")
            return build.password_message(self.password.encode() + b"\x00")
        if code == AUTH_MD5:
            if self.password is None or self.password.startswith("SCRAM-SHA-256$"):
                raise self._no_password("md5")
            if len(payload) < 4:
                raise ProtocolViolation("md5 salt too short")
            return build.password_message(
                md5_response(self.password, self.user, payload[:4]) + b"\x00"
            )
        if code == AUTH_SASL:
            binding = self.tls_binding if self.channel_binding != "disable" else None
            mechanism = choose_mechanism(
                parse_sasl_mechanisms(payload), bool(binding), self.channel_binding == "require"
            )
            channel = binding if mechanism == MECHANISM_PLUS else None
            can_bind = bool(binding)  # tells the server we could have (it catches a downgrade)
            if self.scram_keys is not None:
                client_key, server_key = self.scram_keys
                self._scram = ScramClient(
                    client_key=client_key,
                    server_key=server_key,
                    channel_binding=channel,
                    can_bind=can_bind,
                )
            elif (
                self.password is not None
                and not is_md5_secret(self.password)
                and not self.password.startswith("SCRAM-SHA-256$")
            ):
                self._scram = ScramClient(self.password, channel_binding=channel, can_bind=can_bind)
            else:
                raise self._no_password("SCRAM-SHA-256")
            self.channel_bound = mechanism == MECHANISM_PLUS
            self._scram_final_seen = False  # a new exchange: its server proof is still owed
            return build.sasl_initial_response(mechanism, self._scram.client_first())
        if code == AUTH_SASL_CONTINUE:
            if self._scram is None:
                raise ProtocolViolation("SASLContinue without SASL")
            return build.sasl_response(self._scram.handle_server_first(payload))
        if code == AUTH_SASL_FINAL:
            if self._scram is None:
                raise ProtocolViolation("SASLFinal without SASL")
            self._scram.handle_server_final(payload)
            self._scram_final_seen = True
            return b""
        raise PgtarnError(
            f"server asked for unsupported authentication method {code}", sqlstate="28000"
        )

    def _no_password(self, method: str) -> PgtarnError:
        return PgtarnError(
            f"{LOGIN_FAILED}wrong password type: no usable password for user {self.user!r}"
            f" to log in to the server with {method} (set password= in [databases] or a"
            " plaintext or SCRAM secret in auth_file and log in with SCRAM first)",
            sqlstate="28P01",
            severity="FATAL",
        )


@dataclass(frozen=True, slots=True)
class StartTls:
    """PostgreSQL accepted the SSLRequest: run the TLS handshake, then call tls_started."""


@dataclass(frozen=True, slots=True)
class Send:
    """Bytes to send to PostgreSQL."""

    data: bytes


@dataclass(frozen=True, slots=True)
class LoggedIn:
    """The login is done (ReadyForQuery after AuthenticationOk)."""

    params: dict[str, str]
    backend_key: tuple[int, int]
    #: What came in the same chunk after that ReadyForQuery: the start of the relay's stream.
    leftover: bytes


LoginEvent = StartTls | Send | LoggedIn

_START_TLS = StartTls()

# ServerLogin's steps.
_NEW, _TLS_ANSWER, _HANDSHAKE, _AUTH, _DONE = range(5)


class ServerLogin:
    """One login to PostgreSQL, from the first byte sent to the first ReadyForQuery.

    start() gives the first bytes to send: an SSLRequest when TLS is wanted, else the
    StartupMessage. feed() takes every chunk received and returns what to do: StartTls (then
    tls_started() gives the StartupMessage, once the handshake is done), Send, and at last
    LoggedIn, with the bytes that followed the final ReadyForQuery.
    """

    __slots__ = ("auth", "scanner", "sslmode", "startup_params", "step")

    def __init__(
        self,
        auth: ServerAuth,
        database: str,
        params: Mapping[str, str] = MappingProxyType({}),
        max_message: int = LOGIN_MAX,
    ) -> None:
        """params: startup parameters besides user and database; max_message: the longest
        message accepted during the login."""
        self.auth = auth
        self.startup_params = {"user": auth.user, "database": database, **params}
        self.scanner = MessageScanner(ALL_TYPES, max_message)
        #: server_tls_sslmode the SSLRequest was sent under (a RELOAD may change the setting
        #: before the answer comes).
        self.sslmode = ""
        self.step = _NEW

    def start(self, sslmode: str | None = None) -> bytes:
        """The first bytes to send: an SSLRequest, whose answer is judged under sslmode
        (server_tls_sslmode), or with None (no TLS) the StartupMessage."""
        assert self.step == _NEW, "start() once, first"
        if sslmode is None:
            self.step = _AUTH
            return build.startup_message(self.startup_params)
        self.sslmode = sslmode
        self.step = _TLS_ANSWER
        return build.SSL_REQUEST

    def tls_started(self, binding: bytes) -> bytes:
        """The TLS handshake is done: the StartupMessage to send over it. binding: the
        channel-binding data of the server's certificate (b"" when it has none usable)."""
        assert self.step == _HANDSHAKE, "tls_started() after StartTls only"
        self.auth.tls_binding = binding
        self.step = _AUTH
        return build.startup_message(self.startup_params)

    def feed(self, data: bytes) -> list[LoginEvent]:
        """Bytes received from PostgreSQL: what to do about them (raises PgtarnError when
        the login fails)."""
        if self.step == _AUTH:
            return self._messages(data)
        if self.step == _TLS_ANSWER:
            if tls_accepted(data, self.sslmode):
                self.step = _HANDSHAKE
                return [_START_TLS]
            self.step = _AUTH
            events: list[LoginEvent] = [Send(build.startup_message(self.startup_params))]
            if len(data) > 1:
                events += self._messages(data[1:])
            return events
        if self.step == _HANDSHAKE:
            raise ProtocolViolation("server sent data during the TLS handshake")
        raise AssertionError("feed() before start() or after LoggedIn")

    def _messages(self, data: bytes) -> list[LoginEvent]:
        auth = self.auth
        events: list[LoginEvent] = []
        for msg_type, body, end in self.scanner.feed(data):
            reply = auth.feed(msg_type, body)
            if reply:
                events.append(Send(reply))
            if auth.done:
                self.step = _DONE
                events.append(LoggedIn(auth.params, auth.backend_key, data[end:]))
                break
        return events


def tls_accepted(data: bytes, mode: str) -> bool:
    """PostgreSQL's answer to our SSLRequest: True for TLS, False to go on in plaintext
    (server_tls_sslmode allow and prefer, which are alike, as in PgBouncer); anything else
    raises."""
    answer = data[:1]
    if answer == b"S":
        if len(data) > 1:
            # Bytes before the handshake would be read as if they were encrypted: a man in
            # the middle's injection (CVE-2021-23222 in libpq).
            raise ProtocolViolation("server sent unencrypted data after accepting TLS")
        return True
    if answer == b"N":
        if mode not in ("allow", "prefer"):
            raise TlsFailed(f"server does not support TLS, but server_tls_sslmode = {mode}")
        return False
    raise ProtocolViolation(f"invalid answer to SSLRequest: {answer!r}")
