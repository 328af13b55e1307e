"""Linking: the pool lends a server, differing parameters are SET, ReadyForQuery ends the loan."""

from __future__ import annotations

import time

from pgtarn.client.link import LINK, ClientLink
from pgtarn.client.transport import ClientTransport
from pgtarn.net.transport import CLOCK
from pgtarn.proto import build

from .pair import Pool, fields_of, result, sent, types


def test_a_query_goes_out_behind_a_set_of_the_clients_differing_parameters() -> None:
    pool = Pool()
    client, transport = pool.client(TimeZone="Europe/Paris")
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    assert server.client is client
    assert sent(server) == (
        build.query("SET \"TimeZone\" TO 'Europe/Paris'") + build.query("select 1")
    )
    # the SET's replies are PostgreSQL's to pgtarn, not the client's
    server.data_received(build.command_complete("SET") + build.ready_for_query(b"I"))
    assert transport.take() == b""
    server.data_received(result())
    assert transport.take() == result()


def test_the_same_parameters_are_not_set_again() -> None:
    pool = Pool()
    client, _transport = pool.client(TimeZone="UTC", DateStyle="iso")  # reported "ISO, MDY"
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    assert sent(server) == build.query("select 1")


def test_transaction_mode_keeps_the_server_through_a_transaction_then_releases_it() -> None:
    pool = Pool()
    client, transport = pool.client()
    client.data_received(build.query("begin"))
    (server,) = pool.servers
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    assert client.server is server and server in server.pool.active
    client.data_received(build.query("commit"))
    server.data_received(build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert client.server is None and server.client is None
    assert list(server.pool.idle) == [server]
    assert types(transport.take()) == "CZCZ"


def test_session_mode_keeps_the_server_after_idle_ready_for_query() -> None:
    pool = Pool(mode="session")
    client, _transport = pool.client()
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    server.data_received(result())
    assert client.server is server and server.client is client


def test_a_waiting_client_gets_the_server_its_predecessor_released() -> None:
    pool = Pool(pool_size=1)
    first, _t1 = pool.client()
    second, t2 = pool.client()
    first.data_received(build.query("select 1"))
    second.data_received(build.query("select 2"))
    (server,) = pool.servers
    assert server.client is first and second.waiting
    assert sent(server) == build.query("select 1")  # the second query waits in the client
    server.data_received(result())
    assert server.client is second and not second.waiting
    assert sent(server) == build.query("select 2")
    server.data_received(result())
    assert t2.take() == result()


#: A message PostgreSQL sends unasked (a NOTICE raised outside any query of a client's).
UNASKED = build.error_response("01000", "sent unasked", "WARNING", notice=True)


def test_the_rest_of_the_read_that_released_a_server_is_not_the_next_clients() -> None:
    """The next client is lent the server once the read that brought the ReadyForQuery is
    over: what follows it in that read came before that client's query, and is not relayed
    to it as if it were part of its reply."""
    pool = Pool(pool_size=1)
    first, t1 = pool.client()
    second, t2 = pool.client()
    first.data_received(build.query("select 1"))
    second.data_received(build.query("select 2"))
    (server,) = pool.servers
    sent(server)
    server.data_received(result() + UNASKED)
    assert t1.take() == result()
    assert server.client is second and sent(server) == build.query("select 2")
    assert t2.take() == b""  # (lent inside the read, it was given the notice)
    server.data_received(result())
    assert t2.take() == result()


def test_a_server_closed_before_its_hand_off_goes_to_no_waiting_client() -> None:
    """Handed off outside its own read (RESUME), then closed (KILL, an error on its socket)
    before the callback was over: the waiting client is not lent it, and gets the server
    opened instead."""
    pool = Pool()
    first, _t1 = pool.client()
    second, _t2 = pool.client()
    first.data_received(build.query("select 1"))
    (server,) = pool.servers
    server.data_received(result())
    sent(server)
    server.pool.pause()
    second.data_received(build.query("select 2"))
    assert second.waiting
    server.pool.resume()
    assert second.waiting and server.client is None  # (its hand-off: after the callback)
    server.close("killed")
    pool.reads_over()
    assert second.waiting and second.server is None and server.client is None
    assert sent(server) == build.TERMINATE  # nothing of second's
    server.connection_lost(None)
    assert len(pool.servers) == 2  # opened for second
    pool.log_in_servers()
    assert second.server is pool.servers[1] and not second.waiting


def test_a_client_leaving_inside_a_transaction_gets_its_server_rolled_back() -> None:
    pool = Pool()
    client, _transport = pool.client()
    client.data_received(build.query("begin"))
    (server,) = pool.servers
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    sent(server)
    client.connection_lost(None)
    assert server.client is None and server in server.pool.tested
    assert sent(server) == build.SYNC  # ends any half batch, tells the true status
    server.data_received(build.ready_for_query(b"T"))
    assert sent(server) == build.query("ROLLBACK")
    server.data_received(build.command_complete("ROLLBACK") + build.ready_for_query(b"I"))
    assert list(server.pool.idle) == [server]


def test_a_client_leaving_mid_query_closes_its_server() -> None:
    pool = Pool()
    client, _transport = pool.client()
    client.data_received(build.query("select pg_sleep(10)"))
    (server,) = pool.servers
    client.connection_lost(None)
    assert server.closed and server not in server.pool.idle


def test_a_parameter_the_server_reports_changed_is_the_clients_new_value() -> None:
    pool = Pool()
    client, transport = pool.client(TimeZone="UTC")
    client.data_received(build.query("set timezone to 'Asia/Tokyo'"))
    (server,) = pool.servers
    server.data_received(
        build.command_complete("SET")
        + build.parameter_status("TimeZone", "Asia/Tokyo")
        + build.ready_for_query(b"I")
    )
    assert client.params["TimeZone"] == "Asia/Tokyo"
    assert types(transport.take()) == "CSZ"  # the ParameterStatus reaches the client too


def test_a_parameter_the_client_set_on_one_server_is_set_on_another_at_its_next_link() -> None:
    """Servers remember the client's parameter dict they were found to hold, and clients with
    the same values share one: the client's SET on another server gives it a new dict (the
    other client keeps its values), so the first server compares again and SETs."""
    pool = Pool(pool_size=2)
    a, _a_side = pool.client(TimeZone="UTC")
    b, _b_side = pool.client(TimeZone="UTC")
    assert a.params is b.params
    a.data_received(build.query("select 1"))
    pool.log_in_servers()
    b.data_received(build.query("select 1"))
    pool.log_in_servers()
    first, second = pool.servers
    assert (first.client, second.client) == (a, b)
    first.data_received(result())
    second.data_received(result())  # both idle; the second is lent next
    a.data_received(build.query("set timezone to 'Asia/Tokyo'"))
    assert second.client is a
    second.data_received(
        build.command_complete("SET")
        + build.parameter_status("TimeZone", "Asia/Tokyo")
        + build.ready_for_query(b"I")
    )
    assert a.params["TimeZone"] == "Asia/Tokyo" and b.params["TimeZone"] == "UTC"
    b.data_received(build.query("select 1"))  # takes the second server
    assert second.client is b
    sent(first)
    a.data_received(build.query("select 1"))
    assert first.client is a
    assert sent(first) == (
        build.query("SET \"TimeZone\" TO 'Asia/Tokyo'") + build.query("select 1")
    )


def test_a_server_closed_while_idle_is_lent_to_nobody_before_its_end_is_reported() -> None:
    """Closed while idle (KILL, a FATAL read from it), it leaves the idle list at once: a
    client asking before its connection_lost gets another server, not the closed one."""
    pool = Pool()
    client, _transport = pool.client()
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    server.data_received(result())
    assert list(server.pool.idle) == [server]
    server.close("killed")  # (connection_lost comes later, from the loop)
    client.data_received(build.query("select 2"))
    assert client.server is not server and len(pool.servers) == 2


def test_the_link_alone_ends_a_transaction_mode_link_at_an_idle_ready_for_query() -> None:
    """The link is one object for every client, driven here without the connection."""
    pool = Pool()
    client, _transport = pool.client()
    server = LINK.server_now(client)
    assert server is not None and client.server is server and server.client is client
    client.expected = 1
    assert LINK.ready_for_query(client, server, b"T") is None
    assert client.expected == 0 and client.server is server  # in a transaction: kept
    client.expected = 1
    assert LINK.ready_for_query(client, server, b"I") is None
    assert client.server is None and server.client is None


def test_the_link_keeps_no_field_of_a_client() -> None:
    """Per-client memory: every client uses the one link, which holds nothing of theirs."""
    pool = Pool(pool_size=1)
    first, _t1 = pool.client()
    second, _t2 = pool.client()
    assert fields_of(ClientLink) == [] and not hasattr(LINK, "__dict__")
    assert "pending" in fields_of(ClientTransport)  # (what the check finds)
    server = LINK.server_now(first)
    assert server is not None and LINK.server_now(second) is None
    assert first.server is server and second.server is None and second.waiting


def test_a_query_is_timed_by_the_wake_ups_clock_reading_else_by_the_clock() -> None:
    """Inside a SocketWatch batch a query's start and end are the wake-up's reading of the
    clock; outside one (TLS, a timer) the clock itself, never a reading left from a batch."""
    pool = Pool()
    client, _transport = pool.client()
    start = time.monotonic()  # (a reading as a batch's: the server lent later stays fresh)
    end = start + 0.5
    try:
        CLOCK.now = start
        client.data_received(build.query("select 1"))
        assert client.query_start == client.last_request == start
        (server,) = pool.servers
        CLOCK.now = end  # the next wake-up
        server.data_received(result())
        assert client.idle_since == end and client.query_start == 0.0
        assert client.pool is not None and client.pool.stats.query.total == end - start
    finally:
        CLOCK.now = 0.0
    before = time.monotonic()
    client.data_received(build.query("select 1"))
    assert before <= client.query_start <= time.monotonic()
    pool.reads_over()
    assert client.server is server
    before = time.monotonic()
    server.data_received(result())
    assert before <= client.idle_since <= time.monotonic()
