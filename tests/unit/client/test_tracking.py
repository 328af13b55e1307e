"""Session-state tracking of a pooled client: named statements counted at their Binds."""

from __future__ import annotations

from pgtarn.proto import build

from .pair import Pool, result, sent, types

PARSE_COMPLETE = build.message(b"1")
BIND_COMPLETE = build.message(b"2")
CLOSE_COMPLETE = build.message(b"3")


def test_a_named_statement_that_changes_state_counts_at_each_bind() -> None:
    pool = Pool(prepared=100)
    client, transport = pool.client()
    client.data_received(build.parse("lock", "SELECT pg_advisory_lock(1)") + build.SYNC)
    (server,) = pool.servers
    server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    assert not client.pinned  # parsed, not run
    run = build.bind("", "lock", []) + build.execute() + build.SYNC
    for _ in range(2):
        client.data_received(run)
        server.data_received(BIND_COMPLETE + result())
    assert client.pin_reasons() == ["advisory_lock"]
    assert client.session is not None and client.session.state.locks == {"1": 2}
    assert types(transport.take()) == "1Z2TDCZ2TDCZ"
    sent(server)


def test_a_closed_statement_name_forgets_its_effects() -> None:
    pool = Pool(prepared=100)
    client, _transport = pool.client()
    client.data_received(build.query("SELECT pg_advisory_lock(1)"))
    (server,) = pool.servers
    server.data_received(result())
    client.data_received(build.parse("s1", "SELECT pg_advisory_unlock(1)") + build.SYNC)
    server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    client.data_received(build.message(b"C", b"Ss1\x00") + build.SYNC)  # Close statement s1
    assert types(sent(server)) == "QPSCS"
    server.data_received(CLOSE_COMPLETE + build.ready_for_query(b"I"))
    client.data_received(
        build.parse("s1", "SELECT 1") + build.bind("", "s1", []) + build.execute() + build.SYNC
    )
    server.data_received(PARSE_COMPLETE + BIND_COMPLETE + result())
    assert client.pin_reasons() == ["advisory_lock"]  # the lock is still held


def test_named_statements_that_change_state_are_bounded_by_max_prepared_statements() -> None:
    """Past max_prepared_statements such names, one more is not followed: the client is pinned
    (untracked) instead of its bookkeeping growing."""
    pool = Pool(prepared=2)
    client, _transport = pool.client()
    for n in range(2):
        client.data_received(build.parse(f"s{n}", f"SET work_mem = '{n + 1}MB'") + build.SYNC)
        if n == 0:
            (server,) = pool.servers
        server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    assert client.framer is not None
    assert len(client.framer.named_effects) == 2 and not client.pinned
    client.data_received(build.parse("s2", "SET work_mem = '3MB'") + build.SYNC)
    server.data_received(PARSE_COMPLETE + build.ready_for_query(b"I"))
    assert len(client.framer.named_effects) == 2
    assert client.pin_reasons() == ["untracked"]


def test_a_client_that_changed_nothing_holds_no_state_yet_gets_a_clean_server() -> None:
    """A tracked client's state is made at its first change (most clients never make one:
    memory); until then it is the state every client starts with, so the server another
    client left a setting on is RESET before it runs this one's query."""
    pool = Pool()
    first, _first_side = pool.client()
    second, second_side = pool.client()
    assert first.tracked and first.session is None and second.session is None
    first.data_received(build.query("SET search_path = a"))
    (server,) = pool.servers
    assert first.session is not None
    server.data_received(build.command_complete("SET") + build.ready_for_query(b"I"))
    assert first.tracked_settings() == ["search_path"]  # applied at its ReadyForQuery
    sent(server)
    second.data_received(build.query("SELECT 1"))
    assert second.session is None  # a SELECT changes nothing: still none of its own
    assert b'RESET "search_path"' in sent(server)
    server.data_received(build.command_complete("RESET") + build.ready_for_query(b"I") + result())
    assert types(second_side.take()) == "TDCZ"  # the RESET's reply swallowed
    first.data_received(build.query("SELECT 2"))  # first's setting goes back with it
    assert b"search_path" in sent(server)


def test_a_state_made_by_a_text_is_followed_by_the_next_text_of_the_same_chunk() -> None:
    """The first text that changes state makes the client's state; a ROLLBACK right after it
    in the same chunk must be read too (transaction control is parsed only while changes
    are pending), or the model would keep a setting PostgreSQL rolled back."""
    pool = Pool()
    client, transport = pool.client()
    client.data_received(build.query("BEGIN; SET search_path = a") + build.query("ROLLBACK"))
    (server,) = pool.servers
    server.data_received(
        build.command_complete("BEGIN")
        + build.command_complete("SET")
        + build.ready_for_query(b"T")
        + build.command_complete("ROLLBACK")
        + build.ready_for_query(b"I")
    )
    assert types(transport.take()) == "CCZCZ"
    assert client.tracked_settings() == []  # rolled back, as on PostgreSQL
