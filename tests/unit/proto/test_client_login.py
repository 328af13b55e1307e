"""ClientLogin driven with bytes: first packets, TLS, cancel, password exchanges, the welcome."""

from __future__ import annotations

import struct

import pytest

from pgtarn.auth.md5 import md5_response, md5_secret
from pgtarn.auth.scram import MECHANISM_PLUS, ScramClient, make_verifier, parse_sasl_mechanisms
from pgtarn.errors import AuthFailed, PgtarnError, ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.client_login import (
    Authenticated,
    CancelRequested,
    ClientLogin,
    Close,
    Event,
    Failed,
    LoginState,
    Send,
    StartTls,
    Startup,
    StartupReceived,
    TlsRequested,
    _name_maps,
    replication_mode,
)
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import GSSENC_REQUEST, parse_fields
from pgtarn.proto.welcome import build_welcome

GSSENC = struct.pack("!II", 8, GSSENC_REQUEST)
TRACKED = (
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
)
ITERATIONS = 2  # fast SCRAM for plaintext secrets
KEY = (1234, 5678)


def startup(**params: str) -> bytes:
    return build.startup_message(params)


def sent(events: list[Event]) -> bytes:
    """Everything the events send to the client, in order."""
    return b"".join(e.data for e in events if isinstance(e, Send))


def only_failure(events: list[Event]) -> Failed:
    failures = [e for e in events if isinstance(e, Failed)]
    assert len(failures) == 1 and events[-1] is failures[0], events
    return failures[0]


def fields(response: bytes) -> dict[str, str]:
    ((msg_type, body),) = split_messages(response)
    assert msg_type == ord("E")
    return parse_fields(body)


def auth_code(message: bytes) -> int:
    msg_type, body = split_messages(message)[0]
    assert msg_type == ord("R")
    return int(struct.unpack("!I", body[:4])[0])


def started(user: str = "alice", tls_binding: bytes | None = None, **params: str) -> ClientLogin:
    """A login past its StartupMessage (and checked), waiting for begin_auth."""
    login = ClientLogin()
    if tls_binding is not None:
        login.receive_data(build.SSL_REQUEST)
        login.accept_tls()
        login.tls_started(tls_binding)
    events = login.receive_data(startup(user=user, **params))
    assert [type(e) for e in events] == [StartupReceived]
    assert login.check_startup(TRACKED, ()) is None
    return login


# --- the first packets ----------------------------------------------------------------------


def test_ssl_request_accepted_then_startup_over_tls() -> None:
    login = ClientLogin()
    assert login.receive_data(build.SSL_REQUEST) == [TlsRequested(direct=False)]
    assert login.accept_tls() == StartTls(b"S", b"")
    login.tls_started(None)
    events = login.receive_data(startup(user="alice", database="db", TimeZone="UTC"))
    assert events == [StartupReceived(Startup("alice", "db", {"TimeZone": "UTC"}))]
    # a second SSLRequest, over TLS already, is refused
    again = ClientLogin()
    again.receive_data(build.SSL_REQUEST)
    again.accept_tls()
    assert again.receive_data(build.SSL_REQUEST) == [Send(b"N")]


def test_handshake_bytes_behind_an_ssl_request_go_to_tls() -> None:
    login = ClientLogin()
    assert login.receive_data(build.SSL_REQUEST + b"\x16\x03\x01") == [TlsRequested(False)]
    assert login.accept_tls() == StartTls(b"S", b"\x16\x03\x01")


def test_ssl_request_refused_and_the_startup_behind_it_is_read() -> None:
    login = ClientLogin()
    assert login.receive_data(build.SSL_REQUEST + startup(user="bob")) == [TlsRequested(False)]
    assert login.refuse_tls() == [Send(b"N"), StartupReceived(Startup("bob", "bob", {}))]


def test_gssenc_request_is_refused() -> None:
    login = ClientLogin()
    assert login.receive_data(GSSENC) == [Send(b"N")]
    assert login.receive_data(startup(user="u")) == [StartupReceived(Startup("u", "u", {}))]
    # in one chunk too, and then an SSLRequest may follow
    login = ClientLogin()
    assert login.receive_data(GSSENC + build.SSL_REQUEST) == [Send(b"N"), TlsRequested(False)]


def test_direct_tls() -> None:
    hello = b"\x16\x03\x01\x02\x00" + b"\x01" * 40
    login = ClientLogin()
    assert login.receive_data(hello) == [TlsRequested(direct=True)]
    assert login.accept_tls() == StartTls(b"", hello)
    assert login.state is LoginState.STARTUP and login.tls
    refused = ClientLogin()
    refused.receive_data(hello)
    assert refused.refuse_tls() == [Close("direct TLS connection, but client TLS is disabled")]
    assert refused.receive_data(startup(user="u")) == []


def test_a_handshake_byte_inside_a_startup_packet_is_no_direct_tls() -> None:
    packet = startup(user="u")
    login = ClientLogin()
    assert login.receive_data(packet[:4]) == []
    assert login.receive_data(b"\x16" + packet[5:]) != [TlsRequested(direct=True)]


def test_cancel_request_carries_the_key_and_ends_the_login() -> None:
    login = ClientLogin()
    events = login.receive_data(build.cancel_request(1234, 987654321) + startup(user="u"))
    assert events == [CancelRequested((1234, 987654321))]
    assert login.receive_data(startup(user="u")) == []


def test_startup_in_pieces() -> None:
    packet = startup(user="u", database="d")
    login = ClientLogin()
    events: list[Event] = []
    for i in range(len(packet)):
        events += login.receive_data(packet[i : i + 1])
    assert events == [StartupReceived(Startup("u", "d", {}))]


@pytest.mark.parametrize(("version", "text"), [((2, 0), "2.0"), ((4, 1), "4.1")])
def test_unsupported_protocol_version(version: tuple[int, int], text: str) -> None:
    body = struct.pack("!HH", *version) + b"user\x00u\x00\x00"
    events = ClientLogin().receive_data(struct.pack("!I", len(body) + 4) + body)
    failure = only_failure(events)
    assert failure.error.sqlstate == "0A000"
    assert fields(failure.response)["C"] == "0A000"
    assert fields(failure.response)["M"] == (
        f"unsupported frontend protocol {text}: server supports 3.0 to 3.0"
    )
    assert fields(failure.response)["S"] == "FATAL"


def test_error_after_an_answer_comes_after_it() -> None:
    events = ClientLogin().receive_data(GSSENC + struct.pack("!I", 3))
    assert events[0] == Send(b"N")
    assert fields(only_failure(events).response)["M"] == "invalid startup packet length 3"


@pytest.mark.parametrize("length", [10001, 2**31, 7])
def test_startup_packet_length_limits(length: int) -> None:
    login = ClientLogin()
    failure = only_failure(login.receive_data(struct.pack("!I", length) + b"\x00" * 8))
    assert isinstance(failure.error, ProtocolViolation)
    assert fields(failure.response)["C"] == "08P01"
    assert fields(failure.response)["M"] == f"invalid startup packet length {length}"
    assert login.receive_data(startup(user="u")) == []  # refused: nothing more is read


def test_malformed_startup_packet() -> None:
    body = struct.pack("!I", 196608) + b"user\x00u"  # not terminated
    failure = only_failure(ClientLogin().receive_data(struct.pack("!I", len(body) + 4) + body))
    assert failure.error.sqlstate == "08P01"


def test_missing_user_is_refused() -> None:
    login = ClientLogin()
    events = login.receive_data(startup(database="d"))
    assert events == [StartupReceived(Startup("", "d", {}))]
    failure = login.check_startup(TRACKED, ())
    assert failure is not None
    assert fields(failure.response)["C"] == "28000"
    assert fields(failure.response)["M"] == "no user name specified in startup packet"


def test_startup_parameters_tracked_ignored_or_refused() -> None:
    login = ClientLogin()
    login.receive_data(
        startup(user="u", timezone="UTC", APPLICATION_NAME="app", extra_float_digits="3")
    )
    assert login.check_startup(TRACKED, ["Extra_Float_Digits"]) is None
    assert login.startup_params == {"TimeZone": "UTC", "application_name": "app"}
    login = ClientLogin()
    login.receive_data(startup(user="u", replication="x"))
    failure = login.check_startup(TRACKED, ["extra_float_digits"])
    assert failure is not None
    assert fields(failure.response)["C"] == "08P01"
    assert fields(failure.response)["M"] == "unsupported startup parameter: replication"


def test_other_startup_parameters_are_session_settings_as_in_options() -> None:
    # pgJDBC sends extra_float_digits: a setting the caller applies (tracked session) or
    # refuses with PgBouncer's words
    login = ClientLogin()
    login.receive_data(
        startup(
            user="u",
            extra_float_digits="3",
            DateStyle="ISO",
            options="-c extra_float_digits=2 -c geqo=off",
        )
    )
    assert login.check_startup(TRACKED, ()) is None
    assert login.startup_params == {"DateStyle": "ISO"}
    assert login.startup_settings == {"extra_float_digits": "3", "geqo": "off"}
    assert login.direct_settings == {"extra_float_digits"}


def test_newer_minor_version_is_negotiated_before_authentication() -> None:
    """NegotiateProtocolVersion comes right after the StartupMessage, as PostgreSQL sends it:
    libpq 18 asking for 3.2 refuses it after the authentication request."""
    body = struct.pack("!HH", 3, 2) + b"user\x00u\x00_pq_.fancy\x00on\x00\x00"
    login = ClientLogin()
    events = login.receive_data(struct.pack("!I", len(body) + 4) + body)
    negotiate = build.message(b"v", struct.pack("!II", 3 << 16, 1) + b"_pq_.fancy\x00")
    assert events == [Send(negotiate), StartupReceived(Startup("u", "u", {}))]
    assert login.check_startup(TRACKED, ()) is None
    login.begin_auth("any", None)
    welcome = login.welcome({"server_version": "16"}, TRACKED, KEY)
    assert all(kind != ord("v") for kind, _ in split_messages(welcome.data))  # once only


# --- the password exchanges -----------------------------------------------------------------


def test_trust() -> None:
    login = started()
    assert login.begin_auth("trust", "whatever") == [Send(build.AUTH_OK), Authenticated(None)]
    assert login.state is LoginState.AUTHENTICATED


def test_trust_refuses_an_unknown_user() -> None:
    failure = only_failure(started(user="ghost").begin_auth("trust", None))
    assert fields(failure.response)["C"] == "28000"
    assert fields(failure.response)["M"] == '"trust" authentication failed'


def test_md5_exchange() -> None:
    login = started(user="u")
    (challenge,) = [
        e.data for e in login.begin_auth("md5", md5_secret("pw", "u")) if isinstance(e, Send)
    ]
    assert auth_code(challenge) == 5
    salt = split_messages(challenge)[0][1][4:8]
    reply = build.password_message(md5_response("pw", "u", salt) + b"\x00")
    assert login.receive_data(reply) == [Send(build.AUTH_OK), Authenticated(None)]


def scram_exchange(
    login: ClientLogin,
    client: ScramClient,
    secret: str,
    method: str,
    mechanism: str = "SCRAM-SHA-256",
) -> list[Event]:
    """Play client's side of a SCRAM login; the events of its last message."""
    events = login.begin_auth(method, secret, ITERATIONS)
    assert auth_code(sent(events)) == 10
    offered = parse_sasl_mechanisms(split_messages(sent(events))[0][1][4:])
    assert mechanism in offered
    events = login.receive_data(build.sasl_initial_response(mechanism, client.client_first()))
    ((msg_type, body),) = split_messages(sent(events))
    assert msg_type == ord("R") and body[:4] == struct.pack("!I", 11)
    events = login.receive_data(build.sasl_response(client.handle_server_first(body[4:])))
    final = split_messages(sent(events))
    if final and final[0][1][:4] == struct.pack("!I", 12):
        client.handle_server_final(final[0][1][4:])  # the server proves it knows the secret
    return events


@pytest.mark.parametrize("method", ["scram-sha-256", "md5"])
def test_scram_against_a_stored_verifier(method: str) -> None:
    verifier = make_verifier("pw", iterations=ITERATIONS)
    login = started(user="u")
    events = scram_exchange(login, ScramClient("pw"), verifier.to_string(), method)
    assert [auth_code(build.message(b"R", body)) for _, body in split_messages(sent(events))] == [
        12,
        0,
    ]
    (authenticated,) = [e for e in events if isinstance(e, Authenticated)]
    assert authenticated.scram_keys is not None
    assert authenticated.scram_keys[1] == verifier.server_key
    assert login.state is LoginState.AUTHENTICATED


def test_scram_against_a_plaintext_secret() -> None:
    events = scram_exchange(started(user="u"), ScramClient("pw"), "pw", "scram-sha-256")
    assert events[-1] == Authenticated(None)


@pytest.mark.parametrize("secret", ["pw", make_verifier("pw", iterations=ITERATIONS).to_string()])
def test_scram_wrong_password_gives_28p01(secret: str) -> None:
    login = started(user="u")
    events = scram_exchange(login, ScramClient("wrong"), secret, "scram-sha-256")
    failure = only_failure(events)
    assert isinstance(failure.error, AuthFailed)
    assert failure.response == build.error_response("28P01", "SASL authentication failed", "FATAL")
    assert login.state is LoginState.DONE
    assert login.receive_data(build.password_message(b"again\x00")) == []


def test_md5_wrong_password_gives_28p01() -> None:
    login = started(user="u")
    login.begin_auth("md5", md5_secret("pw", "u"))
    failure = only_failure(login.receive_data(build.password_message(b"md5nope\x00")))
    assert fields(failure.response) == {
        "S": "FATAL",
        "V": "FATAL",
        "C": "28P01",
        "M": "password authentication failed",
    }


def test_channel_binding_with_the_certificate_hash() -> None:
    binding = b"\x42" * 32  # what tls_started is given: the hash of pgtarn's certificate
    login = started(user="u", tls_binding=binding)
    client = ScramClient("pw", channel_binding=binding)
    events = scram_exchange(login, client, "pw", "scram-sha-256", mechanism=MECHANISM_PLUS)
    assert events[-1] == Authenticated(None)
    # a client bound to another certificate (a man in the middle) is refused
    login = started(user="u", tls_binding=binding)
    other = ScramClient("pw", channel_binding=b"\x43" * 32)
    failure = only_failure(
        scram_exchange(login, other, "pw", "scram-sha-256", mechanism=MECHANISM_PLUS)
    )
    assert fields(failure.response)["C"] == "08P01"
    assert fields(failure.response)["M"] == "SCRAM channel binding check failed"


def test_no_channel_binding_without_tls() -> None:
    events = started(user="u").begin_auth("scram-sha-256", "pw", ITERATIONS)
    offered = parse_sasl_mechanisms(split_messages(sent(events))[0][1][4:])
    assert offered == ["SCRAM-SHA-256"]


def test_plain_password_pipelined_behind_the_startup() -> None:
    login = ClientLogin()
    chunk = startup(user="u") + build.password_message(b"pw\x00") + build.query("SELECT 1")
    assert [type(e) for e in login.receive_data(chunk)] == [StartupReceived]
    assert login.check_startup(TRACKED, ()) is None
    events = login.begin_auth("plain", "pw")
    assert events == [Send(build.authentication(3)), Send(build.AUTH_OK), Authenticated(None)]
    # the Query behind the password is not read; anything later is too early
    failure = only_failure(login.receive_data(build.query("SELECT 2")))
    assert fields(failure.response)["M"] == "message received before ReadyForQuery"


def test_a_message_other_than_a_password_is_refused() -> None:
    login = started()
    login.begin_auth("plain", "pw")
    failure = only_failure(login.receive_data(build.query("SELECT 1")))
    assert fields(failure.response)["M"] == "expected a password message, got 'Q'"
    assert fields(failure.response)["C"] == "08P01"


def test_a_password_message_too_long() -> None:
    login = started()
    login.begin_auth("plain", "pw")
    failure = only_failure(login.receive_data(b"p" + struct.pack("!I", 65537)))
    assert fields(failure.response)["M"] == "invalid message length 65537 for message type 'p'"


def test_a_password_of_pgbouncers_longest_length_is_read() -> None:
    password = "x" * 65531  # its PasswordMessage has a length field of 65,536
    login = started()
    login.begin_auth("plain", password)
    events = login.receive_data(build.password_message(password.encode() + b"\0"))
    assert any(isinstance(e, Authenticated) for e in events)


def test_unsupported_auth_type() -> None:
    failure = only_failure(started().begin_auth("gss", "pw"))
    assert fields(failure.response)["M"] == "auth_type gss is not supported"


def test_while_the_secret_is_looked_up() -> None:
    login = started()
    assert login.await_secret() == []
    assert login.awaiting_secret
    failure = only_failure(login.receive_data(build.password_message(b"pw\x00")))
    assert fields(failure.response)["M"] == ("message received before an authentication request")
    login = started()
    login.await_secret()
    assert login.receive_data(build.TERMINATE) == [Close("")]
    assert not login.awaiting_secret
    # found: the exchange starts with what was received meanwhile, partial messages included
    login = started()
    login.await_secret()
    message = build.password_message(b"pw\x00")
    assert login.receive_data(message[:3]) == []
    assert login.begin_auth("plain", "pw") == [Send(build.authentication(3))]
    assert login.receive_data(message[3:]) == [Send(build.AUTH_OK), Authenticated(None)]


def test_terminate_during_the_exchange() -> None:
    login = started()
    login.begin_auth("md5", "pw")
    assert login.receive_data(build.TERMINATE) == [Close("")]
    assert login.state is LoginState.DONE


def test_answers_out_of_turn_are_the_callers_mistake() -> None:
    login = ClientLogin()
    with pytest.raises(RuntimeError):
        login.accept_tls()
    with pytest.raises(RuntimeError):
        login.begin_auth("trust", "x")
    login = started()
    with pytest.raises(RuntimeError):
        login.welcome({}, TRACKED, KEY)


# --- the welcome ----------------------------------------------------------------------------


def test_welcome_parses_back() -> None:
    login = started(user="u", TimeZone="Europe/Paris", application_name="app")
    login.begin_auth("trust", "x")
    server = {"server_version": "16.1", "TimeZone": "UTC", "client_encoding": "UTF8"}
    welcome = login.welcome(server, TRACKED, KEY)
    messages = split_messages(welcome.data)
    assert [chr(t) for t, _ in messages] == ["S", "S", "S", "S", "K", "Z"]
    statuses = [body.split(b"\x00")[:2] for t, body in messages if t == ord("S")]
    assert statuses == [
        [b"server_version", b"16.1"],
        [b"TimeZone", b"Europe/Paris"],
        [b"client_encoding", b"UTF8"],
        [b"application_name", b"app"],
    ]
    assert messages[4][1] == struct.pack("!II", *KEY)
    assert messages[5][1] == b"I"
    assert welcome.params == {
        "client_encoding": "UTF8",
        "TimeZone": "Europe/Paris",
        "application_name": "app",
    }
    assert login.state is LoginState.DONE


def test_welcome_of_the_admin_console() -> None:
    console = {"server_version": "x/pgtarn", "client_encoding": "UTF8"}
    plain = build_welcome(console, {}, ("application_name",), KEY)
    assert [t for t, _ in split_messages(plain.data)] == [ord("S"), ord("S"), ord("K"), ord("Z")]
    assert plain.params == {}
    named = build_welcome(console, {"application_name": "psql"}, ("application_name",), (5, 6))
    assert split_messages(named.data)[2] == (ord("S"), b"application_name\x00psql\x00")
    assert named.params == {"application_name": "psql"}
    assert split_messages(named.data)[3] == (ord("K"), struct.pack("!II", 5, 6))
    assert split_messages(plain.data)[2] == (ord("K"), struct.pack("!II", *KEY))


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("database", "logical"),
        ("DATABASE", "logical"),
        ("true", "physical"),
        ("on", "physical"),
        ("1", "physical"),
        ("yes", "physical"),
        ("t", "physical"),
        ("y", "physical"),
        ("false", ""),
        ("off", ""),
        ("of", ""),
        ("0", ""),
        ("no", ""),
        ("f", ""),
        ("n", ""),
    ],
)
def test_replication_mode_reads_the_parameter_as_postgresql(value: str, mode: str) -> None:
    assert replication_mode(value) == mode


@pytest.mark.parametrize("value", ["", "o", "maybe", "databases", "2"])
def test_replication_mode_refuses_other_values(value: str) -> None:
    with pytest.raises(PgtarnError) as info:
        replication_mode(value)
    assert info.value.sqlstate == "22023"
    assert info.value.message == f'invalid value for parameter "replication": "{value}"'


def test_the_welcome_reports_startup_values_as_postgresql_does() -> None:
    server = {"client_encoding": "UTF8", "DateStyle": "ISO, MDY", "TimeZone": "UTC"}
    tracked = ("client_encoding", "DateStyle", "TimeZone")
    given = {"client_encoding": "latin1", "DateStyle": "german", "TimeZone": "europe/paris"}
    welcome = build_welcome(server, given, tracked, KEY)
    assert welcome.params == {
        "client_encoding": "LATIN1",
        "DateStyle": "German, DMY",
        "TimeZone": "europe/paris",
    }
    learned = {("TimeZone", "europe/paris"): "Europe/Paris"}
    welcome = build_welcome(server, given, tracked, KEY, learned)
    assert welcome.params["TimeZone"] == "Europe/Paris"
    assert build.parameter_status("TimeZone", "Europe/Paris") in welcome.data


def test_options_give_tracked_parameters_and_settings() -> None:
    login = ClientLogin()
    options = "-c TimeZone=UTC -c work_mem=8MB --application-name=inner -c skip.me=1"
    login.receive_data(startup(user="u", options=options, application_name="outer"))
    assert login.check_startup(("TimeZone", "application_name"), ("skip.me",)) is None
    assert login.startup_params == {"TimeZone": "UTC", "application_name": "outer"}
    assert login.startup_settings == {"work_mem": "8MB"}


def test_options_ignored_keeps_only_the_tracked_ones() -> None:
    login = ClientLogin()
    login.receive_data(startup(user="u", options="-c TimeZone=UTC -c work_mem=8MB"))
    assert login.check_startup(("TimeZone",), ("options",)) is None
    assert login.startup_params == {"TimeZone": "UTC"} and login.startup_settings == {}


def test_options_that_are_not_name_value_pairs_are_refused() -> None:
    login = ClientLogin()
    login.receive_data(startup(user="u", options="-d 5"))
    failure = login.check_startup(("TimeZone",), ("options",))
    assert failure is not None and fields(failure.response)["C"] == "08P01"
    assert fields(failure.response)["M"].startswith("unsupported options startup parameter")


def test_the_name_maps_follow_the_tuples_they_are_given() -> None:
    # remembered by the identity of the tuples: another configuration's (a RELOAD) gives its own
    tracked, ignored = ("DateStyle", "TimeZone"), ("extra_float_digits",)
    assert _name_maps(tracked, ignored) == (
        {"datestyle": "DateStyle", "timezone": "TimeZone"},
        frozenset({"extra_float_digits"}),
    )
    assert _name_maps(tracked, ignored)[0] is _name_maps(tracked, ignored)[0]
    more = (*tracked, "IntervalStyle")
    assert _name_maps(more, ignored)[0]["intervalstyle"] == "IntervalStyle"
    assert _name_maps(tracked, ("Options",))[1] == frozenset({"options"})
    assert "intervalstyle" not in _name_maps(tuple(list(tracked)), ignored)[0]
