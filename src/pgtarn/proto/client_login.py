"""A client's login as a sans-IO state machine: the bytes it sends in, events for the I/O side out.

The first packets (SSLRequest, GSSENCRequest, a direct TLS handshake, CancelRequest,
StartupMessage), the password exchange (ClientAuth) and the welcome are decided here; the
caller does what needs the outside world: the access decision, the secret lookup, the TLS
wrap, the pool. Each method returns the events to act on, in order. An event that waits for
a decision (TlsRequested, StartupReceived) is the last of its list: the bytes that came after
it wait in the machine until the caller answers (accept_tls / refuse_tls, begin_auth /
await_secret).

    STARTUP --SSLRequest/direct TLS--> TLS_ASKED --accept_tls (StartTls) / refuse_tls--> STARTUP
    STARTUP --StartupMessage--> DECIDING --await_secret--> AUTH (no exchange yet)
    DECIDING or AUTH --begin_auth--> AUTH --Authenticated--> AUTHENTICATED --welcome--> DONE
    AUTH --CheckPassword--> CHECKING --password_checked--> AUTHENTICATED (or DONE: Failed)
    any --CancelRequested / Failed / Close--> DONE
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ..errors import PgtarnError, ProtocolViolation
from . import build
from .cancelkey import Key
from .client_side import ClientAuth
from .framing import MessageScanner, StartupReader
from .messages import CANCEL_REQUEST, GSSENC_REQUEST, SSL_REQUEST, parse_startup
from .msgtypes import ALL_TYPES, PASSWORD_MESSAGE, TERMINATE
from .parameters import BAD_OPTIONS, parse_options
from .welcome import Welcome, WelcomeCache, build_welcome

#: The longest message of the password exchange (its length field): a PasswordMessage with
#: PgBouncer's longest password, 65,531 bytes; SCRAM messages are far shorter. Bounded, so
#: that a client cannot make the login buffer grow without end.
MAX_LOGIN_MESSAGE = 65536
#: The longest startup packet: PostgreSQL's own limit (MAX_STARTUP_PACKET_LENGTH).
MAX_STARTUP_PACKET = 10000
#: The first byte of a TLS record (a handshake): no startup packet is that long.
_TLS_HANDSHAKE = b"\x16"


# --- events ----------------------------------------------------------------------------------
# Dataclasses for their equality and repr, with an __init__ of their own: the compiled build
# makes it a C constructor, where a generated dataclass __init__ stays interpreted (a frozen
# one took 4,800 instructions; a login makes eight events). The fields are Final: mypy
# refuses a write after __init__, as frozen=True refused it at run time.


@dataclass(init=False, slots=True)
class Send:
    """Bytes for the client."""

    data: Final[bytes]

    def __init__(self, data: bytes) -> None:
        self.data = data


@dataclass(init=False, slots=True)
class TlsRequested:
    """The client asks for TLS: an SSLRequest, or (direct) a TLS handshake right away, as
    PostgreSQL 17's sslnegotiation=direct. Answer with accept_tls or refuse_tls."""

    direct: Final[bool]

    def __init__(self, direct: bool) -> None:
        self.direct = direct


@dataclass(init=False, slots=True)
class StartTls:
    """accept_tls's answer: send reply ('S' to an SSLRequest, nothing before a direct
    handshake), then wrap the connection in TLS (received: bytes already read that belong to
    the handshake), then call tls_started."""

    reply: Final[bytes]
    received: Final[bytes]

    def __init__(self, reply: bytes, received: bytes) -> None:
        self.reply = reply
        self.received = received


@dataclass(init=False, slots=True)
class CancelRequested:
    """A CancelRequest for the BackendKeyData key (pid, secret); the connection ends with it."""

    key: Final[tuple[int, int]]

    def __init__(self, key: tuple[int, int]) -> None:
        self.key = key


@dataclass(init=False, slots=True)
class Startup:
    """What a StartupMessage asks for, before any check of it."""

    user: Final[str]  # "" when missing (check_startup refuses that)
    database: Final[str]  # as asked, or the user name
    params: Final[Mapping[str, str]]  # every other parameter, but the protocol options (_pq_.*)

    def __init__(self, user: str, database: str, params: Mapping[str, str]) -> None:
        self.user = user
        self.database = database
        self.params = params


@dataclass(init=False, slots=True)
class StartupReceived:
    """A StartupMessage: the caller decides who may log in (check_startup, then begin_auth, or
    await_secret while it looks the secret up)."""

    startup: Final[Startup]

    def __init__(self, startup: Startup) -> None:
        self.startup = startup


@dataclass(init=False, slots=True)
class Authenticated:
    """The password exchange succeeded (its AuthenticationOk was sent); welcome comes next.

    scram_keys: (ClientKey, ServerKey) when it was SCRAM against a stored verifier, so that
    servers can log in with the client's own keys."""

    scram_keys: Final[tuple[bytes, bytes] | None]

    def __init__(self, scram_keys: tuple[bytes, bytes] | None) -> None:
        self.scram_keys = scram_keys


@dataclass(init=False, slots=True, repr=False)
class CheckPassword:
    """The client sent the cleartext password of a method checked outside the login (method:
    pam or ldap): the caller checks it and answers with password_checked. Nothing else is
    read meanwhile but a Terminate."""

    method: Final[str]
    password: Final[str]

    def __init__(self, method: str, password: str) -> None:
        self.method = method
        self.password = password

    def __repr__(self) -> str:
        # a repr may end up in a log: never the password
        return f"CheckPassword({self.method!r}, password=<hidden>)"


@dataclass(init=False, slots=True)
class Failed:
    """The login ends with error; response is its ErrorResponse, to send before closing."""

    error: Final[PgtarnError]
    response: Final[bytes]

    def __init__(self, error: PgtarnError, response: bytes) -> None:
        self.error = error
        self.response = response


@dataclass(init=False, slots=True)
class Close:
    """End the connection without a word; reason (for the log) is "" for a Terminate."""

    reason: Final[str]

    def __init__(self, reason: str) -> None:
        self.reason = reason


Event = (
    Send
    | TlsRequested
    | CancelRequested
    | StartupReceived
    | CheckPassword
    | Authenticated
    | Failed
    | Close
)


def failed(error: PgtarnError) -> Failed:
    """The Failed event for error, with its ErrorResponse."""
    return Failed(error, build.error_response(error.sqlstate, error.message, error.severity))


#: int.from_bytes as a C value (compiled, a type's attribute is a generic lookup per call).
_FROM_BYTES: Final = int.from_bytes

#: _name_maps' answers by their arguments: a dictionary, not functools.lru_cache (compiled,
#: its wrapper is a generic call of about 1,000 instructions). Bounded: cleared when full.
_NAME_MAPS: Final[
    dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Mapping[str, str], frozenset[str]]]
] = {}
_NAME_MAPS_MAX: Final = 16


class _LastNameMaps:
    """The _name_maps asked for last, by the identity of its tuples: a configuration's are
    the same objects at every login, where a lookup by them hashes every name."""

    __slots__ = ("ignored", "maps", "tracked")

    def __init__(self) -> None:
        self.tracked: tuple[str, ...] | None = None
        self.ignored: tuple[str, ...] | None = None
        self.maps: tuple[Mapping[str, str], frozenset[str]] = ({}, frozenset())


_LAST_NAME_MAPS: Final = _LastNameMaps()


def _name_maps(
    tracked: tuple[str, ...], ignored: tuple[str, ...]
) -> tuple[Mapping[str, str], frozenset[str]]:
    """check_startup's lookups, the same at every login: tracked names by their lower case,
    and the ignored ones in lower case."""
    last = _LAST_NAME_MAPS
    if tracked is last.tracked and ignored is last.ignored:
        return last.maps
    key = (tracked, ignored)
    maps = _NAME_MAPS.get(key)
    if maps is None:
        if len(_NAME_MAPS) >= _NAME_MAPS_MAX:
            _NAME_MAPS.clear()
        maps = _NAME_MAPS[key] = (
            {name.lower(): name for name in tracked},
            frozenset(name.lower() for name in ignored),
        )
    last.tracked, last.ignored, last.maps = tracked, ignored, maps
    return maps


#: PostgreSQL's spellings of a boolean (parse_bool): these words, any prefix of
#: true/false/yes/no, and "of" for off ("o" alone is neither).
_TRUE_WORDS = frozenset({"on", "1"})
_FALSE_WORDS = frozenset({"off", "of", "0"})


def replication_mode(value: str) -> str:
    """The kind of replication connection a StartupMessage's ``replication`` asks for:
    "logical" (database), "physical" (a true boolean) or "" (a false one), as PostgreSQL
    reads it; any other value is refused with PostgreSQL's error."""
    word = value.strip().lower()
    if word == "database":
        return "logical"
    if word in _TRUE_WORDS or (word and ("true".startswith(word) or "yes".startswith(word))):
        return "physical"
    if word in _FALSE_WORDS or (word and ("false".startswith(word) or "no".startswith(word))):
        return ""
    raise PgtarnError(f'invalid value for parameter "replication": "{value}"', sqlstate="22023")


# --- the machine -----------------------------------------------------------------------------


class LoginState(enum.Enum):
    """Where a login is (see the module docstring's diagram)."""

    STARTUP = "startup"  # reading SSLRequest, GSSENCRequest, CancelRequest or StartupMessage
    TLS_ASKED = "tls asked"  # TlsRequested: waiting for accept_tls or refuse_tls
    DECIDING = "deciding"  # StartupReceived: waiting for begin_auth or await_secret
    AUTH = "auth"  # the password exchange (or waiting for the secret: no exchange yet)
    CHECKING = "checking"  # CheckPassword: waiting for password_checked
    AUTHENTICATED = "authenticated"  # waiting for welcome
    DONE = "done"  # welcomed, refused, cancelled or closed: bytes are ignored


class ClientLogin:
    """One client's login (see the module docstring)."""

    __slots__ = (
        "_auth",
        "_binding",
        "_direct",
        "_reader",
        "_scanner",
        "_unread",
        "direct_settings",
        "startup",
        "startup_params",
        "startup_settings",
        "state",
        "tls",
    )

    def __init__(self) -> None:
        self.state = LoginState.STARTUP
        #: TLS is on (accept_tls); a later SSLRequest is answered 'N'.
        self.tls = False
        self._binding: bytes | None = None
        self._direct = False
        self._reader = StartupReader(MAX_STARTUP_PACKET)
        # Every type is read: any but PasswordMessage and Terminate is refused.
        self._scanner = MessageScanner(ALL_TYPES, MAX_LOGIN_MESSAGE)
        #: Bytes received behind a packet that waits for a decision.
        self._unread = b""
        self._auth: ClientAuth | None = None
        #: The StartupMessage, once received; the tracked parameters it sets (check_startup).
        self.startup: Startup | None = None
        self.startup_params: dict[str, str] = {}
        #: Settings from options that are not tracked parameters (check_startup).
        self.startup_settings: dict[str, str] = {}
        #: Which of startup_settings came as startup parameters of their own, not in options.
        self.direct_settings: set[str] = set()

    # --- bytes in ------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Bytes from the client; the events they cause."""
        events: list[Event] = []
        state = self.state
        try:
            if state is LoginState.STARTUP:
                self._first_packets(events, data)
            elif state is LoginState.AUTH:
                self._messages(events, data)
            elif state in (LoginState.TLS_ASKED, LoginState.DECIDING):
                self._unread += data  # read once the caller has answered
            elif state is LoginState.CHECKING:  # only a Terminate is in order
                self._messages(events, data)
            elif state is LoginState.AUTHENTICATED:
                raise ProtocolViolation("message received before ReadyForQuery")
        except PgtarnError as error:
            # what was answered before the error still goes out, then the error
            events.append(self._fail(error))
        return events

    def _first_packets(self, events: list[Event], data: bytes) -> None:
        while True:
            if data[:1] == _TLS_HANDSHAKE and not self.tls and not self._reader.pending:
                # A TLS record where a startup packet's length begins: direct TLS.
                self._ask_tls(events, data, direct=True)
                return
            body, rest = self._reader.feed(data)
            if body is None:
                return
            code = _FROM_BYTES(body[:4], "big")
            if code >> 16 != 3 and code not in (SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST):
                # PostgreSQL's answer to a major version it does not speak, checked before the
                # rest of the packet as PostgreSQL does (a 2.0 packet has no parameter list)
                raise PgtarnError(
                    f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
                    "server supports 3.0 to 3.0",
                    sqlstate="0A000",
                    severity="FATAL",
                )
            packet = parse_startup(body)
            if packet.code == SSL_REQUEST and not self.tls:
                self._ask_tls(events, rest, direct=False)
                return
            if packet.code in (SSL_REQUEST, GSSENC_REQUEST):
                events.append(Send(b"N"))
                data = rest
                continue
            if packet.cancel_key is not None:
                self.state = LoginState.DONE
                events.append(CancelRequested(packet.cancel_key))
                return
            if packet.minor != 0:
                # At once, as PostgreSQL does: libpq 18, asking for 3.2, takes it only before
                # the authentication request (3.0 is spoken, its options not understood).
                unknown = [name for name in packet.params if name.startswith("_pq_.")]
                events.append(Send(build.negotiate_protocol_version(0, unknown)))
            given = packet.params
            user = given.get("user", "")
            database = given.get("database", "") or user
            # (no dict.pop: compiled, a pop with a default is a generic method call)
            params = {
                k: v
                for k, v in given.items()
                if k != "user" and k != "database" and not k.startswith("_pq_.")
            }
            self.startup = Startup(user, database, params)
            self.state = LoginState.DECIDING
            self._unread = rest
            events.append(StartupReceived(self.startup))
            return

    def _ask_tls(self, events: list[Event], received: bytes, direct: bool) -> None:
        self.state = LoginState.TLS_ASKED
        self._unread = received
        self._direct = direct
        events.append(TlsRequested(direct))

    def _messages(self, events: list[Event], data: bytes) -> None:
        """Messages of the password exchange: PasswordMessage, or Terminate."""
        auth = self._auth
        check = False
        for msg_type, body, _end in self._scanner.feed(data):
            if msg_type == TERMINATE:
                self.state = LoginState.DONE
                events.append(Close(""))
                return
            if self.state is LoginState.CHECKING:  # the client waits for the verdict
                raise ProtocolViolation("message received during authentication")
            if auth is None:  # the secret is still being looked up: nothing was asked yet
                raise ProtocolViolation("message received before an authentication request")
            if msg_type != PASSWORD_MESSAGE:
                raise ProtocolViolation(f"expected a password message, got {chr(msg_type)!r}")
            reply = auth.feed(body)
            if auth.password is not None:  # checked elsewhere: password_checked answers
                self.state = LoginState.CHECKING
                check = True
                continue
            events.append(Send(reply))
            if auth.done:  # what the client sent behind it is not read
                self._authenticated(events, auth)
                return
        if check and auth is not None and auth.password is not None:
            # once every message of the chunk is read: one that breaks the rules ends the
            # login before any check is made
            events.append(CheckPassword(auth.auth_type, auth.password))

    def _authenticated(self, events: list[Event], auth: ClientAuth) -> None:
        self.state = LoginState.AUTHENTICATED
        self._auth = None
        self._unread = b""  # sent behind the last password message: not read
        events.append(Authenticated(auth.scram_keys))

    def _fail(self, error: PgtarnError) -> Failed:
        self.state = LoginState.DONE
        self._auth = None
        return failed(error)

    # --- the caller's answers ------------------------------------------------------------------

    def accept_tls(self) -> StartTls:
        """After TlsRequested: TLS it is."""
        self._expect(LoginState.TLS_ASKED)
        received, self._unread = self._unread, b""
        self.tls = True
        self.state = LoginState.STARTUP
        return StartTls(b"" if self._direct else b"S", received)

    def tls_started(self, binding: bytes | None) -> None:
        """The connection is wrapped in TLS; binding: the tls-server-end-point data of the
        certificate it presents, for SCRAM-SHA-256-PLUS (None: no channel binding)."""
        self._binding = binding

    def refuse_tls(self) -> list[Event]:
        """After TlsRequested: no TLS here ('N' to an SSLRequest; a direct TLS handshake, which
        could not read an error either, is just closed)."""
        self._expect(LoginState.TLS_ASKED)
        if self._direct:
            self.state = LoginState.DONE
            return [Close("direct TLS connection, but client TLS is disabled")]
        self.state = LoginState.STARTUP
        rest, self._unread = self._unread, b""
        return [Send(b"N"), *self.receive_data(rest)] if rest else [Send(b"N")]

    def check_startup(self, tracked: Sequence[str], ignored: Iterable[str]) -> Failed | None:
        """After StartupReceived: refuse a StartupMessage without a user; keep the tracked
        parameters (startup_params) and the others as session settings (startup_settings,
        for the caller to apply as a session setting or refuse, as PgBouncer refuses them).

        options (`-c name=value` pairs) is read as PgBouncer reads it: a tracked name is a
        tracked parameter (one given outside options wins, as in PostgreSQL); a name in
        ignored, or any name when options itself is ignored, is dropped. A parameter of its
        own that is neither tracked nor ignored (pgJDBC's extra_float_digits) is a setting as
        if options had it (noted in direct_settings)."""
        self._expect(LoginState.DECIDING)
        assert self.startup is not None
        if not self.startup.user:
            return self._fail(
                PgtarnError("no user name specified in startup packet", sqlstate="28000")
            )
        canonical, ignored_names = _name_maps(
            tracked if isinstance(tracked, tuple) else tuple(tracked),
            ignored if isinstance(ignored, tuple) else tuple(ignored),
        )
        params = self.startup.params
        if "options" in params:
            pairs = parse_options(params["options"])
            if pairs is None:
                return self._fail(PgtarnError(BAD_OPTIONS, sqlstate="08P01"))
            for name, value in pairs:
                tracked_name = canonical.get(name.lower())
                if tracked_name is not None:
                    self.startup_params[tracked_name] = value
                elif name.lower() not in ignored_names and "options" not in ignored_names:
                    self.startup_settings[name.lower()] = value
        for name, value in params.items():
            tracked_name = canonical.get(name.lower())
            if tracked_name is not None:
                self.startup_params[tracked_name] = value
            elif name != "options" and name.lower() not in ignored_names:
                if name == "replication" or name.startswith("_pq_."):  # not settings
                    return self._fail(
                        PgtarnError(f"unsupported startup parameter: {name}", sqlstate="08P01")
                    )
                self.startup_settings[name.lower()] = value  # over options, as in PostgreSQL
                self.direct_settings.add(name.lower())
        return None

    def await_secret(self) -> list[Event]:
        """After StartupReceived: the caller looks the user's secret up (begin_auth follows).
        Meanwhile any message but Terminate is refused: nothing was asked yet."""
        self._expect(LoginState.DECIDING)
        self.state = LoginState.AUTH
        rest, self._unread = self._unread, b""
        return self.receive_data(rest) if rest else []

    @property
    def awaiting_secret(self) -> bool:
        """await_secret was called, begin_auth not yet (and the login goes on)."""
        return self.state is LoginState.AUTH and self._auth is None

    def begin_auth(
        self, method: str, secret: str | None, scram_iterations: int = 4096
    ) -> list[Event]:
        """Start the password exchange of method (a ClientAuth auth type) against the user's
        secret (None: unknown user): its first message, then what the bytes received
        meanwhile bring. scram_iterations: for a SCRAM exchange against a plaintext secret."""
        if not (self.state is LoginState.DECIDING or self.awaiting_secret):
            raise RuntimeError(f"begin_auth in state {self.state.value}")
        assert self.startup is not None
        try:
            auth = ClientAuth(method, self.startup.user, secret, scram_iterations, self._binding)
        except PgtarnError as error:
            return [self._fail(error)]
        self._auth = auth
        self.state = LoginState.AUTH
        events: list[Event] = [Send(auth.start())]
        if auth.done:
            self._authenticated(events, auth)
            return events
        rest, self._unread = self._unread, b""
        if rest:
            events += self.receive_data(rest)
        return events

    def password_checked(self, error: PgtarnError | None) -> list[Event]:
        """After CheckPassword: the check's verdict (None: the password is right; else the
        error the login ends with)."""
        self._expect(LoginState.CHECKING)
        auth = self._auth
        assert auth is not None
        if error is not None:
            return [self._fail(error)]
        events: list[Event] = [Send(auth.checked())]
        self._authenticated(events, auth)
        return events

    def welcome(
        self,
        server_params: Mapping[str, str],
        tracked: Iterable[str],
        cancel_key: Key,
        reported: Mapping[tuple[str, str], str] | None = None,
    ) -> Welcome:
        """After Authenticated: the welcome (build_welcome) with this client's parameters."""
        self._expect(LoginState.AUTHENTICATED)
        self.state = LoginState.DONE
        return build_welcome(server_params, self.startup_params, tracked, cancel_key, reported)

    def pool_welcome(
        self,
        cache: WelcomeCache,
        server_params: Mapping[str, str],
        tracked: tuple[str, ...],
        cancel_key: Key,
        reported: Mapping[tuple[str, str], str],
        share: Callable[[dict[str, str]], dict[str, str]],
    ) -> Welcome:
        """welcome, for a pool's client: through the cache (its params already shared)."""
        self._expect(LoginState.AUTHENTICATED)
        self.state = LoginState.DONE
        return cache.welcome(
            server_params, self.startup_params, tracked, cancel_key, reported, share
        )

    def _expect(self, state: LoginState) -> None:
        if self.state is not state:
            # the caller's mistake, not the client's: no ErrorResponse for it
            raise RuntimeError(f"login in state {self.state.value}, not {state.value}")
