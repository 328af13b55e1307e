"""The relay of replies to the linked client: whole bytes however PostgreSQL's chunks fall."""

from __future__ import annotations

import pytest

from pgtarn.proto import build

from .fakes import FakeClient, logged_in_server

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
