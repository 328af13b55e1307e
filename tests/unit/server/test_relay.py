"""The relay of replies to the linked client: whole bytes however PostgreSQL's chunks fall."""

from __future__ import annotations

from typing import cast

import pytest

from pgtarn.proto import build
from pgtarn.proto.framing import HEAD_SIZE
from pgtarn.proto.messages import parse_data_row_head
from pgtarn.server.connection import ServerConnection
from pgtarn.server.linked import LinkedClient
from pgtarn.server.relay import RELAY, ServerRelay
from pgtarn.server.transport import ServerTransport

from ..client.pair import fields_of
from .fakes import FakeClient, FakeTransport, logged_in_server

REPLY = (
    build.row_description([("n", 23)])
    + build.data_row(["1"])
    + build.parameter_status("TimeZone", "Europe/Paris")
    + build.error_response("0A000", "a notice-like error", "ERROR")
    + build.command_complete("SELECT 1")
    + build.ready_for_query(b"E")
)


@pytest.mark.parametrize(("mode", "prepared"), [("session", 0), ("transaction", 10)])
def test_every_split_of_a_reply_reaches_the_client_unchanged(mode: str, prepared: int) -> None:
    """With prepared statements the relay holds back watched messages until whole and
    rebuilds those begun in an earlier chunk: the client still gets the same bytes."""
    for cut in range(1, len(REPLY)):
        server, _transport = logged_in_server(mode, prepared)
        assert (server.statements is not None) == bool(prepared)
        client = FakeClient()
        server.link(client, {})
        server.data_received(REPLY[:cut])
        server.data_received(REPLY[cut:])
        assert client.received == REPLY, cut
        assert client.statuses == [b"E"] and server.status == b"E"
        assert server.params["TimeZone"] == "Europe/Paris"


def test_a_bad_length_passes_on_the_whole_messages_before_it_then_closes() -> None:
    server, transport = logged_in_server()
    client = FakeClient()
    server.link(client, {})
    whole = build.data_row(["1"])
    server.data_received(whole + b"D\xff\xff\xff\xff")
    assert client.received == whole
    assert server.closed and transport.closing


def test_a_fatal_read_while_idle_is_not_taken_for_one_a_client_saw() -> None:
    """A backend terminated while its server is idle: the FATAL reached nobody, so a client
    lent the server before its end is read must not be closed as if it had read it."""
    server, _transport = logged_in_server()
    server.data_received(
        build.error_response(
            "57P01", "terminating connection due to administrator command", "FATAL"
        )
    )
    assert server.fatal == ""
    client = FakeClient()
    server.link(client, {})
    server.data_received(build.error_response("57P01", "shutting down", "FATAL"))
    assert server.fatal == "57P01 shutting down"


def bare_server(prepared: int = 0) -> tuple[ServerTransport, FakeClient]:
    """The fields of a logged-in server, no ServerConnection: what the relay works on,
    linked to a client."""
    model, _transport = logged_in_server("transaction", prepared)
    server = ServerTransport(model.runtime, model.pool, model.db)
    server.transport = FakeTransport()
    client = FakeClient()
    server.client = cast(LinkedClient[ServerTransport], client)
    return server, client


def test_the_relay_alone_passes_a_reply_on_and_reads_its_ready_for_query() -> None:
    """The relay is one object for every server, driven here on a bare ServerTransport."""
    server, client = bare_server()
    RELAY.relay(server, REPLY[:7])
    RELAY.relay(server, REPLY[7:])
    assert client.received == REPLY and client.statuses == [b"E"]
    assert server.status == b"E" and server.params["TimeZone"] == "Europe/Paris"
    assert client.errors == 1


def test_the_relay_alone_swallows_the_replies_to_pgtarns_own_queries() -> None:
    server, client = bare_server()
    cleaned: list[bool] = []
    server.swallow = 1
    server.on_clean = lambda: cleaned.append(True)
    ours = build.command_complete("SET") + build.ready_for_query(b"I")
    RELAY.relay(server, ours + build.command_complete("SELECT 0"))
    assert client.received == build.command_complete("SELECT 0") and client.statuses == []
    assert cleaned == [True] and server.swallow == 0


def test_the_relay_alone_hides_the_reply_to_pgtarns_sync_with_prepared_statements() -> None:
    """A client left: the Sync pgtarn sends ahead of its reset is answered to nobody, and
    the statements are told of its ReadyForQuery; the client's next reply goes on."""
    server, client = bare_server(prepared=10)
    statements = RELAY.prepared_statements(server)
    assert server.statements is statements
    statements.sync_sent()
    server.swallow, server.swallow_syncs = 1, 1
    RELAY.relay_prepared(server, build.ready_for_query(b"I"))
    assert client.received == b"" and server.swallow == server.swallow_syncs == 0
    assert not statements.expected
    RELAY.relay_prepared(server, REPLY)
    assert client.received == REPLY and client.statuses == [b"E"]


def test_the_relay_keeps_no_field_of_a_server() -> None:
    """Per-server memory: every server uses the one relay, which holds nothing of theirs."""
    first, first_client = bare_server()
    second, second_client = bare_server()
    assert fields_of(ServerRelay) == [] and not hasattr(RELAY, "__dict__")
    assert "swallow" in fields_of(ServerTransport)  # (what the check finds)
    RELAY.relay(first, build.ready_for_query(b"T"))
    assert first.status == b"T" and second.status == b"I"
    assert first_client.statuses == [b"T"] and second_client.statuses == []


class RowsClient(FakeClient):
    """A FakeClient that keeps the DataRow bodies reported to it (rows read)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[bytes] = []

    def result_relayed(self, msg_type: int, body: bytes) -> None:
        if msg_type == 0x44:
            self.rows.append(body)


#: A message longer than client_message_buffer (256 KiB by default).
LONG = 1024 * 1024
HEAD = 5 + HEAD_SIZE


def fed_in_chunks(server: ServerConnection, client: FakeClient, reply: bytes, size: int) -> int:
    """Feed reply in chunks of size; the most of it that pgtarn held back at any time."""
    held = 0
    for at in range(0, len(reply), size):
        server.data_received(reply[at : at + size])
        held = max(held, min(at + size, len(reply)) - len(client.received))
    return held


@pytest.mark.parametrize("size", [3, 4096, 65536, 300000])
def test_a_long_error_with_prepared_statements_goes_on_as_it_comes(size: int) -> None:
    """Where watched messages are held back until whole (prepared statements), a long
    ErrorResponse is decided from its head and passed on as it comes: never held whole."""
    server, _transport = logged_in_server("transaction", 10)
    assert server.statements is not None
    client = FakeClient()
    server.link(client, {})
    error = build.error_response("P0001", "x" * LONG)
    reply = build.message(b"2", b"") + error + build.ready_for_query(b"I")
    held = fed_in_chunks(server, client, reply, size)
    assert client.received == reply
    assert client.errors == 1 and client.statuses == [b"I"]
    assert held <= HEAD + 5, held
    assert server.long_reply is None and server.at_boundary


@pytest.mark.parametrize("lock_after", [False, True])
def test_a_long_row_while_rows_are_read_goes_on_with_its_head_reported(lock_after: bool) -> None:
    """While the client reads rows (a lock call's), a long DataRow is passed on as it comes
    and reported by its head: a column in the head can be read, one past it cannot."""
    server, _transport = logged_in_server("transaction", 10)
    client = RowsClient()
    server.link(client, {})
    server.watch_rows(True)
    values = ["x" * LONG, "t"] if lock_after else ["t", "x" * LONG]
    row = build.data_row(values)
    reply = row + build.command_complete("SELECT 1") + build.ready_for_query(b"I")
    held = fed_in_chunks(server, client, reply, 65536)
    assert client.received == reply and held <= HEAD + 5
    assert client.rows == [row[5:HEAD]]
    count, heads = parse_data_row_head(client.rows[0])
    assert count == 2 and heads == ([] if lock_after else [b"t"])


def test_a_long_error_to_pgtarns_own_query_is_dropped_as_it_comes() -> None:
    server, _transport = logged_in_server("transaction", 10)
    client = FakeClient()
    server.link(client, {})
    server.run_internal(["SELECT 1"], None)
    reply = build.error_response("P0001", "y" * LONG) + build.ready_for_query(b"I")
    fed_in_chunks(server, client, reply, 65536)
    assert client.received == b"" and server.swallow == 0
    assert server.internal_error == ("P0001", "y" * (HEAD_SIZE - len("SERROR VERROR CP0001 M")))
    server.data_received(build.ready_for_query(b"I"))
    assert client.received == build.ready_for_query(b"I")
