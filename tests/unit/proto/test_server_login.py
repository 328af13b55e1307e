"""ServerLogin and ServerAuth against a scripted PostgreSQL: the SSLRequest answer, each auth
method and SCRAM mechanism choice, and the bytes after the final ReadyForQuery."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pgtarn.auth.md5 import md5_response
from pgtarn.auth.scram import MECHANISM_PLUS, ScramClient, ScramServer, make_verifier
from pgtarn.errors import AuthFailed, PgtarnError, ProtocolViolation, TlsFailed
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_sasl_initial_response, parse_startup
from pgtarn.proto.server_login import (
    LoggedIn,
    Send,
    ServerAuth,
    ServerLogin,
    StartTls,
    tls_accepted,
)


def auth(code: int, payload: bytes = b"") -> bytes:
    return struct.pack("!I", code) + payload


def finish(login: ServerAuth) -> None:
    assert login.feed(ord("R"), auth(0)) == b""
    login.feed(ord("S"), b"server_version\x0015.0\x00")
    login.feed(ord("K"), struct.pack("!II", 1234, 5678))
    login.feed(ord("Z"), b"I")
    assert login.done
    assert login.params == {"server_version": "15.0"}
    assert login.backend_key == (1234, 5678)


def scram_exchange(login: ServerAuth, server: ScramServer, mechanisms: list[str]) -> None:
    payload = b"".join(m.encode() + b"\x00" for m in mechanisms) + b"\x00"
    first = split_messages(login.feed(ord("R"), auth(10, payload)))
    mechanism, client_first = parse_sasl_initial_response(first[0][1])
    assert mechanism == "SCRAM-SHA-256"
    server_first = server.handle_client_first(client_first)
    final = split_messages(login.feed(ord("R"), auth(11, server_first)))
    server_final = server.handle_client_final(final[0][1])
    assert login.feed(ord("R"), auth(12, server_final)) == b""


def test_scram_plus_offered_first_picks_plain_scram() -> None:
    login = ServerAuth("u", "secret")
    scram_exchange(
        login, ScramServer(make_verifier("secret")), ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]
    )
    finish(login)


def test_scram_passthrough_keys() -> None:
    verifier = make_verifier("secret")
    first = ScramServer(verifier)
    client = ScramClient("secret")
    server_first = first.handle_client_first(client.client_first())
    first.handle_client_final(client.handle_server_first(server_first))
    login = ServerAuth("u", None, (first.client_key, verifier.server_key))
    scram_exchange(login, ScramServer(verifier), ["SCRAM-SHA-256"])
    finish(login)


def test_wrong_scram_password_is_refused_by_the_server() -> None:
    login = ServerAuth("u", "wrong")
    with pytest.raises(AuthFailed):
        scram_exchange(login, ScramServer(make_verifier("secret")), ["SCRAM-SHA-256"])


def test_md5_and_cleartext() -> None:
    login = ServerAuth("u", "pw")
    reply = split_messages(login.feed(ord("R"), auth(5, b"salt")))
    assert reply == [(ord("p"), md5_response("pw", "u", b"salt") + b"\x00")]
    finish(login)
    login = ServerAuth("u", "pw")
    assert split_messages(login.feed(ord("R"), auth(3))) == [(ord("p"), b"pw\x00")]
    finish(login)


def test_no_usable_password_is_a_clear_error() -> None:
    verifier = make_verifier("secret").to_string()
    with pytest.raises(PgtarnError, match="no usable password"):
        ServerAuth("u", None).feed(ord("R"), auth(3))
    with pytest.raises(PgtarnError, match="no usable password"):
        ServerAuth("u", None).feed(ord("R"), auth(10, b"SCRAM-SHA-256\x00\x00"))
    with pytest.raises(PgtarnError):
        ServerAuth("u", verifier).feed(ord("R"), auth(5, b"salt"))


def test_server_error_during_login_keeps_its_sqlstate() -> None:
    login = ServerAuth("u", "pw")
    error = build.error_response("3D000", 'database "x" does not exist', "FATAL")
    with pytest.raises(PgtarnError) as info:
        login.feed(ord("E"), error[5:])
    assert info.value.sqlstate == "3D000"
    assert "does not exist" in info.value.message


def test_scram_final_missing_is_refused() -> None:
    login = ServerAuth("u", "secret")
    server = ScramServer(make_verifier("secret"))
    payload = b"SCRAM-SHA-256\x00\x00"
    first = split_messages(login.feed(ord("R"), auth(10, payload)))
    _, client_first = parse_sasl_initial_response(first[0][1])
    login.feed(ord("R"), auth(11, server.handle_client_first(client_first)))
    with pytest.raises(ProtocolViolation, match="skipped the SCRAM final"):
        login.feed(ord("R"), auth(0))


# --- ServerLogin: the whole conversation, raw bytes in -------------------------------------

WELCOME = (
    build.authentication(0)
    + build.parameter_status("server_version", "15.0")
    + build.backend_key_data(1234, 5678)
    + build.ready_for_query(b"I")
)


def startup_params(packet: bytes) -> dict[str, str]:
    """The parameters of a StartupMessage pgtarn built (length word included)."""
    return parse_startup(packet[4:]).params


def new_login(password: str | None = "pw", **auth_options: Any) -> ServerLogin:
    return ServerLogin(
        ServerAuth("u", password, **auth_options),
        "db",
        {"application_name": "app"},
    )


def test_without_tls_the_first_bytes_are_the_startup_message() -> None:
    login = new_login()
    assert startup_params(login.start()) == {
        "user": "u",
        "database": "db",
        "application_name": "app",
    }
    events = login.feed(WELCOME)
    assert events == [LoggedIn({"server_version": "15.0"}, (1234, 5678), b"")]


def test_tls_accepted_waits_for_the_handshake_then_sends_the_startup_message() -> None:
    login = new_login(channel_binding="prefer")
    assert login.start("require") == build.SSL_REQUEST
    assert login.feed(b"S") == [StartTls()]
    with pytest.raises(ProtocolViolation, match="during the TLS handshake"):
        new_login_in_handshake().feed(WELCOME)
    assert startup_params(login.tls_started(b"certificate hash"))["user"] == "u"
    # the binding data reached the authentication: SCRAM-SHA-256-PLUS is chosen
    offer = build.auth_sasl(["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])
    (send,) = login.feed(offer)
    assert isinstance(send, Send)
    ((msg_type, body),) = split_messages(send.data)
    assert msg_type == ord("p")
    assert parse_sasl_initial_response(body)[0] == MECHANISM_PLUS


def new_login_in_handshake() -> ServerLogin:
    login = new_login()
    login.start("prefer")
    login.feed(b"S")
    return login


def test_tls_refused_goes_on_in_plaintext_with_what_came_behind_the_answer() -> None:
    login = new_login()
    login.start("prefer")
    events = login.feed(b"N" + build.authentication(3))
    assert len(events) == 2 and all(isinstance(event, Send) for event in events)
    first, reply = events
    assert isinstance(first, Send) and isinstance(reply, Send)
    assert startup_params(first.data)["database"] == "db"
    assert split_messages(reply.data) == [(ord("p"), b"pw\x00")]
    assert login.feed(WELCOME)[-1] == LoggedIn({"server_version": "15.0"}, (1234, 5678), b"")


def test_tls_refused_alone_sends_only_the_startup_message() -> None:
    login = new_login()
    login.start("allow")
    (send,) = login.feed(b"N")
    assert isinstance(send, Send) and startup_params(send.data)["user"] == "u"


@pytest.mark.parametrize(
    ("answer", "mode", "error", "match"),
    [
        (b"N", "require", TlsFailed, "does not support TLS, but server_tls_sslmode = require"),
        (b"N", "verify-full", TlsFailed, "server_tls_sslmode = verify-full"),
        (b"S\x00", "prefer", ProtocolViolation, "unencrypted data after accepting TLS"),
        (b"SR", "require", ProtocolViolation, "unencrypted data after accepting TLS"),
        (b"E", "prefer", ProtocolViolation, "invalid answer"),
    ],
)
def test_bad_answers_to_ssl_request(
    answer: bytes, mode: str, error: type[PgtarnError], match: str
) -> None:
    login = new_login()
    login.start(mode)
    with pytest.raises(error, match=match):
        login.feed(answer)


def test_tls_accepted_rules() -> None:
    assert tls_accepted(b"S", "require") is True
    assert tls_accepted(b"N", "prefer") is False
    assert tls_accepted(b"N", "allow") is False
    with pytest.raises(TlsFailed, match="does not support TLS"):
        tls_accepted(b"N", "require")


def test_the_sslmode_of_the_request_judges_the_answer() -> None:
    """The answer is judged under the mode the SSLRequest went with, not a later one."""
    prefer, require = new_login(), new_login()
    prefer.start("prefer")
    require.start("require")
    assert isinstance(prefer.feed(b"N")[0], Send)
    with pytest.raises(TlsFailed):
        require.feed(b"N")


def test_bytes_after_the_final_ready_for_query_are_left_over() -> None:
    login = new_login()
    login.start()
    after = (
        build.parameter_status("TimeZone", "UTC")
        + build.error_response(
            "57P01", "terminating connection due to administrator command", "FATAL"
        )[:7]
    )
    (logged_in,) = login.feed(WELCOME + after)
    assert isinstance(logged_in, LoggedIn)
    assert logged_in.leftover == after
    assert logged_in.params == {"server_version": "15.0"}  # what came after is not the login's


def test_login_split_at_every_byte() -> None:
    login = new_login()
    login.start()
    stream = build.authentication(5, b"salt") + WELCOME
    events = []
    for i in range(len(stream)):
        events += login.feed(stream[i : i + 1])
    assert events == [
        Send(build.password_message(md5_response("pw", "u", b"salt") + b"\x00")),
        LoggedIn({"server_version": "15.0"}, (1234, 5678), b""),  # on the very last byte
    ]


def test_replies_come_in_order_from_one_chunk() -> None:
    login = new_login()
    login.start()
    events = login.feed(build.authentication(3) + WELCOME[:-6])
    assert events == [Send(build.password_message(b"pw\x00"))]
    assert login.feed(WELCOME[-6:]) == [LoggedIn({"server_version": "15.0"}, (1234, 5678), b"")]


def test_a_huge_length_during_login_is_refused_at_once() -> None:
    login = ServerLogin(ServerAuth("u", "pw"), "db", max_message=4096)
    login.start()
    with pytest.raises(ProtocolViolation, match="invalid message length"):
        login.feed(b"R" + struct.pack("!I", 4097))


def test_a_refused_login_raises_the_servers_error() -> None:
    login = new_login()
    login.start()
    error = build.error_response("28P01", 'password authentication failed for user "u"', "FATAL")
    with pytest.raises(PgtarnError, match="password authentication failed") as info:
        login.feed(build.authentication(3) + error)
    assert info.value.sqlstate == "28P01"


def test_ready_for_query_before_authentication_ok_is_refused() -> None:
    login = new_login()
    login.start()
    with pytest.raises(ProtocolViolation, match="before AuthenticationOk"):
        login.feed(build.ready_for_query(b"I"))
