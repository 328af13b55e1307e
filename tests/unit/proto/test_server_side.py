"""ServerLogin against a scripted PostgreSQL: each auth method and SCRAM mechanism choice."""

from __future__ import annotations

import struct

import pytest

from pgtarn.auth.md5 import md5_response
from pgtarn.auth.scram import ScramServer, make_verifier
from pgtarn.errors import AuthFailed, PgtarnError, ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_sasl_initial_response
from pgtarn.proto.server_side import ServerLogin


def auth(code: int, payload: bytes = b"") -> bytes:
    return struct.pack("!I", code) + payload


def finish(login: ServerLogin) -> None:
    assert login.feed(ord("R"), auth(0)) == b""
    login.feed(ord("S"), b"server_version\x0015.0\x00")
    login.feed(ord("K"), struct.pack("!II", 1234, 5678))
    login.feed(ord("Z"), b"I")
    assert login.done
    assert login.params == {"server_version": "15.0"}
    assert login.backend_key == (1234, 5678)


def scram_exchange(login: ServerLogin, server: ScramServer, mechanisms: list[str]) -> None:
    payload = b"".join(m.encode() + b"\x00" for m in mechanisms) + b"\x00"
    first = split_messages(login.feed(ord("R"), auth(10, payload)))
    mechanism, client_first = parse_sasl_initial_response(first[0][1])
    assert mechanism == "SCRAM-SHA-256"
    server_first = server.handle_client_first(client_first)
    final = split_messages(login.feed(ord("R"), auth(11, server_first)))
    server_final = server.handle_client_final(final[0][1])
    assert login.feed(ord("R"), auth(12, server_final)) == b""


def test_scram_plus_offered_first_picks_plain_scram() -> None:
    login = ServerLogin("u", "secret")
    scram_exchange(login, ScramServer(make_verifier("secret")),
                   ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])
    finish(login)


def test_scram_passthrough_keys() -> None:
    verifier = make_verifier("secret")
    first = ScramServer(verifier)
    from pgtarn.auth.scram import ScramClient

    client = ScramClient("secret")
    server_first = first.handle_client_first(client.client_first())
    first.handle_client_final(client.handle_server_first(server_first))
    login = ServerLogin("u", None, (first.client_key, verifier.server_key))
    scram_exchange(login, ScramServer(verifier), ["SCRAM-SHA-256"])
    finish(login)


def test_wrong_scram_password_is_refused_by_the_server() -> None:
    login = ServerLogin("u", "wrong")
    with pytest.raises(AuthFailed):
        scram_exchange(login, ScramServer(make_verifier("secret")), ["SCRAM-SHA-256"])


def test_md5_and_cleartext() -> None:
    login = ServerLogin("u", "pw")
    reply = split_messages(login.feed(ord("R"), auth(5, b"salt")))
    assert reply == [(ord("p"), md5_response("pw", "u", b"salt") + b"\x00")]
    finish(login)
    login = ServerLogin("u", "pw")
    assert split_messages(login.feed(ord("R"), auth(3))) == [(ord("p"), b"pw\x00")]
    finish(login)


def test_no_usable_password_is_a_clear_error() -> None:
    verifier = make_verifier("secret").to_string()
    with pytest.raises(PgtarnError, match="no usable password"):
        ServerLogin("u", None).feed(ord("R"), auth(3))
    with pytest.raises(PgtarnError, match="no usable password"):
        ServerLogin("u", None).feed(ord("R"), auth(10, b"SCRAM-SHA-256\x00\x00"))
    with pytest.raises(PgtarnError):
        ServerLogin("u", verifier).feed(ord("R"), auth(5, b"salt"))


def test_server_error_during_login_keeps_its_sqlstate() -> None:
    login = ServerLogin("u", "pw")
    error = build.error_response("3D000", 'database "x" does not exist', "FATAL")
    with pytest.raises(PgtarnError) as info:
        login.feed(ord("E"), error[5:])
    assert info.value.sqlstate == "3D000"
    assert "does not exist" in info.value.message


def test_scram_final_missing_is_refused() -> None:
    login = ServerLogin("u", "secret")
    server = ScramServer(make_verifier("secret"))
    payload = b"SCRAM-SHA-256\x00\x00"
    first = split_messages(login.feed(ord("R"), auth(10, payload)))
    _, client_first = parse_sasl_initial_response(first[0][1])
    login.feed(ord("R"), auth(11, server.handle_client_first(client_first)))
    with pytest.raises(ProtocolViolation, match="skipped the SCRAM final"):
        login.feed(ord("R"), auth(0))
