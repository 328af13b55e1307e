"""Client messages longer than client_message_buffer: passed on in pieces, never held whole."""

from __future__ import annotations

import pytest

from pgtarn.client.connection import ClientConnection
from pgtarn.client.large import UNFOLLOWED
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.streaming import HEAD_SIZE
from pgtarn.server.connection import ServerConnection

from .pair import Pool, result, sent

BUFFER = "client_message_buffer = 16384\n"
CHUNK = 4096


def in_chunks(client: ClientConnection, data: bytes, size: int = CHUNK) -> None:
    for at in range(0, len(data), size):
        client.data_received(data[at : at + size])


def long_query(size: int, tail: str = "") -> bytes:
    return build.query("SELECT md5('" + "ab" * (size // 2) + "')" + tail)


def bind_message(statement: str, value: str) -> bytes:
    return build.bind("", statement, [value])


def test_a_long_query_goes_in_pieces_and_is_counted() -> None:
    pool = Pool(more=BUFFER)
    client, _transport = pool.client()
    query = long_query(100_000)
    client.data_received(query[:CHUNK])
    (server,) = pool.servers
    assert client.large is not None
    got = sent(server)
    assert len(got) < 20_000  # never the whole
    for at in range(CHUNK, len(query), CHUNK):
        client.data_received(query[at : at + CHUNK])
        piece = sent(server)
        assert len(piece) <= CHUNK + HEAD_SIZE + 5  # (the head goes with the piece after it)
        got += piece
    assert got == query and client.large is None and client.expected == 1
    server.data_received(result())
    assert client.server is None  # its ReadyForQuery ended the link


def test_the_messages_around_a_long_one_go_in_order() -> None:
    pool = Pool(more=BUFFER)
    client, _transport = pool.client()
    before, after = build.query("SELECT 1"), build.query("SELECT 2")
    data = before + long_query(50_000) + after
    in_chunks(client, data, 3000)
    (server,) = pool.servers
    assert sent(server) == data
    assert client.expected == 3


def test_the_server_stays_linked_while_a_long_message_is_under_way() -> None:
    pool = Pool(more=BUFFER)
    client, _transport = pool.client()
    client.data_received(build.query("SELECT 1"))
    (server,) = pool.servers
    bind = bind_message("", "x" * 60_000)
    client.data_received(build.parse("", "SELECT $1") + bind[:CHUNK])
    server.data_received(result())  # the earlier Query's ReadyForQuery
    assert client.server is server
    in_chunks(client, bind[CHUNK:] + build.execute() + build.SYNC)
    assert client.large is None


def test_a_client_gone_mid_message_closes_its_server() -> None:
    pool = Pool(more=BUFFER)
    client, _transport = pool.client()
    client.data_received(long_query(100_000)[: 3 * CHUNK])
    (server,) = pool.servers
    client.connection_lost(None)
    assert server.transport is None or server.transport.is_closing()
    assert server not in list(server.pool.idle)


def test_a_client_gone_mid_message_not_watched_closes_its_server() -> None:
    """A Bind in session mode is skipped by length, not watched: the same."""
    pool = Pool(mode="session", more=BUFFER)
    client, _transport = pool.client()
    client.data_received(build.parse("", "SELECT $1") + bind_message("", "y" * 50_000)[:CHUNK])
    (server,) = pool.servers
    client.connection_lost(None)
    assert server.transport is None or server.transport.is_closing()


def test_a_long_query_waits_for_a_server_holding_little() -> None:
    pool = Pool(pool_size=1, more=BUFFER)
    first, _t1 = pool.client()
    second, t2 = pool.client()
    first.data_received(build.query("begin"))
    (server,) = pool.servers
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    sent(server)
    query = long_query(1_000_000)
    at = 0
    while t2.reading and at < len(query):
        second.data_received(query[at : at + CHUNK])
        at += CHUNK
    assert not t2.reading and at < 400_000  # paused, holding about PENDING_PAUSE
    first.data_received(build.query("commit"))
    server.data_received(build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert second.server is server and t2.reading
    in_chunks(second, query[at:])
    assert sent(server) == build.query("commit") + query


@pytest.mark.parametrize("tracked", [True, False])
def test_a_set_at_the_end_of_a_long_query_pins_its_client(tracked: bool) -> None:
    more = BUFFER + ("" if tracked else "track_session_state = 0\n")
    pool = Pool(more=more)
    client, _transport = pool.client()
    in_chunks(client, long_query(100_000, "; SET search_path = s"))
    (server,) = pool.servers
    server.data_received(build.command_complete("SELECT 1") + build.command_complete("SET"))
    server.data_received(build.ready_for_query(b"I"))
    if tracked:
        assert client.pinned and client.pin_reasons() == ["untracked"]
        assert client.session is not None and UNFOLLOWED in client.session.state.untracked
        assert client.server is server
    else:
        assert not client.pinned and client.server is None


def test_a_long_query_of_data_does_not_pin() -> None:
    pool = Pool(more=BUFFER)
    client, _transport = pool.client()
    in_chunks(client, long_query(100_000))
    (server,) = pool.servers
    server.data_received(result())
    assert not client.pinned and client.server is None


def prepared_pool() -> tuple[Pool, ClientConnection, ServerConnection]:
    pool = Pool(prepared=10, more=BUFFER)
    client, _transport = pool.client()
    client.data_received(build.parse("s1", "SELECT md5($1)") + build.SYNC)
    (server,) = pool.servers
    sent(server)
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    return pool, client, server


def test_a_long_bind_of_a_named_statement_gets_the_server_name() -> None:
    _pool, client, server = prepared_pool()
    value = "v" * 70_000
    batch = bind_message("s1", value) + build.execute() + build.SYNC
    in_chunks(client, batch)
    out = sent(server)
    messages = split_messages(out)
    kinds = [chr(kind) for kind, _body in messages]
    assert kinds[-3:] == ["B", "E", "S"]
    bind = messages[-3][1]
    assert bind.startswith(b"\x00pgtarn_") and bind.endswith(value.encode() + b"\x00\x00")
    assert client.large is None


def test_a_long_named_parse_is_gathered_whole() -> None:
    _pool, client, server = prepared_pool()
    text = "SELECT '" + "p" * 60_000 + "'"
    in_chunks(client, build.parse("s2", text) + build.SYNC)
    out = sent(server)
    kinds = [chr(kind) for kind, _body in split_messages(out)]
    assert "P" in kinds and kinds[-1] == "S"
    assert text.encode() in out


def test_a_long_bind_of_another_clients_statement_is_refused_whole() -> None:
    """A Bind naming a server-side name the client did not prepare: pgtarn's raiser in its
    place, and none of its long body reaches the server."""
    _pool, client, server = prepared_pool()
    value = "w" * 70_000
    in_chunks(client, bind_message("pgtarn_99", value) + build.execute() + build.SYNC)
    out = sent(server)
    assert value.encode()[:100] not in out
    kinds = [chr(kind) for kind, _body in split_messages(out)]
    assert kinds[-3:] == ["B", "E", "S"] and b"pgtarn_raise" in out


def test_a_long_parse_that_may_change_state_pins_at_its_batchs_end() -> None:
    pool = Pool(more=BUFFER)
    client, _transport = pool.client()
    first = build.query("SELECT 1")  # its reply is owed before the Parse's batch's
    text = "SELECT set_config('a.b', '" + "q" * 60_000 + "', false)"
    batch = build.parse("", text) + build.bind("", "", []) + build.execute() + build.SYNC
    in_chunks(client, first + batch)
    (server,) = pool.servers
    assert sent(server) == first + batch
    server.data_received(result())
    assert not client.pinned  # (not at the ReadyForQuery of the Query before it)
    server.data_received(build.message(b"1") + build.message(b"2") + result())
    assert client.pinned and client.server is server


@pytest.mark.parametrize("mode", ["session", "untracked", "tracked", "prepared"])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 999, 4096, 8200, 65536])
def test_every_cut_of_a_stream_with_long_messages_arrives_whole(mode: str, size: int) -> None:
    """Long messages among short ones, cut anywhere (a header too): the server gets the
    stream as it was sent, and each ReadyForQuery is counted."""
    more = BUFFER + ("track_session_state = 0\n" if mode == "untracked" else "")
    pool = Pool(
        mode="session" if mode == "session" else "transaction",
        prepared=10 if mode == "prepared" else 0,
        more=more,
    )
    client, _transport = pool.client()
    data = (
        build.query("SELECT 1")
        + long_query(40_000)
        + build.parse("", "SELECT $1")
        + bind_message("", "z" * 30_000)
        + build.execute()
        + build.SYNC
        + build.query("SELECT 2")
    )
    in_chunks(client, data, size)
    (server,) = pool.servers
    assert sent(server) == data
    assert client.expected == 4 and client.large is None
