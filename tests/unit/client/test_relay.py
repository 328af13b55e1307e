"""The relay of a client's bytes: counted ReadyForQuery, pending bytes, statement mode."""

from __future__ import annotations

from pgtarn.client.connection import ClientConnection
from pgtarn.client.relay import RELAY, ClientRelay
from pgtarn.client.transport import NO_PENDING, ClientTransport
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_fields
from pgtarn.server.connection import ServerConnection
from pgtarn.views.states import ClientState

from .pair import SERVER_WELCOME, Pool, fields_of, result, sent, types


def test_a_pipelined_pair_of_queries_keeps_the_server_until_the_second_reply() -> None:
    pool = Pool()
    client, transport = pool.client()
    client.data_received(build.query("select 1") + build.query("select 2"))
    (server,) = pool.servers
    server.data_received(result())
    assert client.server is server  # one ReadyForQuery still owed
    server.data_received(result())
    assert client.server is None and list(server.pool.idle) == [server]
    assert transport.take() == result() * 2


def test_an_extended_batch_is_one_ready_for_query_at_its_sync() -> None:
    pool = Pool()
    client, _transport = pool.client()
    batch = build.parse("", "select 1") + build.bind("", "", []) + build.execute() + build.SYNC
    client.data_received(batch[:7])  # a message cut in two: the link starts at once
    (server,) = pool.servers
    client.data_received(batch[7:])
    assert sent(server) == batch
    server.data_received(build.message(b"1") + build.message(b"2") + result())
    assert client.server is None


def one_server_in_a_transaction() -> tuple[
    Pool, ClientConnection, ClientConnection, ServerConnection
]:
    """A pool of one server, which the first of two clients holds in a transaction."""
    pool = Pool(pool_size=1)
    first, _t1 = pool.client()
    second, _t2 = pool.client()
    first.data_received(build.query("begin"))
    (server,) = pool.servers
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    return pool, first, second, server


def test_bytes_wait_for_a_server_and_go_out_whole_when_it_comes() -> None:
    _pool, first, second, server = one_server_in_a_transaction()
    sent(server)
    second.data_received(build.query("select 2")[:6])
    second.data_received(build.query("select 2")[6:])
    first.data_received(build.query("commit"))
    server.data_received(build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert sent(server) == build.query("commit") + build.query("select 2")


def test_a_client_that_waited_keeps_no_list_of_its_own_once_its_bytes_went_out() -> None:
    """Idle clients that once waited for a server would each keep an empty list."""
    _pool, first, second, server = one_server_in_a_transaction()
    second.data_received(build.query("select 2"))
    assert second.pending == [build.query("select 2")]
    first.data_received(build.query("commit"))
    server.data_received(build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert second.server is server and second.pending is NO_PENDING


def test_terminate_ends_the_client_and_releases_nothing_mid_transaction() -> None:
    pool = Pool()
    client, transport = pool.client()
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    server.data_received(result())
    client.data_received(build.TERMINATE)
    assert client.state is ClientState.CLOSED and transport.closing
    assert list(server.pool.idle) == [server]  # it was released at its idle ReadyForQuery


def test_statement_mode_ends_a_client_at_begin_without_a_server() -> None:
    """BEGIN / START TRANSACTION, as a Query or a Parse (comments before it): the client is
    closed with PgBouncer's words; no server sees it."""
    for data in (
        build.query("BEGIN"),
        build.query("/* x */ start transaction read only"),
        build.parse("", "-- y\nbegin") + build.SYNC,
    ):
        pool = Pool(mode="statement")
        client, transport = pool.client()
        client.data_received(data)
        replies = transport.take()
        assert types(replies) == "E" and transport.closing
        fields = parse_fields(next(iter(split_messages(replies)))[1])
        assert (fields["S"], fields["C"], fields["M"]) == (
            "FATAL",
            "08P01",
            "transaction blocks not allowed in statement pooling mode",
        )
        assert not pool.servers or pool.servers[0].client is None


PARSE_COMPLETE = build.message(b"1")
BIND_COMPLETE = build.message(b"2")
CLOSE_COMPLETE = build.message(b"3")


def test_a_prepared_discard_all_forgets_the_statements_when_bound_not_when_parsed() -> None:
    """psycopg prepares DISCARD ALL like any statement: its Parse drops nothing on the server,
    each Bind of it drops everything (the client's statements and pgtarn's)."""
    pool = Pool(prepared=10)
    client, _transport = pool.client()
    client.data_received(build.parse("s", "select 1") + build.SYNC)
    (server,) = pool.servers
    assert sent(server) == build.parse("pgtarn_1", "select 1") + build.SYNC
    server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    client.data_received(build.parse("d", "DISCARD ALL") + build.SYNC)
    assert sent(server) == build.parse("pgtarn_2", "DISCARD ALL") + build.SYNC
    server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    # only prepared: the server still has s, under pgtarn's name
    client.data_received(build.bind("", "s", []) + build.execute() + build.SYNC)
    assert sent(server) == build.bind("", "pgtarn_1", []) + build.execute() + build.SYNC
    server.data_received(BIND_COMPLETE + result())
    # run: PostgreSQL forgets every statement, pgtarn_1 and pgtarn_2 too
    client.data_received(build.bind("", "d", []) + build.execute() + build.SYNC)
    assert sent(server) == build.bind("", "pgtarn_2", []) + build.execute() + build.SYNC
    server.data_received(
        BIND_COMPLETE + build.command_complete("DISCARD ALL") + build.ready_for_query(b"I")
    )
    # so s is the client's name no more (PostgreSQL's error), and its text is prepared again
    client.data_received(build.bind("", "s", []) + build.execute() + build.SYNC)
    assert sent(server) == build.bind("", "s", []) + build.execute() + build.SYNC
    server.data_received(
        build.error_response("26000", 'prepared statement "s" does not exist')
        + build.ready_for_query(b"I")
    )
    client.data_received(build.parse("t", "select 1") + build.SYNC)
    assert types(sent(server)) == "PS"  # a Parse, not the no-op Close of one it has


def test_a_prepared_discard_all_bound_in_a_transaction_block_forgets_nothing() -> None:
    """There DISCARD ALL fails: every statement stays, on the server and the client."""
    pool = Pool(prepared=10)
    client, _transport = pool.client()
    client.data_received(
        build.parse("s", "select 1") + build.parse("d", "discard all") + build.SYNC
    )
    (server,) = pool.servers
    sent(server)
    server.data_received(PARSE_COMPLETE * 2 + build.ready_for_query(b"I"))
    client.data_received(build.query("begin"))
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    sent(server)
    client.data_received(build.bind("", "d", []) + build.execute() + build.SYNC)
    assert sent(server) == build.bind("", "pgtarn_2", []) + build.execute() + build.SYNC
    server.data_received(
        BIND_COMPLETE
        + build.error_response("25001", "DISCARD ALL cannot run inside a transaction block")
        + build.ready_for_query(b"E")
    )
    client.data_received(build.query("rollback"))
    server.data_received(build.command_complete("ROLLBACK") + build.ready_for_query(b"I"))
    sent(server)
    client.data_received(build.bind("", "s", []) + build.execute() + build.SYNC)
    assert sent(server) == build.bind("", "pgtarn_1", []) + build.execute() + build.SYNC


def test_a_prepared_commit_ends_the_transaction_in_the_session_model() -> None:
    """psycopg prepares COMMIT like any statement, outside a transaction: each Bind of it
    later ends one, here a failed one, whose SET is then rolled back."""
    pool = Pool(prepared=10)
    client, _transport = pool.client()
    client.data_received(build.parse("c", "commit") + build.SYNC)
    (server,) = pool.servers
    server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    client.data_received(build.query("begin"))
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    client.data_received(build.query("set work_mem = '1MB'"))
    server.data_received(build.command_complete("SET") + build.ready_for_query(b"T"))
    client.data_received(build.query("select 1/0"))
    server.data_received(
        build.error_response("22012", "division by zero") + build.ready_for_query(b"E")
    )
    client.data_received(build.bind("", "c", []) + build.execute() + build.SYNC)
    server.data_received(
        BIND_COMPLETE + build.command_complete("ROLLBACK") + build.ready_for_query(b"I")
    )
    assert client.session is not None
    assert client.session.state.settings == {}  # as before the transaction
    assert client.server is None  # and the server went back to the pool


def test_bytes_shaped_like_a_query_inside_a_longer_one_are_part_of_it() -> None:
    inner = build.query("select 2")
    text = b"select 1 -- " + inner  # (inner's NUL ends the outer text too)
    outer = b"Q" + (4 + len(text)).to_bytes(4, "big") + text
    pool = Pool()
    client, transport = pool.client()
    client.data_received(outer[: -len(inner)])
    client.data_received(inner)  # alone, it would look like a whole Query
    (server,) = pool.servers
    assert sent(server) == outer
    assert client.expected == 1
    server.data_received(result())
    assert client.server is None and transport.take() == result()


def test_statement_names_are_made_at_the_first_statement_message_not_at_login() -> None:
    """A pool that follows prepared statements gives a client its names (and framer) at its
    first Parse, not at login: most clients never name one, and idle ones then hold none."""
    pool = Pool(prepared=10)
    client, transport = pool.client()
    client.data_received(build.query("SELECT 1"))
    (server,) = pool.servers
    server.data_received(result())
    assert client.follows_statements and client.statements is None and client.framer is None
    client.data_received(build.parse("s", "SELECT 1") + build.SYNC)
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    assert client.statements is not None and list(client.statements.names) == [b"s"]
    assert types(transport.take()) == "TDCZ1Z"


def test_a_query_cut_across_chunks_is_followed_while_other_clients_go_on() -> None:
    """Clients share one scanner while at a message boundary; one whose Query is cut gets its
    own until the Query is whole, and a client sending between the two halves is scanned as
    if nobody else were there."""
    pool = Pool(pool_size=2)
    first, first_side = pool.client()
    second, second_side = pool.client()
    assert first.scanner is second.scanner  # lent: neither holds one of its own
    query, other = build.query("SELECT 1"), build.query("SELECT 2")
    first.data_received(query[:7])  # (it waits for a server until whole)
    assert first.scanner is not second.scanner
    second.data_received(other)
    first.data_received(query[7:])
    one, two = pool.servers
    assert sent(one) == other
    two.data_received(SERVER_WELCOME)  # the server launched for the first client
    assert sent(two).endswith(query)
    for server in (one, two):
        server.data_received(result())
    assert types(first_side.take()) == types(second_side.take()) == "TDCZ"
    assert first.server is None and second.server is None  # both back in the pool
    assert first.scanner is second.scanner


def test_a_parse_after_the_end_of_a_cut_sync_starts_the_framer_at_the_boundary() -> None:
    """A pool that follows prepared statements, before the client's first Parse: a chunk
    that ends a Sync begun in the chunk before and then brings a Parse. The end of the Sync
    goes on as it is (its start has gone), the framer takes over at the Parse."""
    pool = Pool(prepared=5)
    client, transport = pool.client()
    client.data_received(build.SYNC[:3])
    client.data_received(build.SYNC[3:] + build.parse("s1", "SELECT 1") + build.SYNC)
    (server,) = pool.servers
    out = sent(server)
    assert out.startswith(build.SYNC) and types(out[len(build.SYNC) :]) == "PS"
    assert b"s1" not in out  # the framer named it for the server
    server.data_received(
        build.ready_for_query(b"I") + build.message(b"1") + build.ready_for_query(b"I")
    )
    assert types(transport.take()) == "Z1Z"
    assert client.server is None and client.framer is not None
    assert client.statements is not None and list(client.statements.names) == [b"s1"]


def test_an_idle_client_after_its_transactions_holds_none_of_the_occasional_state() -> None:
    """Thousands of idle clients: the parts few clients need are made only when needed."""
    pool = Pool()
    client, transport = pool.client()
    for _ in range(2):
        client.data_received(build.query("select 1"))
        (server,) = pool.servers
        server.data_received(result())
    assert transport.take() == result() * 2 and client.server is None
    assert client.extras is None and client.listen is None and client.session is None
    assert client.statements is None and client.framer is None
    assert client.pending is NO_PENDING and client.last_server is None


def test_a_client_with_settings_prefers_the_server_it_left_them_on() -> None:
    pool = Pool(pool_size=2)
    client, _transport = pool.client()
    client.data_received(build.query("SET search_path = a"))
    (server,) = pool.servers
    server.data_received(build.command_complete("SET") + build.ready_for_query(b"I"))
    assert client.server is None and client.extras is not None
    assert client.last_server is server


def test_the_relay_alone_counts_a_query_and_sends_it_to_the_linked_server() -> None:
    """The relay is one object for every client, driven here without the connection."""
    pool = Pool()
    client, _transport = pool.client()
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    server.data_received(result())
    sent(server)
    RELAY.relay(client, build.query("select 2") + build.query("select 3"))
    assert client.expected == 2 and client.server is server
    assert sent(server) == build.query("select 2") + build.query("select 3")


def test_the_relay_keeps_no_field_of_a_client() -> None:
    """Per-client memory: every client uses the one relay, which holds nothing of theirs."""
    pool = Pool()
    first, _t1 = pool.client()
    second, _t2 = pool.client()
    assert fields_of(ClientRelay) == [] and not hasattr(RELAY, "__dict__")
    assert "pending" in fields_of(ClientTransport)  # (what the check finds)
    RELAY.relay(first, build.query("select 1"))
    assert first.expected == 1 and second.expected == 0
