"""AdminSession with a fake client transport: parsing, permissions, bounds, bad packets."""

from __future__ import annotations

import asyncio

from pgtarn.admin.console import MAX_QUEUED, MAX_STATEMENTS, AdminSession
from pgtarn.config.settings import Config
from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.runtime import Runtime


class FakeTransport(asyncio.Transport):
    """The client's transport as the session uses it: reading paused and resumed."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.closing = False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing


class FakeClient:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.out = bytearray()
        self.closed_with: PgtarnError | bool | None = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self, error: PgtarnError | None = None) -> None:
        self.closed_with = error
        self.transport.closing = True


def session(admin: bool = True) -> tuple[AdminSession, FakeClient]:
    client = FakeClient()
    runtime = Runtime(Config.default(), {})
    return AdminSession(client, runtime, admin), client


def messages(data: bytes) -> list[tuple[str, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 1 : pos + 5], "big")
        out.append((chr(data[pos]), data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out


def error_of(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


def test_show_answers_with_rows_then_show_and_ready_for_query() -> None:
    s, client = session()
    s.feed(build.query("SHOW STATE;"))
    types = [t for t, _ in messages(bytes(client.out))]
    assert types == ["T", "D", "D", "D", "C", "Z"]
    assert messages(bytes(client.out))[4][1] == b"SHOW\x00"


def test_stats_user_gets_42501_for_control_commands_and_prepared_statement_texts() -> None:
    s, client = session(admin=False)
    for command in ("PAUSE", "RELOAD", "SET default_pool_size = 3", "SHOW PREPARED_STATEMENTS"):
        client.out.clear()
        s.feed(build.query(command))
        (kind, body), (last, _) = messages(bytes(client.out))
        assert kind == "E" and last == "Z"
        assert error_of(body)["C"] == "42501", command
    for command in ("SHOW POOLS", "SHOW LISTENERS"):
        client.out.clear()
        s.feed(build.query(command))
        assert messages(bytes(client.out))[0][0] == "T", command


def test_unknown_commands_name_the_query_and_keep_the_session() -> None:
    s, client = session()
    s.feed(build.query("SHOW ME EVERYTHING") + build.query("SHOW VERSION"))
    msgs = messages(bytes(client.out))
    assert msgs[0][0] == "E"
    assert error_of(msgs[0][1])["M"] == "invalid command 'SHOW ME EVERYTHING', use SHOW HELP;"
    assert [t for t, _ in msgs[1:]] == ["Z", "T", "D", "C", "Z"]


def test_kill_client_with_a_non_ascii_digit_is_an_error_not_a_crash() -> None:
    s, client = session()
    s.feed(build.query('KILL_CLIENT "\u00b2"'))
    msgs = messages(bytes(client.out))
    assert msgs[0][0] == "E" and "invalid client" in error_of(msgs[0][1])["M"]


def test_a_malformed_parse_closes_the_session_with_a_protocol_error() -> None:
    s, client = session()
    s.feed(build.message(b"P", b"no terminator"))
    assert isinstance(client.closed_with, PgtarnError)
    assert client.closed_with.sqlstate == "08P01"


def test_extended_protocol_without_parameters() -> None:
    s, client = session()
    s.feed(
        build.message(b"P", b"\x00SHOW STATE\x00\x00\x00")
        + build.message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
        + build.message(b"D", b"P\x00")
        + build.message(b"E", b"\x00\x00\x00\x00\x00")
        + build.message(b"S")
    )
    assert [t for t, _ in messages(bytes(client.out))] == ["1", "2", "T", "D", "D", "D", "C", "Z"]
    client.out.clear()
    # parameters are refused; the error skips to the Sync
    s.feed(
        build.message(b"P", b"\x00SHOW STATE\x00\x00\x01\x00\x00\x00\x17")
        + build.message(b"E", b"\x00\x00\x00\x00\x00")
        + build.message(b"S")
    )
    assert [t for t, _ in messages(bytes(client.out))] == ["E", "Z"]


def test_named_statements_are_bounded() -> None:
    s, client = session()
    for i in range(MAX_STATEMENTS + 1):
        s.feed(build.message(b"P", b"s%d\x00SHOW STATE\x00\x00\x00" % i) + build.message(b"S"))
    assert messages(bytes(client.out))[-2][0] == "E"
    assert len(s.statements) == MAX_STATEMENTS


def test_a_client_that_does_not_read_gets_no_more_replies_and_is_not_read() -> None:
    s, client = session()
    s.writable(False)  # its transport's buffer is full
    s.feed(build.query("SHOW LISTS") * (MAX_QUEUED + 10))
    assert client.out == b""
    assert not client.transport.reading  # bounded read-ahead
    s.writable(True)
    assert [t for t, _ in messages(bytes(client.out))].count("Z") == MAX_QUEUED + 10
    assert client.transport.reading


def test_set_of_a_session_parameter_is_ignored_with_a_notice() -> None:
    s, client = session(admin=False)
    s.feed(build.query("SET client_encoding TO 'UTF8'"))
    msgs = messages(bytes(client.out))
    assert [t for t, _ in msgs] == ["N", "C", "Z"]
    assert msgs[1][1] == b"SET\x00"


def test_show_help_lists_show_listeners() -> None:
    s, client = session(admin=False)
    s.feed(build.query("SHOW HELP"))
    msgs = messages(bytes(client.out))
    assert [t for t, _ in msgs] == ["N", "C", "Z"]
    assert "LISTENERS" in error_of(msgs[0][1])["D"]
