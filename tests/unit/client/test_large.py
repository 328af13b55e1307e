"""Client messages longer than client_message_buffer: passed on in pieces, never held whole."""

from __future__ import annotations

import pytest

from pgtarn.client.connection import ClientConnection
from pgtarn.client.large import UNFOLLOWED
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.streaming import HEAD_SIZE
from pgtarn.server.connection import ServerConnection
from pgtarn.session.effects import CEDED, HELD

from .pair import SERVER_WELCOME, ClientSide, Pool, result, sent, types

BUFFER = "client_message_buffer = 16384\n"
CHUNK = 4096


def client_got(client: ClientConnection) -> bytes:
    """What the client was sent since this was last asked."""
    transport = client.transport
    assert isinstance(transport, ClientSide)
    return transport.take()


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


def prepared_pool_with(
    more: str = "", prepared: int = 10
) -> tuple[ClientConnection, ServerConnection]:
    pool = Pool(prepared=prepared, more=BUFFER + more)
    client, transport = pool.client()
    client.data_received(build.parse("s1", "SELECT md5($1)") + build.SYNC)
    (server,) = pool.servers
    sent(server)
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    transport.take()
    return client, server


LONG_TEXT = "SELECT '" + "p" * 60_000 + "'"


def long_named_batch(name: str = "s2", text: str = LONG_TEXT) -> bytes:
    return build.parse(name, text) + build.bind("", name, []) + build.execute() + build.SYNC


def test_a_long_named_parse_goes_in_pieces_under_a_name_of_its_own() -> None:
    """Its text is not kept to prepare it on other servers: passed on under a server-side
    name of its own (its length made right for it), its client pinned to its server."""
    client, server = prepared_pool_with()
    client.data_received(long_named_batch()[:CHUNK])
    got = sent(server)
    assert len(got) < 20_000 and client.large is not None  # never the whole
    in_chunks(client, long_named_batch()[CHUNK:])
    got += sent(server)
    (parse, bind, _execute, _sync) = split_messages(got)
    assert types(got) == "PBES" and client.large is None
    name = parse[1][: parse[1].index(b"\x00")]
    assert (
        name.startswith(b"pgtarn_h")
        and parse[1] == name + b"\x00" + LONG_TEXT.encode() + b"\x00\x00\x00"
    )
    assert bind[1] == b"\x00" + name + b"\x00" + b"\x00" * 6
    server.data_received(build.message(b"1") + build.message(b"2") + result())
    assert client.pinned and client.server is server and client.pin_reasons() == ["untracked"]
    client.data_received(build.bind("", "s2", []) + build.execute() + build.SYNC)
    assert types(again := sent(server)) == "BES" and name in again  # (no Parse ahead)


def test_a_long_named_parse_pins_though_its_batch_failed() -> None:
    """The Parse ran before the error: its statement is there, and only there."""
    client, server = prepared_pool_with()
    in_chunks(client, long_named_batch())
    sent(server)
    server.data_received(
        build.message(b"1")
        + build.message(b"2")
        + build.error_response("22012", "division by zero")
        + build.ready_for_query(b"I")
    )
    assert client.pinned and client.server is server


def test_a_long_named_parse_is_never_evicted() -> None:
    """A server over max_prepared_statements closes others first; one held alone (each a
    client's name) stays over capacity: no other server could prepare it again."""
    client, server = prepared_pool_with(prepared=2)
    in_chunks(client, long_named_batch())
    sent(server)
    server.data_received(build.message(b"1") + build.message(b"2") + result())
    for name in ("s3", "s4", "s5"):
        client.data_received(build.parse(name, f"SELECT '{name}'") + build.SYNC)
        out = sent(server)
        assert b"C\x00\x00\x00\x0eSpgtarn_h" not in out and b"pgtarn_h" not in out
        server.data_received(
            build.message(b"3") + build.message(b"1") + build.ready_for_query(b"I")
        )


@pytest.mark.parametrize(
    ("more", "text"),
    [
        ("pin_session_state = 0\n", LONG_TEXT),  # (it could not be pinned)
        ("track_session_state = 0\n", LONG_TEXT),
        ("", "/* a comment */ " + LONG_TEXT),  # (a text that may name SQL-level statements)
        ("", "EXPLAIN " + LONG_TEXT),
    ],
    ids=["no pins", "untracked", "comment", "explain"],
)
def test_a_long_named_parse_that_cannot_be_pinned_is_refused_in_its_place(
    more: str, text: str
) -> None:
    """pgtarn's raiser's Parse in its place (none of the text sent), its error given as
    54000 naming client_message_buffer, the client kept."""
    client, server = prepared_pool_with(more)
    transport = client.transport
    assert isinstance(transport, ClientSide)
    in_chunks(client, long_named_batch("s2", text))
    out = sent(server)
    assert b"p" * 100 not in out and b"pgtarn_raise" in out
    assert types(out) == "PBES" and client.large is None
    server.data_received(
        build.error_response("42601", 'syntax error at or near "pgtarn"')
        + build.ready_for_query(b"I")
    )
    got = split_messages(transport.take())
    assert [chr(kind) for kind, _body in got] == ["E", "Z"]
    assert b"C54000\x00" in got[0][1] and b"client_message_buffer" in got[0][1]
    assert b'"s2"' in got[0][1]
    assert not client.pinned and client.server is None and not transport.closing
    client.data_received(build.bind("", "s1", ["x"]) + build.execute() + build.SYNC)
    assert b"pgtarn_" in sent(server)  # s1 still means its statement


@pytest.mark.parametrize("kind", [b"D", b"C"])
def test_a_long_describe_or_close_closes_its_client(kind: bytes) -> None:
    _pool, client, server = prepared_pool()
    transport = client.transport
    assert isinstance(transport, ClientSide)
    in_chunks(client, build.message(kind, b"S" + b"n" * 40_000 + b"\x00") + build.SYNC)
    got = split_messages(transport.take())
    assert got[-1][0] == ord("E") and b"C08P01\x00" in got[-1][1]
    assert b"client_message_buffer" in got[-1][1] and transport.closing
    assert b"n" * 100 not in sent(server)


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


def sql_prepared_pool(pool_size: int = 1) -> tuple[Pool, ClientConnection, ServerConnection]:
    """A client that prepared big_md5 with SQL PREPARE (transaction mode, prepared
    statements followed), its server released."""
    pool = Pool(prepared=10, pool_size=pool_size, more=BUFFER)
    client, transport = pool.client()
    client.data_received(build.query("PREPARE big_md5(text) AS SELECT md5($1)"))
    (server,) = pool.servers
    assert b"PREPARE pgtarn_" in sent(server)
    server.data_received(build.command_complete("PREPARE") + build.ready_for_query(b"I"))
    transport.take()
    assert client.server is None
    return pool, client, server


#: What the server of sql_prepared_pool's client is sent ahead of a long Query: its statement
#: prepared under the client's own name; and after it, when the Query named none past its
#: head, that copy closed (batches of pgtarn's own).
COPY = build.query('PREPARE "big_md5"(text) AS SELECT md5($1)')
COPY_CLOSED = build.message(b"C", b"Sbig_md5\x00") + build.SYNC
COPY_DONE = build.command_complete("PREPARE") + build.ready_for_query(b"I")
COPY_CLOSED_DONE = build.message(b"3") + build.ready_for_query(b"I")


def without_copies(data: bytes) -> bytes:
    """data less COPY at its start and COPY_CLOSED at its end (each checked there)."""
    assert data.startswith(COPY) and data.endswith(COPY_CLOSED)
    return data[len(COPY) : len(data) - len(COPY_CLOSED)]


def test_a_long_execute_is_renamed_in_its_head_and_streamed() -> None:
    """A Query naming a SQL-level statement in its head and 100 KB long: its name rewritten
    there, its length made right for the new name, the rest passed on as it comes (never
    held whole), and its client not pinned."""
    _pool, client, server = sql_prepared_pool()
    value = "ab" * 50_000
    query = build.query(f"EXECUTE big_md5('{value}')")
    client.data_received(query[:CHUNK])
    got = sent(server)
    assert len(got) < 20_000 and client.large is not None  # never the whole
    for at in range(CHUNK, len(query), CHUNK):
        client.data_received(query[at : at + CHUNK])
        piece = sent(server)
        # (the head goes with the piece after it; the copy's Close with the last)
        assert len(piece) <= CHUNK + HEAD_SIZE + 5 + len(COPY) + len(COPY_CLOSED)
        got += piece
    assert client.large is None and client.expected == 1
    # (the declared length holds the new name)
    ((kind, body),) = split_messages(without_copies(got))
    assert chr(kind) == "Q" and body.startswith(b"EXECUTE pgtarn_")
    assert body.endswith(f"('{value}')".encode() + b"\x00")
    server.data_received(
        COPY_DONE + build.command_complete("SELECT 1") + build.ready_for_query(b"I")
        + COPY_CLOSED_DONE
    )  # fmt: skip
    assert client_got(client) == build.command_complete("SELECT 1") + build.ready_for_query(b"I")
    assert not client.pinned and client.server is None


def test_a_long_execute_on_a_server_without_its_statement_prepares_it_first() -> None:
    pool, client, first = sql_prepared_pool(pool_size=2)
    other, _transport = pool.client()
    other.data_received(build.query("BEGIN"))  # holds the first server
    assert other.server is first
    sent(first)
    query = build.query("EXECUTE big_md5('" + "c" * 60_000 + "')")
    in_chunks(client, query)
    second = pool.servers[-1]  # (opened for it)
    second.data_received(SERVER_WELCOME)
    out = sent(second)
    out = out[int.from_bytes(out[:4], "big") :]  # (after its StartupMessage)
    assert second is not first and client.server is second
    messages = split_messages(without_copies(out))
    assert [chr(kind) for kind, _body in messages] == ["Q", "Q"]
    assert messages[0][1].startswith(b"PREPARE pgtarn_")  # (pgtarn's own, hidden)
    assert messages[1][1].startswith(b"EXECUTE pgtarn_") and len(messages[1][1]) > 60_000


def test_a_long_execute_of_another_clients_statement_is_refused_in_its_place() -> None:
    """EXECUTE of a server-side name the client did not prepare: pgtarn's refusal goes in
    its place, none of its long text reaches the server, and the connection goes on."""
    _pool, client, server = sql_prepared_pool()
    value = "d" * 70_000
    in_chunks(client, build.query(f"EXECUTE pgtarn_s99('{value}')"))
    out = sent(server)
    assert value.encode()[:100] not in out
    ((kind, body),) = split_messages(without_copies(out))
    assert chr(kind) == "Q" and body.startswith(b"DO $pgtarn$") and b"26000" in body
    assert client.large is None and client.expected == 1


def test_a_long_query_that_prepares_in_its_head_goes_as_written() -> None:
    """A PREPARE among other statements in a long text's head (refused in a short one): the
    client's statements are the server's own from then on, so it goes as written."""
    _pool, client, server = sql_prepared_pool()
    text = "PREPARE p2 AS SELECT 1; SELECT '" + "e" * 60_000 + "'"
    in_chunks(client, build.query(text))
    messages = split_messages(sent(server))
    assert messages[-1] == (ord("Q"), text.encode() + b"\x00")


def test_a_long_execute_naming_one_past_its_head_cedes_its_statements() -> None:
    """Names past the head are not rewritten, but the client's statements were prepared
    under its own names ahead of the Query: the one past the head runs as written, and the
    client's statements are its server's own from then on (pinned there)."""
    _pool, client, server = sql_prepared_pool()
    text = "EXECUTE big_md5('" + "f" * 60_000 + "'); EXECUTE big_md5('g')"
    in_chunks(client, build.query(text))
    out = sent(server)
    assert out.startswith(COPY)
    ((_kind, body),) = split_messages(out[len(COPY) :])  # (the copy kept: not closed)
    assert body.startswith(b"EXECUTE pgtarn_") and body.endswith(b"; EXECUTE big_md5('g')\x00")
    done = build.command_complete("SELECT 1") * 2 + build.ready_for_query(b"I")
    server.data_received(COPY_DONE + done)
    assert client_got(client) == done
    assert client.pinned and client.server is server
    assert client.session is not None and client.session.state.untracked == CEDED
    client.data_received(build.query("EXECUTE big_md5('h')"))
    assert sent(server) == build.query("EXECUTE big_md5('h')")


def test_a_long_query_naming_none_past_its_head_closes_the_copies() -> None:
    """A long Query of a client with statements, naming none past its head (a literal of
    data): the copies made ahead of it are closed after it, their replies swallowed, and
    the client keeps pooling with its names rewritten."""
    _pool, client, server = sql_prepared_pool()
    in_chunks(client, build.query("SELECT length('" + "execute " * 10_000 + "')"))
    ((kind, _body),) = split_messages(without_copies(sent(server)))
    assert chr(kind) == "Q"
    done = build.command_complete("SELECT 1") + build.ready_for_query(b"I")
    server.data_received(COPY_DONE + done + COPY_CLOSED_DONE)
    assert client_got(client) == done
    assert not client.pinned and client.server is None
    client.data_received(build.query("EXECUTE big_md5('h')"))
    assert b"EXECUTE pgtarn_s" in sent(server)


def script_of_executes(count: int = 60) -> str:
    return "; ".join(f"EXECUTE big_md5('{index:05}" + "h" * 1000 + "')" for index in range(count))


def test_a_long_script_of_executes_goes_as_written_after_its_statements() -> None:
    """A head that holds a whole statement and more naming statements: the client's
    statements are prepared on its server under its own names first (batches of pgtarn's
    own, their replies never seen), then the script goes in pieces as written, never held
    whole; the client is pinned there, and from then on its messages go as written."""
    _pool, client, server = sql_prepared_pool()
    client.data_received(build.parse("named", "SELECT $1::int", [23]) + build.SYNC)
    assert b"pgtarn_" in sent(server)
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    client_got(client)
    query = build.query(script_of_executes())
    client.data_received(query[:CHUNK])
    got = sent(server)
    assert len(got) < 20_000 and client.large is not None  # never the whole
    in_chunks(client, query[CHUNK:])
    messages = split_messages(got + sent(server))
    assert messages == [
        (ord("Q"), b'PREPARE "big_md5"(text) AS SELECT md5($1)\x00'),
        (ord("P"), b"named\x00SELECT $1::int\x00\x00\x01\x00\x00\x00\x17"),
        (ord("S"), b""),
        (ord("Q"), query[5:]),
    ]
    server.data_received(
        build.command_complete("PREPARE") + build.ready_for_query(b"I")
        + build.message(b"1") + build.ready_for_query(b"I")
    )  # fmt: skip
    assert client_got(client) == b""  # (pgtarn's own: swallowed)
    server.data_received(build.command_complete("SELECT 1") * 60 + build.ready_for_query(b"I"))
    assert client_got(client).endswith(build.ready_for_query(b"I"))
    assert client.pinned and client.server is server and client.pin_reasons() == ["untracked"]
    assert client.session is not None and client.session.state.untracked == CEDED
    for later in (
        build.query("EXECUTE big_md5('x')"),
        build.query("PREPARE again AS SELECT 1; EXECUTE again"),
        build.parse("named", "SELECT 2") + build.bind("", "named", []) + build.SYNC,
    ):
        client.data_received(later)
        assert sent(server) == later
        server.data_received(build.ready_for_query(b"I"))


def test_a_statement_that_cannot_be_prepared_again_gives_its_error_where_named() -> None:
    """A statement of the client's that its server cannot prepare under the client's name
    (its table dropped, say): the script's use of the name fails with that error, as its
    EXECUTE would fail on a direct connection, not with 'does not exist'."""
    _pool, client, server = sql_prepared_pool()
    in_chunks(client, build.query(script_of_executes()))
    sent(server)
    cause = build.error_response("42P01", 'relation "gone" does not exist')
    server.data_received(cause + build.ready_for_query(b"I"))
    assert client_got(client) == b""
    missing = build.error_response("26000", 'prepared statement "big_md5" does not exist')
    server.data_received(missing + build.ready_for_query(b"I"))
    assert client_got(client) == cause + build.ready_for_query(b"I")


@pytest.mark.parametrize(
    "more", ["pin_session_state = 0\n", "track_session_state = 0\n"], ids=["no pins", "untracked"]
)
def test_a_long_script_of_executes_that_cannot_be_pinned_is_read_whole(more: str) -> None:
    """Read whole, every name rewritten, as a short one is."""
    pool = Pool(prepared=10, more=BUFFER + more)
    client, _transport = pool.client()
    client.data_received(build.query("PREPARE big_md5(text) AS SELECT md5($1)"))
    (server,) = pool.servers
    sent(server)
    server.data_received(build.command_complete("PREPARE") + build.ready_for_query(b"I"))
    in_chunks(client, build.query(script_of_executes()))
    ((_kind, body),) = split_messages(sent(server))
    assert body.count(b"EXECUTE pgtarn_") == 60 and b"big_md5" not in body


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 999, 4096, 8200, 65536])
def test_every_cut_of_a_long_execute_among_others_arrives_renamed(size: int) -> None:
    """A long EXECUTE between short Queries, cut anywhere (its header and head too): the
    server gets the stream with the name rewritten and the length made right, and each
    ReadyForQuery is counted."""
    _pool, client, server = sql_prepared_pool()
    value = "n" * 40_000
    before, after = build.query("SELECT 1"), build.query("SELECT 2")
    in_chunks(client, before + build.query(f"EXECUTE big_md5('{value}')") + after, size)
    out = sent(server)
    if size < 40_000:  # (the copy ahead of a long Query, closed after it; a chunk that
        # holds the whole EXECUTE has it rewritten as a short one)
        assert out.count(COPY) == 1 and out.count(COPY_CLOSED) == 1
        out = out.replace(COPY, b"").replace(COPY_CLOSED, b"")
    got = split_messages(out)
    assert [(chr(kind), body[:16]) for kind, body in got] == [
        ("Q", b"SELECT 1\x00"),
        ("Q", b"EXECUTE pgtarn_s"),
        ("Q", b"SELECT 2\x00"),
    ]
    assert got[1][1].endswith(f"('{value}')".encode() + b"\x00")
    assert client.expected == 3 and client.large is None


def test_a_first_long_execute_starts_the_statements_and_passes_a_strange_name() -> None:
    """A client's first message, a long EXECUTE of a name it never prepared: the framer
    starts for it, and the name goes as written (PostgreSQL's 26000 names it)."""
    pool = Pool(prepared=10, more=BUFFER)
    client, _transport = pool.client()
    assert client.framer is None
    query = build.query("EXECUTE nothing_here('" + "o" * 50_000 + "')")
    in_chunks(client, query)
    (server,) = pool.servers
    assert sent(server) == query and client.framer is not None and client.expected == 1
    server.data_received(build.error_response("ERROR", "26000", "no") + result()[-6:])
    assert client.server is None and not client.pinned


@pytest.mark.parametrize("kind", ["query", "parse"])
def test_a_long_text_whose_naming_words_are_data_goes_in_pieces(kind: str) -> None:
    """EXECUTE, PREPARE, DISCARD in a literal or comment of a long text's head name
    nothing: the text is passed on as it comes, never held whole, and not pinned."""
    _pool, client, server = sql_prepared_pool()
    text = "SELECT md5('execute x; prepare y; discard all " + "q" * 60_000 + "') /* execute */"
    data = (
        build.query(text)
        if kind == "query"
        else build.parse("", text) + build.bind("", "", []) + build.execute() + build.SYNC
    )
    client.data_received(data[: 3 * CHUNK])
    assert client.large is not None and len(sent(server)) > 0  # (its head went on)
    in_chunks(client, data[3 * CHUNK :])
    server.data_received(
        (COPY_DONE if kind == "query" else build.message(b"1") + build.message(b"2"))
        + build.command_complete("SELECT 1")
        + build.ready_for_query(b"I")
        + (COPY_CLOSED_DONE if kind == "query" else b"")
    )
    assert client.large is None and not client.pinned and client.server is None


def long_prepare(name: str = "big_p", size: int = 60_000) -> str:
    return f"PREPARE {name}(int) AS SELECT md5('" + "r" * size + "'), $1"


def prepare_done(server: ServerConnection, ok: bool = True) -> None:
    """The server's replies to a long PREPARE of sql_prepared_pool's client, with those to
    the copy of its statement made ahead of it and closed after it."""
    server.data_received(
        COPY_DONE
        + (build.command_complete("PREPARE") if ok else build.error_response("42601", "syntax"))
        + build.ready_for_query(b"I")
        + COPY_CLOSED_DONE
    )


def test_a_long_prepare_goes_in_pieces_under_its_clients_name_and_pins() -> None:
    """A SQL PREPARE long for its statement's text is not kept to prepare it on other
    servers: passed on as it is, in pieces, the server's statement named as the client
    names it, and the client pinned to that server; later uses of the name reach it."""
    _pool, client, server = sql_prepared_pool()
    query = build.query(long_prepare())
    client.data_received(query[:CHUNK])
    got = sent(server)
    assert len(got) < 20_000 and client.large is not None  # never the whole
    in_chunks(client, query[CHUNK:])
    assert without_copies(got + sent(server)) == query
    assert client.large is None and client.expected == 1
    prepare_done(server)
    assert client.pinned and client.server is server and client.pin_reasons() == ["untracked"]
    assert client.session is not None and client.session.state.untracked == HELD
    client.data_received(build.query("EXECUTE big_p(1)"))
    assert sent(server) == build.query('EXECUTE "big_p"(1)')  # (no PREPARE ahead)
    server.data_received(result())
    client.data_received(build.query("EXECUTE big_md5('x')"))  # another, still pgtarn's
    assert b"EXECUTE pgtarn_s" in sent(server)
    server.data_received(result())
    client.data_received(build.query("DEALLOCATE big_p"))
    assert sent(server) == build.query('DEALLOCATE "big_p"')
    server.data_received(build.command_complete("DEALLOCATE") + build.ready_for_query(b"I"))
    client.data_received(build.query("PREPARE big_p AS SELECT 2"))  # (a new one, kept)
    assert b"PREPARE pgtarn_s" in sent(server)


def test_a_long_prepare_closed_by_a_close_message_is_closed_for_real() -> None:
    """Its server has it under the client's name, which the client may run as written: a
    Close of it closes it there, so an EXECUTE after it fails as on a direct connection."""
    _pool, client, server = sql_prepared_pool()
    in_chunks(client, build.query(long_prepare()))
    sent(server)
    prepare_done(server)
    client.data_received(build.message(b"C", b"Sbig_p\x00") + build.SYNC)
    assert sent(server) == build.message(b"C", b"Sbig_p\x00") + build.SYNC
    server.data_received(build.message(b"3") + build.ready_for_query(b"I"))
    client.data_received(build.query("EXECUTE big_p(1)"))
    assert sent(server) == build.query("EXECUTE big_p(1)")


def test_a_long_prepare_of_a_quoted_name_is_run_by_that_name() -> None:
    _pool, client, server = sql_prepared_pool()
    in_chunks(client, build.query(long_prepare('"Big ""P"""')))
    sent(server)
    prepare_done(server)
    client.data_received(build.query('EXECUTE "Big ""P"""(3)'))
    assert sent(server) == build.query('EXECUTE "Big ""P"""(3)')
    server.data_received(result())
    client.data_received(build.query("EXECUTE big_p(3)"))  # (not that name: as written)
    assert sent(server) == build.query("EXECUTE big_p(3)")


def test_a_long_prepare_that_failed_pins_and_names_nothing() -> None:
    """Its client keeps the server (what the query left there is unknown); the name means
    no statement of pgtarn's, so a later use goes as written."""
    _pool, client, server = sql_prepared_pool()
    in_chunks(client, build.query(long_prepare()))
    sent(server)
    prepare_done(server, ok=False)
    assert client.pinned and client.server is server
    client.data_received(build.query("EXECUTE big_p(1)"))
    assert sent(server) == build.query("EXECUTE big_p(1)")


def test_a_long_prepare_of_a_name_in_use_is_refused_in_its_place() -> None:
    """42P05 as PostgreSQL gives it, none of the long text sent."""
    _pool, client, server = sql_prepared_pool()
    in_chunks(client, build.query(long_prepare("big_md5")))
    ((kind, body),) = split_messages(without_copies(sent(server)))
    assert chr(kind) == "Q" and body.startswith(b"DO $pgtarn$") and b"42P05" in body
    assert client.large is None and client.expected == 1


@pytest.mark.parametrize(
    ("more", "name"),
    [
        ("pin_session_state = 0\n", "big_p"),  # (it could not be pinned)
        ("track_session_state = 0\n", "big_p"),
        ("", "pgtarn_p1"),  # (a name of pgtarn's kind, never a server's statement's)
    ],
    ids=["no pins", "untracked", "pgtarn name"],
)
def test_a_long_prepare_that_cannot_be_pinned_is_read_whole(more: str, name: str) -> None:
    """Read whole and prepared under a name of pgtarn's, as a short one is."""
    pool = Pool(prepared=10, more=BUFFER + more)
    client, _transport = pool.client()
    in_chunks(client, build.query(long_prepare(name)))
    (server,) = pool.servers
    ((kind, body),) = split_messages(sent(server))
    assert chr(kind) == "Q" and body.startswith(b"PREPARE pgtarn_s") and len(body) > 60_000
    prepare_done(server)
    assert not client.pinned


def long_execute_batch(name: str = "big_md5", size: int = 60_000) -> bytes:
    text = f"EXECUTE {name}('" + "u" * size + "')"
    return build.parse("", text) + build.bind("", "", []) + build.execute() + build.SYNC


def test_a_long_unnamed_parse_of_one_execute_is_renamed_and_streamed() -> None:
    """An unnamed Parse that is one EXECUTE, long for its arguments: the name rewritten in
    its head, its length made right, the rest passed on as it comes; not pinned."""
    _pool, client, server = sql_prepared_pool()
    batch = long_execute_batch()
    client.data_received(batch[: 3 * CHUNK])
    got = sent(server)
    assert 0 < len(got) < 20_000 and client.large is not None  # its head went, never all
    in_chunks(client, batch[3 * CHUNK :])
    got += sent(server)
    assert types(got) == "PBES" and client.large is None
    parse = split_messages(got)[0][1]
    assert parse.startswith(b"\x00EXECUTE pgtarn_s") and parse.endswith(b"u')\x00\x00\x00")
    server.data_received(build.message(b"1") + build.message(b"2") + result())
    assert not client.pinned and client.server is None


def test_a_long_unnamed_parse_of_one_execute_prepares_it_first() -> None:
    pool, client, first = sql_prepared_pool(pool_size=2)
    other, _transport = pool.client()
    other.data_received(build.query("BEGIN"))  # holds the first server
    sent(first)
    batch = long_execute_batch()
    client.data_received(batch[: 3 * CHUNK])
    second = pool.servers[-1]
    second.data_received(SERVER_WELCOME)
    out = sent(second)
    out = out[int.from_bytes(out[:4], "big") :]  # (after its StartupMessage)
    assert len(out) < 20_000 and b"\x00EXECUTE pgtarn_s" in out  # its head went, never all
    in_chunks(client, batch[3 * CHUNK :])
    out += sent(second)
    assert second is not first and types(out) == "QPBES"
    messages = split_messages(out)
    assert messages[0][1].startswith(b"PREPARE pgtarn_")  # (pgtarn's own, hidden)
    assert messages[1][1].startswith(b"\x00EXECUTE pgtarn_s")


def test_a_long_unnamed_parse_of_another_clients_statement_is_refused_in_its_place() -> None:
    """A Parse raising 26000 in its place, none of its long text sent."""
    _pool, client, server = sql_prepared_pool()
    batch = long_execute_batch("pgtarn_s99")
    client.data_received(batch[: 3 * CHUNK])
    out = sent(server)
    assert b"DO $pgtarn$" in out  # (at once, from its head)
    in_chunks(client, batch[3 * CHUNK :])
    out += sent(server)
    assert b"u" * 100 not in out and types(out) == "PBES" and client.large is None
    parse = split_messages(out)[0][1]
    assert parse.startswith(b"\x00DO $pgtarn$") and b"26000" in parse


def test_a_long_unnamed_parse_of_a_script_goes_as_written() -> None:
    """An unnamed Parse naming statements that is not one EXECUTE (here two statements,
    which PostgreSQL refuses in a Parse): the client's statements are prepared on its
    server under its own names, the Parse goes as written (PostgreSQL's own error for it),
    and the client is pinned there, its later statement messages going as written."""
    _pool, client, server = sql_prepared_pool()
    text = "EXECUTE big_md5('a'); EXECUTE big_md5('" + "w" * 60_000 + "')"
    in_chunks(client, build.parse("", text) + build.bind("", "", []) + build.SYNC)
    out = sent(server)
    assert types(out) == "QPBS" and out.count(b"big_md5") == 3  # (the copy, the text)
    copied = build.command_complete("PREPARE") + build.ready_for_query(b"I")
    refused = build.error_response("42601", "cannot insert multiple commands")
    server.data_received(copied + refused + build.ready_for_query(b"I"))
    assert client_got(client) == refused + build.ready_for_query(b"I")
    assert client.pinned and client.session is not None
    assert client.session.state.untracked == CEDED
    later = build.parse("", "EXECUTE big_md5('b')") + build.bind("", "", []) + build.SYNC
    client.data_received(later)
    assert sent(server) == later


def test_no_copies_inside_an_open_batch() -> None:
    """A long Query after an extended batch left open (no Sync yet): pgtarn's batches of
    copies cannot go inside the client's, so a script naming statements is read whole and
    rewritten as before, and a Query naming none past its head gets no copies."""
    _pool, client, server = sql_prepared_pool()
    opened = build.parse("", "SELECT 1") + build.bind("", "", []) + build.execute()
    in_chunks(client, opened + build.query(script_of_executes()))
    out = sent(server)
    assert COPY not in out and out.count(b"EXECUTE pgtarn_") == 60
    server.data_received(
        build.message(b"1") + build.message(b"2") + build.command_complete("SELECT 1") * 61
        + build.ready_for_query(b"I")
    )  # fmt: skip
    assert not client.pinned
    client_got(client)
    in_chunks(client, opened + long_query(60_000))
    assert COPY not in sent(server)
