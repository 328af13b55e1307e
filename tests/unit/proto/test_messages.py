"""Decoding startup packets and the server messages pgtarn acts on."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.errors import ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.messages import (
    _STARTUP_STRINGS,
    _STARTUP_STRINGS_MAX,
    CANCEL_REQUEST,
    SSL_REQUEST,
    nul_at,
    parse_authentication,
    parse_bind_parameters,
    parse_fields,
    parse_parameter_status,
    parse_sasl_initial_response,
    parse_startup,
    read_cstring,
)


def test_startup_params_roundtrip() -> None:
    packet = build.startup_message({"user": "alice", "database": "db", "TimeZone": "UTC"})
    parsed = parse_startup(packet[4:])
    assert (parsed.major, parsed.minor) == (3, 0)
    assert parsed.params == {"user": "alice", "database": "db", "TimeZone": "UTC"}


def test_special_requests() -> None:
    assert parse_startup(struct.pack("!I", SSL_REQUEST)).code == SSL_REQUEST
    cancel = parse_startup(struct.pack("!III", CANCEL_REQUEST, 7, 99))
    assert cancel.cancel_key == (7, 99)
    with pytest.raises(ProtocolViolation):
        parse_startup(struct.pack("!II", CANCEL_REQUEST, 7))


@given(st.binary(max_size=200))
def test_random_startup_bodies_only_raise_protocol_violation(body: bytes) -> None:
    with contextlib.suppress(ProtocolViolation):
        parse_startup(struct.pack("!I", 196608) + body)


def test_error_fields_and_parameter_status() -> None:
    err = build.error_response("28P01", "bad password", "FATAL", detail="d", hint="h")
    fields = parse_fields(err[5:])
    assert fields["C"] == "28P01" and fields["M"] == "bad password" and fields["S"] == "FATAL"
    assert fields["D"] == "d" and fields["H"] == "h"
    assert parse_parameter_status(build.parameter_status("TimeZone", "UTC")[5:]) == (
        "TimeZone",
        "UTC",
    )


def test_sasl_initial_response() -> None:
    msg = build.sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=abc")
    assert parse_sasl_initial_response(msg[5:]) == ("SCRAM-SHA-256", b"n,,n=,r=abc")
    with pytest.raises(ProtocolViolation):
        parse_sasl_initial_response(b"SCRAM-SHA-256\x00\x00\x00\x00\x09abc")


def test_quote_literal() -> None:
    assert build.quote_literal("it's") == "'it''s'"
    assert build.quote_literal("a\\b") == "E'a\\\\b'"
    assert build.quote_ident('we"ird') == '"we""ird"'


def test_parse_data_row() -> None:
    from pgtarn.proto.build import data_row
    from pgtarn.proto.messages import parse_data_row

    body = data_row(["alice", None, ""])[5:]
    assert parse_data_row(body) == [b"alice", None, b""]
    for broken in (
        b"",
        b"\x00",
        b"\x00\x01",
        b"\x00\x01\x00\x00\x00\x05ab",
        b"\x00\x01\x00\x00\x00\x01ab",
        body[:-1],
    ):
        with pytest.raises(ProtocolViolation):
            parse_data_row(broken)


def test_parse_bind_parameters() -> None:
    # portal, statement, two format codes, three values (one NULL), one result format
    body = (
        b"p\x00s\x00"
        + b"\x00\x02\x00\x00\x00\x01"
        + b"\x00\x03"
        + b"\x00\x00\x00\x02on"
        + b"\xff\xff\xff\xff"
        + b"\x00\x00\x00\x00"
        + b"\x00\x01\x00\x00"
    )
    assert parse_bind_parameters(body) == [b"on", None, b""]
    assert parse_bind_parameters(b"\x00\x00\x00\x00\x00\x00") == []
    for broken in (
        b"",
        b"p\x00",
        b"p\x00s\x00\x00",
        b"\x00\x00\x00\x05\x00\x01",
        b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09ab",
    ):
        with pytest.raises(ProtocolViolation):
            parse_bind_parameters(broken)


@settings(deadline=None, database=None)
@given(st.binary(max_size=80), st.integers(min_value=0, max_value=90))
def test_nul_at_is_find(body: bytes, pos: int) -> None:
    # short names byte by byte, then find: the same answer, near the 32 bytes and past them
    assert nul_at(body, pos) == body.find(b"\x00", pos)
    assert nul_at(b"x" * 31 + body, pos) == (b"x" * 31 + body).find(b"\x00", pos)


def test_read_cstring() -> None:
    assert read_cstring(b"p1\x00s1\x00rest", 0) == (b"p1", 3)
    assert read_cstring(b"p1\x00s1\x00rest", 3) == (b"s1", 6)
    assert read_cstring(b"a" * 100 + b"\x00", 0) == (b"a" * 100, 101)
    with pytest.raises(ProtocolViolation, match="missing string terminator"):
        read_cstring(b"p1", 0)


def test_startup_strings_are_kept_once_and_bounded() -> None:
    def body(app: str) -> bytes:
        return build.startup_message({"user": "u", "application_name": app})[4:]

    first = parse_startup(body("".join(["a", "pp"])))
    again = parse_startup(body("".join(["ap", "p"])))
    # the same text from two clients is one string object
    assert first.params["application_name"] is again.params["application_name"]
    for n in range(_STARTUP_STRINGS_MAX + 10):
        parse_startup(body(f"app{n}"))
        assert len(_STARTUP_STRINGS) <= _STARTUP_STRINGS_MAX


def test_authentication_messages_carry_their_code() -> None:
    # every code, the ones kept packed and one past them, read back as sent
    for code in (*range(14), 2**31 - 1):
        msg = build.authentication(code, b"pay")
        assert msg[:1] == b"R" and int.from_bytes(msg[1:5], "big") == len(msg) - 1
        assert parse_authentication(msg[5:]) == (code, b"pay")


def test_parse_data_row_head() -> None:
    """A whole row: every value; a row's head (its first bytes): the values before the cut,
    and the column count; a whole row with bytes after its values is refused."""
    from pgtarn.proto.build import data_row
    from pgtarn.proto.messages import parse_data_row_head

    body = data_row(["alice", None, "bob"])[5:]
    assert parse_data_row_head(body) == (3, [b"alice", None, b"bob"])
    assert parse_data_row_head(body[:-1]) == (3, [b"alice", None])
    assert parse_data_row_head(body[:10]) == (3, [])
    assert parse_data_row_head(body[:2]) == (3, [])
    for broken in (b"", b"\x00", body + b"x"):
        with pytest.raises(ProtocolViolation):
            parse_data_row_head(broken)
