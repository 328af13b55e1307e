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
    client.data_received(build.parse("s1", "SELECT 1") + build.bind("", "s1", [])
                         + build.execute() + build.SYNC)
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
