"""The relay of a client's bytes: counted ReadyForQuery, pending bytes, statement mode."""

from __future__ import annotations

from pgtarn.proto import build
from pgtarn.states import ClientState

from .pair import Pool, result, sent, types


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
    batch = (build.parse("", "select 1") + build.bind("", "", []) + build.execute()
             + build.SYNC)
    client.data_received(batch[:7])  # a message cut in two: the link starts at once
    (server,) = pool.servers
    client.data_received(batch[7:])
    assert sent(server) == batch
    server.data_received(build.message(b"1") + build.message(b"2") + result())
    assert client.server is None


def test_bytes_wait_for_a_server_and_go_out_whole_when_it_comes() -> None:
    pool = Pool(pool_size=1)
    first, _t1 = pool.client()
    second, _t2 = pool.client()
    first.data_received(build.query("begin"))
    (server,) = pool.servers
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    sent(server)
    second.data_received(build.query("select 2")[:6])
    second.data_received(build.query("select 2")[6:])
    first.data_received(build.query("commit"))
    server.data_received(build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert sent(server) == build.query("commit") + build.query("select 2")


def test_terminate_ends_the_client_and_releases_nothing_mid_transaction() -> None:
    pool = Pool()
    client, transport = pool.client()
    client.data_received(build.query("select 1"))
    (server,) = pool.servers
    server.data_received(result())
    client.data_received(build.TERMINATE)
    assert client.state is ClientState.CLOSED and transport.closing
    assert list(server.pool.idle) == [server]  # it was released at its idle ReadyForQuery


def test_statement_mode_refuses_begin_without_a_server() -> None:
    pool = Pool(mode="statement")
    client, transport = pool.client()
    client.data_received(build.query("BEGIN"))
    assert types(transport.take()) == "EZ"
    assert not pool.servers or pool.servers[0].client is None
