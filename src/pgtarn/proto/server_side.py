"""Server stream state: logging in to PostgreSQL and what its messages mean for reuse."""

from __future__ import annotations

from collections.abc import Mapping

from ..auth.md5 import is_md5_secret, md5_response
from ..auth.scram import MECHANISM_PLUS, ScramClient, choose_mechanism, parse_sasl_mechanisms
from ..errors import PgtarnError, ProtocolViolation
from . import build
from .messages import (
    parse_authentication,
    parse_backend_key_data,
    parse_fields,
    parse_parameter_status,
)

AUTH_OK = 0
AUTH_CLEARTEXT = 3
AUTH_MD5 = 5
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12


def server_error(body: bytes, context: str) -> PgtarnError:
    """A PgtarnError carrying the SQLSTATE and message of a server's ErrorResponse."""
    fields = parse_fields(body)
    text = fields.get("M") or "server error without message"
    sqlstate = fields.get("C")
    if not sqlstate:  # PostgreSQL always sends one: this server is broken
        return ProtocolViolation(f"{context}: {text}", severity="FATAL")
    return PgtarnError(f"{context}: {text}", sqlstate=sqlstate, severity="FATAL")


class ServerLogin:
    """Drives one login to PostgreSQL: feed it server messages, send what it returns.

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

    def startup(self, params: Mapping[str, str]) -> bytes:
        return build.startup_message(params)

    def feed(self, msg_type: int, body: bytes) -> bytes:
        """Handle one server message; return bytes to send (possibly empty)."""
        if msg_type == 0x52:  # 'R' Authentication*
            return self._auth(body)
        if msg_type == 0x53:  # 'S' ParameterStatus
            name, value = parse_parameter_status(body)
            self.params[name] = value
            return b""
        if msg_type == 0x4B:  # 'K' BackendKeyData
            self.backend_key = parse_backend_key_data(body)
            return b""
        if msg_type == 0x5A:  # 'Z' ReadyForQuery
            if not self._authenticated:
                raise ProtocolViolation("server sent ReadyForQuery before AuthenticationOk")
            self.done = True
            return b""
        if msg_type == 0x45:  # 'E' ErrorResponse
            raise server_error(body, "server login failed")
        if msg_type in (0x4E, 0x76):  # NoticeResponse, NegotiateProtocolVersion
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
                raise PgtarnError("channel binding is required, but the server "
                                  "authenticated pgtarn without it", sqlstate="08006")
            self._authenticated = True
            return b""
        if code in (AUTH_CLEARTEXT, AUTH_MD5) and self.channel_binding == "require":
            # not even an md5 hash goes to a server that has not proven who it is
            raise PgtarnError("channel binding is required, but the server asked for a "
                              f"{'cleartext' if code == AUTH_CLEARTEXT else 'md5'} password",
                              sqlstate="08006")
        if code == AUTH_CLEARTEXT:
            if self.password is None or is_md5_secret(self.password) \
                    or self.password.startswith("SCRAM-SHA-256$"):
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
            mechanism = choose_mechanism(parse_sasl_mechanisms(payload), bool(binding),
                                         self.channel_binding == "require")
            channel = binding if mechanism == MECHANISM_PLUS else None
            can_bind = bool(binding)  # tells the server we could have (it catches a downgrade)
            if self.scram_keys is not None:
                client_key, server_key = self.scram_keys
                self._scram = ScramClient(client_key=client_key, server_key=server_key,
                                          channel_binding=channel, can_bind=can_bind)
            elif self.password is not None and not is_md5_secret(self.password) \
                    and not self.password.startswith("SCRAM-SHA-256$"):
                self._scram = ScramClient(self.password, channel_binding=channel,
                                          can_bind=can_bind)
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
            f"no usable password for user {self.user!r} to log in to the server with {method}"
            " (set password= in [databases] or a plaintext or SCRAM secret in auth_file"
            " and log in with SCRAM first)",
            sqlstate="28P01",
            severity="FATAL",
        )
