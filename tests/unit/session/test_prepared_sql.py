"""SQL-level PREPARE / EXECUTE / DEALLOCATE through the rewriter, against a small model."""

from __future__ import annotations

import re

from pgtarn.proto import build
from pgtarn.session.prepared import ClientStatements, ServerStatements, StatementCache

from .test_prepared import EXECUTE as EXECUTE_MSG
from .test_prepared import SYNC, FakePostgres, Msg, bind, parse, pooled

_PREPARE = re.compile(rb"PREPARE (\w+)(?: \([^)]*\))? AS (.*)$", re.S)
_EXECUTE = re.compile(rb"EXECUTE (\w+)")
_DEALLOCATE = re.compile(rb"DEALLOCATE (\w+)$")
_RAISE = re.compile(rb"ERRCODE = '(\w+)', MESSAGE = '(.*)'; END")


class SqlPostgres(FakePostgres):
    """FakePostgres that also runs one-statement simple queries."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[bytes] = []

    def handle(self, msg_type: int, body: bytes) -> list[Msg]:
        if msg_type != 0x51:
            return super().handle(msg_type, body)
        text = body.rstrip(b"\x00")
        self.queries.append(text)
        out = self.simple(text)
        if out and out[0][0] == 0x45:
            self.skipping = False  # a simple query's error does not skip to Sync
        return [*out, (0x5A, b"I")]

    def simple(self, text: bytes) -> list[Msg]:
        if m := _RAISE.search(text):
            return [self.error(m.group(1).decode(), m.group(2).decode())]
        if m := _PREPARE.match(text):
            if m.group(1) in self.statements:
                return [
                    self.error(
                        "42P05", f'prepared statement "{m.group(1).decode()}" already exists'
                    )
                ]
            if b"bad" in m.group(2):
                return [self.error("42P01", "relation does not exist")]
            self.statements[m.group(1)] = m.group(2)
            return [(0x43, b"PREPARE")]
        if m := _DEALLOCATE.match(text):
            if self.statements.pop(m.group(1), None) is None:
                return [
                    self.error(
                        "26000", f'prepared statement "{m.group(1).decode()}" does not exist'
                    )
                ]
            return [(0x43, b"DEALLOCATE")]
        if m := _EXECUTE.match(text):
            name = m.group(1)
            if name not in self.statements:
                return [self.error("26000", f'prepared statement "{name.decode()}" does not exist')]
            if name in self.stale:
                return [self.error("0A000", "cached plan must not change result type")]
            return [(0x44, self.statements[name]), (0x43, b"EXECUTE")]
        return [(0x43, b"SELECT 1")]


def query(text: str) -> Msg:
    return 0x51, text.encode() + b"\x00"


def kinds(got: list[Msg]) -> list[int]:
    return [t for t, _ in got]


def setup() -> tuple[ClientStatements, list[ServerStatements], list[SqlPostgres]]:
    return (
        ClientStatements(StatementCache()),
        [ServerStatements(10) for _ in range(2)],
        [SqlPostgres() for _ in range(2)],
    )


def test_execute_on_a_server_that_never_saw_the_prepare() -> None:
    client, servers, pgs = setup()
    got = pooled(client, servers[0], pgs[0], [query("PREPARE q (int) AS SELECT $1 + 1")])
    assert got == [(0x43, b"PREPARE"), (0x5A, b"I")]
    server_name = client.names[b"q"].name
    assert pgs[0].statements == {server_name: b"SELECT $1 + 1"}
    got = pooled(client, servers[1], pgs[1], [query("EXECUTE q(41)")])
    # the PREPARE ran first on that server, its replies swallowed
    assert got == [(0x44, b"SELECT $1 + 1"), (0x43, b"EXECUTE"), (0x5A, b"I")]
    assert pgs[1].queries[0].startswith(b"PREPARE " + server_name)
    assert pgs[1].queries[1] == b"EXECUTE " + server_name + b"(41)"
    assert servers[1].counters.server_parses == 1 and servers[1].counters.binds == 1


def test_a_prepare_names_the_statement_for_its_client_alone() -> None:
    """The first name of a client goes into a dict of its own, not the empty one clients
    that named nothing share."""
    client, servers, pgs = setup()
    other = ClientStatements(client.cache)
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT 1")])
    assert list(client.names) == [b"q"] and other.names == {}
    got = pooled(other, servers[0], pgs[0], [query("EXECUTE q")])
    assert kinds(got) == [0x45, 0x5A]


def test_deallocate_then_execute_names_the_client_s_statement() -> None:
    client, servers, pgs = setup()
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT 1")])
    got = pooled(client, servers[1], pgs[1], [query("DEALLOCATE q")])
    assert got == [(0x43, b"DEALLOCATE"), (0x5A, b"I")]
    assert b"q" not in client.names and not pgs[1].statements
    got = pooled(client, servers[0], pgs[0], [query("EXECUTE q")])
    assert kinds(got) == [0x45, 0x5A] and b'"q" does not exist' in got[0][1]


def test_a_failed_prepare_leaves_no_name_and_a_second_prepare_is_refused() -> None:
    client, servers, pgs = setup()
    got = pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT bad")])
    assert kinds(got) == [0x45, 0x5A] and b"q" not in client.names
    assert not servers[0].prepared
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT 1")])
    got = pooled(client, servers[1], pgs[1], [query("PREPARE q AS SELECT 2")])
    assert kinds(got) == [0x45, 0x5A] and b'"q" already exists' in got[0][1]
    assert pgs[1].statements == {}  # refused before anything was prepared


def test_a_prelude_that_fails_reports_its_own_error() -> None:
    client, servers, pgs = setup()
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT 1")])
    stmt = client.names[b"q"]  # as if its table was dropped since
    stmt.parse = build.message(b"Q", stmt.parse[5:].replace(b"SELECT 1", b"SELECT bad"))
    got = pooled(client, servers[1], pgs[1], [query("EXECUTE q")])
    assert kinds(got) == [0x45, 0x5A]
    assert b"relation does not exist" in got[0][1]  # not 'pgtarn_s1 does not exist'
    assert not servers[1].prepared


def test_a_stale_sql_statement_is_prepared_afresh_and_retried() -> None:
    client, servers, pgs = setup()
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT * FROM t")])
    old = client.names[b"q"].name
    pgs[0].stale.add(old)
    got = pooled(client, servers[0], pgs[0], [query("EXECUTE q")])
    assert kinds(got) == [0x44, 0x43, 0x5A]
    assert client.names[b"q"].name != old


def test_extended_protocol_execute_of_a_sql_statement() -> None:
    client, servers, pgs = setup()
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT 7")])
    # an unnamed statement may EXECUTE it, even on the other server
    got = pooled(client, servers[1], pgs[1], [parse("", "EXECUTE q"), SYNC])
    assert kinds(got) == [0x31, 0x5A]
    assert pgs[1].statements[b""] == b"EXECUTE " + client.names[b"q"].name
    # a named one is refused when it runs: it would depend on statements servers lack
    got = pooled(
        client, servers[1], pgs[1], [parse("named", "EXECUTE q"), bind("named"), EXECUTE_MSG, SYNC]
    )
    assert kinds(got)[:2] == [0x31, 0x32]
    assert b"DO $pgtarn$" in pgs[1].statements[client.names[b"named"].name]


def test_a_stale_execute_after_unsynced_work_is_not_retried() -> None:
    client, servers, pgs = setup()
    pooled(client, servers[0], pgs[0], [query("PREPARE q AS SELECT * FROM t")])
    pgs[0].stale.add(client.names[b"q"].name)
    # an Execute without Sync ran first (its rows went to the client): the EXECUTE's error
    # rolls that back, so sending the EXECUTE again would hide the loss
    got = pooled(
        client, servers[0], pgs[0], [parse("", "insert"), bind(""), EXECUTE_MSG, query("EXECUTE q")]
    )
    assert kinds(got) == [0x31, 0x32, 0x44, 0x43, 0x45, 0x5A]
