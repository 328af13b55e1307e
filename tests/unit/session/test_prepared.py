"""Tests for pgtarn.session.prepared against a small model of PostgreSQL's extended protocol."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.session.prepared import (
    AS_PARSE_COMPLETE,
    DROP,
    ERROR_FORWARD,
    ERROR_HIDE,
    ERROR_REPLACE,
    FORWARD,
    READY_FORWARD,
    READY_RETRY,
    READY_UNHIDE,
    ClientStatements,
    ServerStatements,
    StatementCache,
)

Msg = tuple[int, bytes]


def parse(name: str, query: str) -> Msg:
    return 0x50, name.encode() + b"\x00" + query.encode() + b"\x00\x00\x00"


def bind(stmt: str, portal: str = "") -> Msg:
    return 0x42, portal.encode() + b"\x00" + stmt.encode() + b"\x00\x00\x00\x00\x00\x00\x00"


def describe(name: str) -> Msg:
    return 0x44, b"S" + name.encode() + b"\x00"


def close(name: str) -> Msg:
    return 0x43, b"S" + name.encode() + b"\x00"


EXECUTE: Msg = (0x45, b"\x00\x00\x00\x00\x00")
SYNC: Msg = (0x53, b"")


def _cstr(body: bytes, pos: int) -> tuple[bytes, int]:
    end = body.index(b"\x00", pos)
    return body[pos:end], end + 1


class FakePostgres:
    """Statements, one unnamed portal, errors that skip to Sync; a named statement cannot be
    defined again (42P05), the unnamed one can."""

    def __init__(self) -> None:
        self.statements: dict[bytes, bytes] = {}
        self.portal: bytes | None = None
        self.skipping = False
        #: Statement names whose plan went stale (their table's result type changed).
        self.stale: set[bytes] = set()

    def error(self, code: str, text: str) -> Msg:
        self.skipping = True
        return 0x45, f"C{code}\x00M{text}\x00\x00".encode()

    def handle(self, msg_type: int, body: bytes) -> list[Msg]:
        if msg_type == 0x53:
            self.skipping = False
            return [(0x5A, b"I")]
        if self.skipping:
            return []
        if msg_type == 0x50:
            name, pos = _cstr(body, 0)
            query, _ = _cstr(body, pos)
            if b"bad" in query:
                return [self.error("42601", "syntax error")]
            if name and name in self.statements:  # with the fields pgtarn's words have
                self.skipping = True
                return [
                    (
                        0x45,
                        b'SERROR\x00VERROR\x00C42P05\x00Mprepared statement "'
                        + name
                        + b'" already exists\x00\x00',
                    )
                ]
            self.statements[name] = query
            return [(0x31, b"")]
        if msg_type == 0x42:
            _portal, pos = _cstr(body, 0)
            name, _ = _cstr(body, pos)
            if name not in self.statements:
                return [self.error("26000", f"prepared statement {name.decode()} missing")]
            if name in self.stale:
                return [self.error("0A000", "cached plan must not change result type")]
            self.portal = self.statements[name]
            return [(0x32, b"")]
        if msg_type == 0x44 and body[:1] == b"P":  # the unnamed portal's row description
            if self.portal is None:
                return [self.error("34000", "portal missing")]
            return [(0x54, self.portal)]
        if msg_type == 0x44:
            name, _ = _cstr(body, 1)
            if name not in self.statements:
                return [self.error("26000", f"prepared statement {name.decode()} missing")]
            if name in self.stale:  # a Describe revalidates the plan too
                return [self.error("0A000", "cached plan must not change result type")]
            return [(0x74, b""), (0x54, self.statements[name])]
        if msg_type == 0x45:
            if self.portal is None:
                return [self.error("34000", "portal missing")]
            if self.portal.lower() == b"discard all":  # every statement goes
                self.statements.clear()
                return [(0x43, b"DISCARD ALL")]
            return [(0x44, self.portal), (0x43, b"SELECT 1")]
        if msg_type == 0x43:
            name, _ = _cstr(body, 1)
            self.statements.pop(name, None)
            return [(0x33, b"")]
        raise AssertionError(msg_type)

    def run(self, data: bytes) -> list[Msg]:
        out: list[Msg] = []
        for msg_type, body in split_messages(data):
            out += self.handle(msg_type, body)
        return out


def pooled(
    client: ClientStatements, server: ServerStatements, pg: FakePostgres, batch: list[Msg]
) -> list[Msg]:
    """Send a batch through the rewriter to a server; what the client gets back.

    Handled as the server connection does: errors held back or replaced, a batch sent again
    after a stale plan, pgtarn's own batches swallowed.
    """
    seen: list[Msg] = []
    replies = pg.run(server.rewrite(client, batch))
    hidden = server.take_hidden()
    while replies:
        msg_type, body = replies.pop(0)
        if hidden:
            if msg_type in (0x31, 0x32, 0x33):
                server.reply(msg_type)
            elif msg_type == 0x45:
                server.error(body, client.cache)
            elif msg_type == 0x5A:
                server.ready(body, None)
                hidden = server.take_hidden()
            continue
        if msg_type == 0x45:
            action = server.error(body, client.cache)
            if action == ERROR_HIDE:
                continue
            if action == ERROR_REPLACE:
                body = server.replacement
        if msg_type in (0x31, 0x32, 0x33):
            action = server.reply(msg_type)
            if action == DROP:
                continue
            if action == AS_PARSE_COMPLETE:
                msg_type = 0x31
            assert action in (FORWARD, AS_PARSE_COMPLETE, DROP)
        if msg_type == 0x5A:
            code = server.ready(body, client)
            if code == READY_RETRY:
                replies = pg.run(server.resend) + replies
                hidden = server.take_hidden()
                continue
            if code == READY_UNHIDE:
                seen.append((0x45, server.withheld))
            seen.append((msg_type, body))
            hidden = server.take_hidden()
            continue
        seen.append((msg_type, body))
    return seen


def direct(pg: FakePostgres, batch: list[Msg]) -> list[Msg]:
    return pg.run(b"".join(build.message(bytes((t,)), b) for t, b in batch))


def test_statement_prepared_once_per_server_and_shared_by_clients() -> None:
    cache = StatementCache()
    a, b = ClientStatements(cache), ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    assert pooled(a, server, pg, [parse("s1", "select 1"), SYNC]) == [(0x31, b""), (0x5A, b"I")]
    # b prepares the same text under another name: no Parse reaches the server
    sent = server.rewrite(b, [parse("other", "select 1"), SYNC])
    assert [t for t, _ in split_messages(sent)] == [0x43, 0x53]
    assert server.reply(0x33) == AS_PARSE_COMPLETE
    assert server.ready(b"I", b) == READY_FORWARD
    assert len(cache) == 1 and list(pg.statements) == [b"pgtarn_1"]
    assert pooled(b, server, pg, [bind("other"), EXECUTE, SYNC]) == [
        (0x32, b""),
        (0x44, b"select 1"),
        (0x43, b"SELECT 1"),
        (0x5A, b"I"),
    ]


def test_a_name_is_its_clients_alone_from_the_first_to_after_a_clear() -> None:
    """Clients that named nothing share one empty dict (memory): the first name, the name an
    undone Close restores and a name after clear() must each go into a dict of that client's
    own, never into the shared one (a SQL PREPARE's: test_prepared_sql.py)."""
    cache = StatementCache()
    a, b, c = ClientStatements(cache), ClientStatements(cache), ClientStatements(cache)
    stmt, _old = a.define(b"s1", b"select 1\x00\x00\x00")
    assert a.names == {b"s1": stmt} and b.names == {} and c.names == {}
    b.undefine(b"s2", None, stmt)  # a Close of s2 that did not happen: s2 is back
    assert b.names == {b"s2": stmt} and c.names == {} and a.names == {b"s1": stmt}
    a.clear()
    assert a.names == {} and b.names == {b"s2": stmt} and c.names == {}
    a.name(b"s3", stmt)
    assert a.names == {b"s3": stmt} and c.names == {}


def test_bind_on_a_server_without_the_statement_prepares_it_silently() -> None:
    cache = StatementCache()
    client = ClientStatements(cache)
    first, pg1 = ServerStatements(10), FakePostgres()
    second, pg2 = ServerStatements(10), FakePostgres()
    pooled(client, first, pg1, [parse("s", "select 2"), SYNC])
    got = pooled(client, second, pg2, [bind("s"), EXECUTE, SYNC])
    assert got == [(0x32, b""), (0x44, b"select 2"), (0x43, b"SELECT 1"), (0x5A, b"I")]
    assert second.counters.server_parses == 1 and second.idle


def test_failed_parse_leaves_no_name_behind() -> None:
    cache = StatementCache()
    client = ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    got = pooled(client, server, pg, [parse("s", "bad sql"), bind("s"), SYNC])
    assert [t for t, _ in got] == [0x45, 0x5A]
    assert b"s" not in client.names and not server.prepared and len(cache) == 0
    # the name can be used again at once
    got = pooled(client, server, pg, [parse("s", "select 3"), bind("s"), EXECUTE, SYNC])
    assert [t for t, _ in got] == [0x31, 0x32, 0x44, 0x43, 0x5A]


def test_a_name_in_use_is_refused_and_keeps_its_statement() -> None:
    """42P05 as on a direct connection, the name still meaning its statement; a syntax error
    comes first; the unnamed statement is replaced; a Parse of a name whose Parse failed in
    an earlier batch of the same write defines it."""
    cache = StatementCache()
    client = ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    own = FakePostgres()
    steps = [
        [parse("s", "select 1"), SYNC],
        [parse("s", "select 2"), bind("s"), EXECUTE, SYNC],
        [parse("s", "bad"), SYNC],
        [bind("s"), EXECUTE, SYNC],
        [parse("", "select 3"), parse("", "select 4"), bind(""), EXECUTE, SYNC],
        [parse("t", "bad"), SYNC, parse("t", "select 5"), SYNC, bind("t"), EXECUTE, SYNC],
        [parse("u", "select 6"), parse("u", "select 6"), SYNC],
        [parse("s", "select 7"), parse("u", "select 8"), SYNC],  # the first names the error
    ]
    for batch in steps:
        assert pooled(client, server, pg, batch) == direct(own, batch)
        assert server.idle
    assert {name: stmt.query for name, stmt in client.names.items()} == {
        b"s": "select 1",
        b"t": "select 5",
        b"u": "select 6",
    }
    assert server.already_prepared == [b"s", b"s", b"u", b"s", b"u"]  # for the caller to log


def test_eviction_closes_the_least_recently_used() -> None:
    cache = StatementCache()
    client = ClientStatements(cache)
    server, pg = ServerStatements(2), FakePostgres()
    for i in range(3):
        pooled(client, server, pg, [parse(f"s{i}", f"select {i}"), SYNC])
    assert list(pg.statements) == [b"pgtarn_2", b"pgtarn_3"]
    got = pooled(client, server, pg, [bind("s0"), EXECUTE, SYNC])  # re-prepared silently
    assert got == [(0x32, b""), (0x44, b"select 0"), (0x43, b"SELECT 1"), (0x5A, b"I")]
    assert len(pg.statements) == 2 and server.idle


def test_client_close_keeps_the_statement_for_others() -> None:
    cache = StatementCache()
    a, b = ClientStatements(cache), ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    pooled(a, server, pg, [parse("x", "select 4"), SYNC])
    pooled(b, server, pg, [parse("y", "select 4"), SYNC])
    assert pooled(a, server, pg, [close("x"), SYNC]) == [(0x33, b""), (0x5A, b"I")]
    assert b"x" not in a.names
    assert [t for t, _ in pooled(b, server, pg, [bind("y"), EXECUTE, SYNC])] == [
        0x32,
        0x44,
        0x43,
        0x5A,
    ]
    got = pooled(a, server, pg, [bind("x"), SYNC])  # closed for a: the server says so
    assert got[0][0] == 0x45 and b"26000" in got[0][1]


def test_unnamed_statements_pass_through_untouched() -> None:
    cache = StatementCache()
    client = ClientStatements(cache)
    server = ServerStatements(10)
    batch = [
        parse("", "select 5"),
        bind(""),
        EXECUTE,
        parse("", "select 6"),
        bind(""),
        EXECUTE,
        SYNC,
    ]
    sent = server.rewrite(client, batch)
    assert sent == b"".join(build.message(bytes((t,)), b) for t, b in batch)
    assert len(cache) == 0


def test_a_bound_discard_all_forgets_every_statement_and_name_its_parse_none() -> None:
    cache = StatementCache()
    client = ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    own = FakePostgres()  # the client's direct connection
    steps = [
        [parse("s", "select 1"), parse("d", "DISCARD ALL"), SYNC],
        [bind("s"), EXECUTE, SYNC],  # only prepared, DISCARD ALL dropped nothing
        [bind("d"), EXECUTE, SYNC],  # run: no statement left
        [bind("s"), EXECUTE, SYNC],  # an error, as on a connection of its own
        [parse("s", "select 1"), bind("s"), EXECUTE, SYNC],  # prepared again for real
    ]
    for batch in steps:
        assert pooled(client, server, pg, batch) == direct(own, batch)
        assert set(server.prepared) == pg.statements.keys() and server.idle
    assert set(client.names) == set(own.statements) == {b"s"}


NAMES = ["", "a", "b", "c"]
QUERIES = ["select 1", "select 2", "select 3", "bad"]


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[int, int, list[Msg]]]:
    """(client, server, batch) triples; each batch ends with Sync."""
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        ops: list[Msg] = []
        for _ in range(draw(st.integers(1, 5))):
            kind = draw(st.sampled_from("pbdec"))
            name = draw(st.sampled_from(NAMES))
            if kind == "p":
                ops.append(parse(name, draw(st.sampled_from(QUERIES))))
            elif kind == "b":
                ops.append(bind(name))
            elif kind == "d":
                ops.append(describe(name) if name else describe("a"))
            elif kind == "e":
                ops.append(EXECUTE)
            else:
                ops.append(close(name) if name else close("b"))
        steps.append((draw(st.integers(0, 2)), draw(st.integers(0, 2)), [*ops, SYNC]))
    return steps


@settings(max_examples=300, deadline=None, database=None, report_multiple_bugs=False)
@given(workloads(), st.integers(1, 4))
def test_pooled_clients_see_what_a_direct_connection_would(
    steps: list[tuple[int, int, list[Msg]]], capacity: int
) -> None:
    cache = StatementCache()
    clients = [ClientStatements(cache) for _ in range(3)]
    own = [FakePostgres() for _ in range(3)]  # each client's direct connection
    servers = [ServerStatements(capacity) for _ in range(3)]
    pgs = [FakePostgres() for _ in range(3)]
    for client_no, server_no, batch in steps:
        # the unnamed statement and portal do not survive a change of server in transaction
        # mode; the model compares named statements only, so each batch starts fresh there
        own[client_no].statements.pop(b"", None)
        own[client_no].portal = None
        pgs[server_no].statements.pop(b"", None)
        pgs[server_no].portal = None
        expected = direct(own[client_no], batch)
        got = pooled(clients[client_no], servers[server_no], pgs[server_no], batch)
        assert got == expected
        assert servers[server_no].idle
        # (the unnamed statement, and pgtarn's raiser that refused a name in use, aside)
        kept = pgs[server_no].statements.keys() - {b"", b"pgtarn_raise"}
        assert len(kept) <= capacity
        assert set(servers[server_no].prepared) == kept
        # the client's names mean exactly what they would on its own connection
        mine = {
            name: stmt.parse[5:].split(b"\x00")[1]
            for name, stmt in clients[client_no].names.items()
        }
        theirs = {name: query for name, query in own[client_no].statements.items() if name}
        assert mine == theirs
    # a statement is kept while some client names it
    assert len(cache) == len({id(s) for c in clients for s in c.names.values()})


def test_seeded_many_clients_many_servers() -> None:
    rng = random.Random(7)
    cache = StatementCache()
    clients = [ClientStatements(cache) for _ in range(20)]
    servers = [ServerStatements(3) for _ in range(2)]
    pgs = [FakePostgres() for _ in range(2)]
    for _ in range(2000):
        c = rng.randrange(20)
        s = rng.randrange(2)
        name = rng.choice(["p", "q", "r"])
        query = f"select {rng.randrange(5)}"
        pgs[s].statements.pop(b"", None)
        # a name in use is closed first: a Parse cannot define it again
        again = name.encode() in clients[c].names
        got = pooled(
            clients[c],
            servers[s],
            pgs[s],
            [close(name)] * again + [parse(name, query), bind(name), EXECUTE, SYNC],
        )
        assert got == [(0x33, b"")] * again + [
            (0x31, b""),
            (0x32, b""),
            (0x44, query.encode()),
            (0x43, b"SELECT 1"),
            (0x5A, b"I"),
        ]
        if rng.random() < 0.3:
            got = pooled(clients[c], servers[s], pgs[s], [close(name), SYNC])
            assert got == [(0x33, b""), (0x5A, b"I")]
    assert len(cache) <= 20 * 3
    for client in clients:  # clients leave: the shared cache empties
        client.clear()
    assert len(cache) == 0


def _stale_everywhere() -> tuple[ClientStatements, list[ServerStatements], list[FakePostgres]]:
    cache = StatementCache()
    client = ClientStatements(cache)
    servers = [ServerStatements(10) for _ in range(2)]
    pgs = [FakePostgres() for _ in range(2)]
    for server, pg in zip(servers, pgs, strict=True):
        pooled(client, server, pg, [parse("s", "select * from t"), bind("s"), EXECUTE, SYNC])
    for pg in pgs:  # ALTER TABLE t: both servers' plans are stale
        pg.stale.add(client.names[b"s"].name)
    return client, servers, pgs


DESCRIBE_PORTAL: Msg = (0x44, b"P\x00")


def test_a_stale_plan_first_in_a_batch_that_describes_it_is_prepared_afresh_and_retried() -> None:
    client, servers, pgs = _stale_everywhere()
    old = client.names[b"s"].name
    got = pooled(client, servers[0], pgs[0], [bind("s"), DESCRIBE_PORTAL, EXECUTE, SYNC])
    # no error reached the client, which reads the new row description
    assert [t for t, _ in got] == [0x32, 0x54, 0x44, 0x43, 0x5A]
    assert client.names[b"s"].name != old
    assert servers[0].counters.server_parses == 2
    assert old in servers[0].prepared  # the stale copy is closed when the LRU evicts it
    got = pooled(client, servers[1], pgs[1], [bind("s"), DESCRIBE_PORTAL, EXECUTE, SYNC])
    assert [t for t, _ in got] == [0x32, 0x54, 0x44, 0x43, 0x5A]


def test_a_stale_error_too_long_to_hold_is_never_held_back_for_a_retry() -> None:
    """Read by its head only (whole=False), the error could not be given to the client if
    the retry did not happen after all: it is passed on (the statement renewed all the
    same), and the next Bind prepares the statement afresh."""
    client, servers, pgs = _stale_everywhere()
    old = client.names[b"s"].name
    server, pg = servers[0], pgs[0]
    replies = pg.run(server.rewrite(client, [bind("s"), DESCRIBE_PORTAL, EXECUTE, SYNC]))
    (error_type, body), (ready_type, status) = replies
    assert (error_type, ready_type) == (0x45, 0x5A)
    assert server.error(body, client.cache, False) == ERROR_FORWARD
    assert server.ready(status, client) == READY_FORWARD
    assert client.names[b"s"].name != old
    got = pooled(client, server, pg, [bind("s"), DESCRIBE_PORTAL, EXECUTE, SYNC])
    assert [t for t, _ in got] == [0x32, 0x54, 0x44, 0x43, 0x5A]


def test_a_stale_plan_bound_without_a_description_passes_the_error_on_then_works() -> None:
    """The client decodes rows with the description it cached: rows of the statement
    prepared afresh must not reach it in their place; PostgreSQL's error does."""
    client, servers, pgs = _stale_everywhere()
    old = client.names[b"s"].name
    got = pooled(client, servers[0], pgs[0], [bind("s"), EXECUTE, SYNC])
    assert got[0] == (0x45, b"C0A000\x00Mcached plan must not change result type\x00\x00")
    assert [t for t, _ in got] == [0x45, 0x5A]
    assert client.names[b"s"].name != old  # never described: prepared afresh from now on
    for server, pg in zip(servers, pgs, strict=True):
        got = pooled(client, server, pg, [bind("s"), EXECUTE, SYNC])
        assert [t for t, _ in got] == [0x32, 0x44, 0x43, 0x5A]


def test_a_stale_described_statement_keeps_its_name_and_a_new_parse_is_fresh() -> None:
    """A driver that described the statement (asyncpg) gets PostgreSQL's error on every
    server that has it, as on its own backend; its next Parse of the text is fresh."""
    cache = StatementCache()
    client = ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    pooled(client, server, pg, [parse("s", "select * from t"), describe("s"), SYNC])
    stmt = client.names[b"s"]
    pg.stale.add(stmt.name)
    got = pooled(client, server, pg, [bind("s"), EXECUTE, SYNC])
    assert [t for t, _ in got] == [0x45, 0x5A]
    assert client.names[b"s"] is stmt and stmt.name in pg.statements  # not renamed
    got = pooled(client, server, pg, [parse("s2", "select * from t"), describe("s2"), SYNC])
    assert [t for t, _ in got] == [0x31, 0x74, 0x54, 0x5A]
    assert client.names[b"s2"] is not stmt and client.names[b"s2"].name not in pg.stale


def test_a_schema_change_renews_what_nobody_described_and_new_parses_are_fresh() -> None:
    cache = StatementCache()
    a, b = ClientStatements(cache), ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    pooled(a, server, pg, [parse("s", "select 1"), bind("s"), EXECUTE, SYNC])
    pooled(b, server, pg, [parse("d", "select 2"), describe("d"), SYNC])
    plain, described = a.names[b"s"], b.names[b"d"]
    old_plain, old_described = plain.name, described.name
    cache.schema_changed()
    assert plain.name != old_plain and described.name == old_described
    assert cache.generation == 1 and cache.renewals == 1
    got = pooled(a, server, pg, [bind("s"), EXECUTE, SYNC])  # prepared afresh, silently
    assert [t for t, _ in got] == [0x32, 0x44, 0x43, 0x5A]
    assert pg.statements[plain.name] == b"select 1"
    pooled(b, server, pg, [parse("e", "select 2"), SYNC])  # a new Parse: a new statement
    assert b.names[b"e"] is not described and b.names[b"e"].generation == 1
    assert len(cache) == 3


def test_a_stale_plan_after_work_in_its_batch_fails_once_then_works() -> None:
    client, servers, pgs = _stale_everywhere()
    old = client.names[b"s"].name
    batch = [parse("", "select 2"), bind(""), EXECUTE, bind("s"), EXECUTE, SYNC]
    got = pooled(client, servers[0], pgs[0], batch)
    # the first Execute ran (its rows went to the client): no retry, the error goes on
    assert [t for t, _ in got] == [0x31, 0x32, 0x44, 0x43, 0x45, 0x5A]
    assert client.names[b"s"].name != old
    for server, pg in zip(servers, pgs, strict=True):  # the next attempt works on any server
        got = pooled(client, server, pg, [bind("s"), EXECUTE, SYNC])
        assert [t for t, _ in got] == [0x32, 0x44, 0x43, 0x5A]


def test_a_stale_plan_failing_a_describe_is_passed_on_and_a_new_parse_is_fresh() -> None:
    client, servers, pgs = _stale_everywhere()
    old = client.names[b"s"].name
    got = pooled(client, servers[0], pgs[0], [describe("s"), bind("s"), EXECUTE, SYNC])
    # the Describe failed: no retry from the Bind (the client would get a BindComplete
    # where it waits for a RowDescription); the error goes on. The client asked for the
    # description, so it may cache it: the statement keeps its name (as on its own backend),
    # and the driver's recovery, a Parse of the text again, gets one prepared afresh
    assert [t for t, _ in got] == [0x45, 0x5A]
    assert client.names[b"s"].name == old
    got = pooled(
        client,
        servers[0],
        pgs[0],
        [parse("s2", "select * from t"), describe("s2"), bind("s2"), EXECUTE, SYNC],
    )
    assert [t for t, _ in got] == [0x31, 0x74, 0x54, 0x32, 0x44, 0x43, 0x5A]
    assert client.names[b"s2"].name != old


def _row_description(*columns: tuple[str, int]) -> bytes:
    out = len(columns).to_bytes(2, "big")
    for name, oid in columns:
        out += name.encode() + b"\x00" + b"\x00\x00\x40\x01" + b"\x00\x01"
        out += oid.to_bytes(4, "big") + b"\x00\x04" + b"\xff\xff\xff\xff" + b"\x00\x00"
    return out


def _described_elsewhere() -> tuple[ClientStatements, StatementCache, ServerStatements]:
    """A client prepared and described `select * from t` (a int4, b int4) on one server;
    a second server never had it."""
    cache = StatementCache()
    client = ClientStatements(cache)
    first = ServerStatements(10)
    first.rewrite(client, [parse("s", "select * from t"), describe("s"), SYNC])
    for reply in (0x31,):
        first.reply(reply)
    first.description(0x74, b"\x00\x00", cache)
    first.description(0x54, _row_description(("a", 23), ("b", 23)), cache)
    assert first.ready(b"I", client) == READY_FORWARD
    assert client.names[b"s"].told is not None
    return client, cache, ServerStatements(10)


def _check_on(
    server: ServerStatements,
    client: ClientStatements,
    cache: StatementCache,
    columns: tuple[tuple[str, int], ...],
) -> bytes:
    """The client binds its statement on server: the check batch goes first, the client's
    parts wait for it; the server describes the fresh statement with columns."""
    out = server.send(client, [(0x42, bind("s")[1]), EXECUTE, SYNC])
    assert server.checking and server.deferred is not None
    assert [t for t, _ in split_messages(out)] == [0x50, 0x44, 0x53]  # Parse, Describe, Sync
    assert server.take_hidden()
    assert server.reply(0x31) == DROP
    server.description(0x74, b"\x00\x00", cache)
    server.description(0x54, _row_description(*columns), cache)
    server.ready(b"I", None)
    assert server.resume and not server.checking
    deferred, server.deferred = server.deferred, None
    return server.send(client, deferred)


def test_a_described_statement_prepared_afresh_unchanged_runs() -> None:
    client, cache, second = _described_elsewhere()
    out = _check_on(second, client, cache, (("a", 23), ("b", 23)))
    assert [t for t, _ in split_messages(out)] == [0x42, 0x45, 0x53]  # the client's own
    assert client.names[b"s"].name in out


def test_a_described_statement_prepared_afresh_with_another_result_type_is_refused() -> None:
    client, cache, second = _described_elsewhere()
    stmt = client.names[b"s"]
    out = _check_on(second, client, cache, (("a", 23), ("b", 700)))  # b is real now
    # the client's Bind goes to pgtarn's raiser, not to the statement
    types = [t for t, _ in split_messages(out)]
    assert types == [0x43, 0x50, 0x42, 0x45, 0x53]
    assert stmt.name not in out and b"pgtarn_raise" in out
    assert second.reply(0x33) == DROP and second.reply(0x31) == DROP
    assert second.reply(0x32) == FORWARD  # the client gets its BindComplete
    error = b"SERROR\x00C0A000\x00Mcached plan must not change result type\x00\x00"
    assert second.error(error, cache) == ERROR_REPLACE
    assert b"RRevalidateCachedQuery" in second.replacement
    # the next Parse of the text is a statement of its own
    other = ClientStatements(cache)
    second.rewrite(other, [parse("s2", "select * from t")])
    assert other.names[b"s2"] is not stmt


def test_a_text_prepared_again_under_another_name_is_parsed_again() -> None:
    """asyncpg prepares a statement again under a new name when it cannot resolve a type
    the first description named: that Parse must reach a statement parsed afresh."""
    cache = StatementCache()
    client, other = ClientStatements(cache), ClientStatements(cache)
    server, pg = ServerStatements(10), FakePostgres()
    pooled(client, server, pg, [parse("s1", "select 1"), SYNC])
    pooled(other, server, pg, [parse("o", "select 1"), SYNC])
    assert other.names[b"o"] is client.names[b"s1"]  # shared, as usual
    got = pooled(client, server, pg, [parse("s2", "select 1"), SYNC])
    assert [t for t, _ in got] == [0x31, 0x5A]
    assert client.names[b"s2"] is not client.names[b"s1"]
    assert client.names[b"s2"].name in pg.statements  # really parsed on the server
    pooled(other, server, pg, [parse("o2", "select 1"), SYNC])  # the new one is shared now
    assert other.names[b"o2"] is client.names[b"s2"]
