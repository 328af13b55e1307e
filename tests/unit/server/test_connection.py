"""ServerConnection with a fake transport: its login, what it tells its pool, closing."""

from __future__ import annotations

from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_startup

from .fakes import WELCOME, FakeClient, connecting_server, logged_in_server


def test_connect_sends_the_startup_message_of_the_database_entry() -> None:
    server, transport = connecting_server()
    sent = transport.take()
    assert parse_startup(sent[4:]).params == {
        "user": "u",
        "database": "appdb",
        "application_name": "fromini",
    }
    assert server.peer == "127.0.0.1:5432" and server.local_addr == "127.0.0.1:40000"


def test_a_login_puts_the_server_among_its_pools_idle_servers() -> None:
    server, transport = connecting_server()
    transport.take()
    server.data_received(build.authentication(3))
    assert split_messages(transport.take()) == [(ord("p"), b"pw\x00")]
    server.data_received(WELCOME)
    assert server.login is None
    assert server.params == {"server_version": "15.0", "TimeZone": "UTC"}
    assert server.backend_key == (7, 8)
    assert server in server.pool.idle and server not in server.pool.login
    assert server.pool.welcome == server.params


def test_what_follows_the_login_in_its_chunk_goes_through_the_relay() -> None:
    server, _transport = connecting_server()
    server.data_received(WELCOME + build.parameter_status("TimeZone", "Europe/Paris"))
    assert server.params["TimeZone"] == "Europe/Paris"
    assert server in server.pool.idle


def test_a_bad_length_right_behind_the_login_is_a_login_failure() -> None:
    server, transport = connecting_server()
    server.data_received(WELCOME + b"S\x00\x00\x00\x02")
    assert server.closed and transport.closing
    failure = server.pool.failure
    assert failure is not None and failure.sqlstate == "08P01"
    assert server not in server.pool.login and server not in server.pool.idle


def test_a_refused_login_says_goodbye_closes_and_tells_the_pool() -> None:
    server, transport = connecting_server()
    transport.take()
    server.data_received(
        build.error_response("28P01", 'password authentication failed for user "u"', "FATAL")
    )
    assert server.closed and transport.closing
    assert transport.take() == build.TERMINATE
    failure = server.pool.failure
    assert failure is not None and failure.sqlstate == "28P01"
    assert server not in server.pool.login


def test_giving_up_during_the_login_is_a_login_failure() -> None:
    server, transport = connecting_server()
    server.close("server_connect_timeout")
    assert transport.closing
    failure = server.pool.failure
    assert failure is not None and failure.sqlstate == "08006"
    assert failure.message == "could not log in to server: server_connect_timeout"
    server.close("again")  # closing twice reports nothing more
    assert server.pool.failures == 1


def test_a_lost_connection_during_the_login_is_a_login_failure() -> None:
    server, _transport = connecting_server()
    server.connection_lost(None)
    failure = server.pool.failure
    assert failure is not None and "closed the connection during login" in failure.message


def test_a_lost_connection_while_linked_tells_the_client() -> None:
    server, _transport = logged_in_server()
    client = FakeClient()
    server.link(client, {})
    server.connection_lost(None)
    assert client.lost and server.client is None
    assert server not in server.pool.idle


def test_link_sets_the_clients_differing_parameters_and_swallows_the_replies() -> None:
    server, transport = logged_in_server()
    client = FakeClient()
    server.link(client, {"TimeZone": "UTC", "DateStyle": "ISO"})
    assert split_messages(transport.take()) == [(ord("Q"), b"SET \"DateStyle\" TO 'ISO'\x00")]
    server.data_received(build.command_complete("SET") + build.ready_for_query(b"I"))
    assert client.received == b"" and server.swallow == 0  # pgtarn's own query: not relayed
    reply = build.command_complete("SELECT 1") + build.ready_for_query(b"T")
    server.data_received(reply)
    assert client.received == reply and client.statuses == [b"T"]


def test_a_server_compares_a_clients_parameters_again_only_when_either_side_changed() -> None:
    """A server remembers the client's parameter dict it was found to hold, so the next link
    of that client compares nothing; a client's dict with a new value (set on another server)
    is SET, and so is the client's value after this server reported a value of its own."""
    server, transport = logged_in_server()
    client = FakeClient()
    params = {"DateStyle": "ISO"}
    swallowed = build.command_complete("SET") + build.ready_for_query(b"I")
    server.link(client, params)
    server.data_received(swallowed)
    transport.take()
    server.link(client, params)
    assert transport.take() == b""
    changed = {"DateStyle": "German"}  # the client's dict after its SET on another server
    server.link(client, changed)
    assert split_messages(transport.take()) == [(ord("Q"), b"SET \"DateStyle\" TO 'German'\x00")]
    # PostgreSQL spells it its own way: the server's value is no longer the client's
    server.data_received(build.parameter_status("DateStyle", "German, DMY") + swallowed)
    server.link(client, changed)
    assert split_messages(transport.take()) == [(ord("Q"), b"SET \"DateStyle\" TO 'German'\x00")]
