"""Session-state tracking of a pooled client: named statements counted at their Binds; the
SessionTracking part alone, for a stand-in connection."""

from __future__ import annotations

from typing import Any

from pgtarn.client.tracking import ANSWERED, SessionTracking
from pgtarn.config.inifile import parse_config
from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.proto.msgtypes import PARSE, QUERY
from pgtarn.runtime import Runtime

from .pair import INI, Pool, result, sent, types

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


# --- SessionTracking alone, for a stand-in connection (interfaces.TrackedClient) -------------


class Connection:
    """What a session tracking needs of its connection, and a record of what it asked."""

    def __init__(self, pin_session_state: bool = True) -> None:
        config = parse_config(
            INI.format(mode="transaction", pool_size=1, prepared=0)
            + f"pin_session_state = {int(pin_session_state)}\n"
        )
        self.runtime = Runtime(config, {"u": ""})
        self.tracked = True
        self.pinned = False
        self.listening = False
        self.params = {"TimeZone": "UTC"}
        self.framer = None
        self.statements = None
        self.server = None
        self.pool = None
        #: The transaction status of its server, as the last ReadyForQuery said.
        self.status = b"I"
        self.closed: list[PgtarnError] = []
        self.owed: list[list[Any]] = []

    def close(
        self, error: PgtarnError | None = None, response: bytes | None = None, reason: str = ""
    ) -> None:
        assert error is not None
        self.closed.append(error)

    def _status_now(self) -> bytes:
        return self.status

    def _owe_answer(self, entry: list[Any]) -> None:
        self.owed.append(entry)


def alone(pin_session_state: bool = True) -> tuple[SessionTracking, Connection]:
    connection = Connection(pin_session_state)
    return SessionTracking(connection), connection


def query(sql: str) -> bytes:
    """A Query's body, as the relay hands it over."""
    return sql.encode() + b"\x00"


def test_alone_a_text_that_changes_nothing_makes_no_state() -> None:
    tracking, _connection = alone()
    assert tracking.text(QUERY, query("SELECT 1"), 0) is None
    assert tracking.session is None and tracking.settings() == []


def test_alone_a_setting_applies_at_its_ready_for_query() -> None:
    tracking, connection = alone()
    assert tracking.text(QUERY, query("SET search_path = a"), 0) is None
    assert tracking.session is not None and tracking.settings() == []  # not yet applied
    assert tracking.ready(b"I")
    assert tracking.settings() == ["search_path"] and not connection.pinned


def test_alone_a_setting_rolled_back_is_forgotten() -> None:
    tracking, connection = alone()
    tracking.text(QUERY, query("BEGIN; SET search_path = a"), 0)
    assert tracking.ready(b"T")
    connection.status = b"T"
    tracking.text(QUERY, query("ROLLBACK"), 0)
    assert tracking.ready(b"I")
    assert tracking.settings() == []


def test_alone_an_advisory_lock_pins_the_connection() -> None:
    tracking, connection = alone()
    tracking.text(QUERY, query("SELECT pg_advisory_lock(1)"), 0)
    assert tracking.ready(b"I")
    assert connection.pinned and tracking.pin_reasons() == ["advisory_lock"]
    tracking.text(QUERY, query("SELECT pg_advisory_unlock(1)"), 0)
    assert tracking.ready(b"I")
    assert not connection.pinned and tracking.pin_reasons() == []


def test_alone_a_listen_is_answered_by_the_connection() -> None:
    tracking, connection = alone()
    assert tracking.text(QUERY, query("LISTEN a"), 2) == ANSWERED
    ((replies_ahead, _subscriptions, replies, synced),) = connection.owed
    assert (replies_ahead, replies, synced) == (2, None, True) and connection.listening


def test_alone_pin_session_state_off_refuses_a_query_that_would_pin() -> None:
    """The refusal is a Query raising the error in the text's place; nothing is tracked."""
    tracking, connection = alone(pin_session_state=False)
    refusal = tracking.text(QUERY, query("SELECT pg_advisory_lock(1)"), 0)
    assert refusal and b"pin_session_state = 0" in refusal
    assert tracking.session is None and not connection.closed


def test_alone_pin_session_state_off_closes_at_a_pin_that_came_another_way() -> None:
    """A pin the text could not refuse (a Parse: its Execute may have run already) closes the
    connection at the ReadyForQuery that applies it."""
    tracking, connection = alone(pin_session_state=False)
    tracking.text(PARSE, b"\x00SELECT pg_advisory_lock(1)\x00\x00\x00", 0)
    assert not tracking.ready(b"I")
    (error,) = connection.closed
    assert error.sqlstate == "0A000" and error.severity == "FATAL"
