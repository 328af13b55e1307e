"""Tests for pgtarn.session.effects and parsing.py: the first look, and the effects read from a
query's text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pglast import parse_sql

from pgtarn.session import effects as effects_module
from pgtarn.session.effects import (
    BEGIN,
    CHANGES_STATE,
    CLOSE,
    COMMIT,
    DISCARD_ALL,
    DISCARD_TEMP,
    DROP_TEMP,
    FROM_CURRENT,
    HOLD,
    LISTEN,
    LOAD,
    LOCAL,
    LOCK,
    LOCK_ROW,
    LOCK_UNCOUNTED,
    NAMES_STATEMENTS,
    RELEASE,
    RESET,
    RESET_ALL,
    ROLE,
    ROLLBACK,
    ROLLBACK_TO,
    SAVEPOINT,
    SEED,
    SET,
    SHAPE_OF,
    SUBSCRIBE,
    TEMP,
    TRANSACTION_CONTROL,
    UNLISTEN,
    UNLOCK_ALL,
    UNLOCK_ALL_ROW,
    UNLOCK_ROW,
    UNSUBSCRIBE,
    UNTRACKED,
    Effect,
    as_subscriptions,
    first_look,
    may_change_state,
    parse_text,
    query_text,
    shape_of,
)
from pgtarn.session.parsing import effects_of
from pgtarn.session.sqlnames import may_name_statements

FUZZ = settings(max_examples=300, deadline=None, database=None)


def query(sql: str) -> bytes:
    """A Query message's body."""
    return sql.encode() + b"\x00"


def parse_body(name: bytes, sql: str, types: bytes = b"\x00\x00") -> bytes:
    """A Parse message's body: name, text, parameter types."""
    return name + b"\x00" + sql.encode() + b"\x00" + types


def effects(sql: str) -> list[Effect]:
    return effects_of(sql).effects


# --- the first look ------------------------------------------------------------------------------

STATE_CHANGING = [
    "SET search_path TO a",
    "SET LOCAL work_mem = '64MB'",
    "set session statement_timeout = 5",
    "RESET search_path",
    "RESET ALL",
    "DISCARD ALL",
    "DISCARD TEMP",
    "LOAD 'auto_explain'",
    "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    "CLOSE c",
    "CLOSE ALL",
    "LISTEN ch",
    "UNLISTEN ch",
    "UNLISTEN *",
    "CREATE TEMP TABLE t (a int)",
    "CREATE TEMPORARY VIEW v AS SELECT 1",
    "CREATE TEMP SEQUENCE s",
    "SELECT set_config('search_path', 'a', false)",
    "SELECT pg_catalog.set_config('a.b', 'c', true)",
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_lock_shared(1, 2)",
    "SELECT pg_advisory_unlock(1)",
    "SELECT pg_advisory_unlock_all()",
    "SELECT 1 INTO TEMP t",
    "SELECT * INTO TEMPORARY TABLE t FROM x",
    "SELECT * INTO pg_temp.t FROM x",
    "INSERT INTO pg_temp.t VALUES (1)",
    "/* a comment */ SELECT 1",
    "-- a comment\nSELECT 1",
    "SELECT 1; SELECT 2",
    "SELECT 1;SET a.b = 1",
    "  \t\n(SET a.b = 1)",
]


@pytest.mark.parametrize("sql", STATE_CHANGING)
def test_first_look_lets_through_what_may_change_state(sql: str) -> None:
    assert may_change_state(query(sql))


@pytest.mark.parametrize(
    "keyword",
    ["set", "reset", "discard", "load", "declare", "close", "listen", "unlisten", "create"],
)
def test_first_look_ignores_the_case_of_the_statement_keyword(keyword: str) -> None:
    mixed = "".join(c.upper() if i % 2 else c for i, c in enumerate(keyword))
    for word in (keyword, keyword.upper(), mixed, keyword.capitalize()):
        assert may_change_state(query(f"{word} x"))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT PG_ADVISORY_LOCK(1)",
        "select Set_Config('a.b', 'c', false)",
        "SELECT 1 INTO TEMP t",
        "select 1 into temp t",
        "CREATE TABLE PG_TEMP.t (a int)",
    ],
)
def test_first_look_ignores_the_case_of_words_inside(sql: str) -> None:
    assert may_change_state(query(sql))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "SELECT 1;",
        "SELECT 1 ; \n",
        "select a, b from t where c = 42;",
        "INSERT INTO t VALUES (1, 2);",
        "UPDATE t SET a = 1 WHERE b = 2;",
        "update t set a = 1",
        "DELETE FROM t WHERE a = 1;",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "BEGIN",
        "COMMIT",
        "SAVEPOINT s",
        "",
    ],
)
def test_first_look_rejects_plain_statements(sql: str) -> None:
    assert not may_change_state(query(sql))


def test_first_look_does_not_depend_on_digits() -> None:
    assert not may_change_state(query("SELECT 123 FROM t WHERE a = 456;"))
    assert may_change_state(query("SELECT 123; SELECT 456"))
    assert may_change_state(query("SELECT pg_advisory_lock(98765)"))


def test_first_look_at_the_same_query_again_with_other_numbers() -> None:
    # the second of each pair is answered from the last key, not the cache
    assert may_change_state(query("SELECT pg_advisory_lock(1)"))
    assert may_change_state(query("SELECT pg_advisory_lock(2)"))
    assert not may_change_state(query("SELECT abs(2)"))
    assert not may_change_state(query("SELECT abs(3)"))
    assert may_change_state(parse_body(b"", "SET a = 1"), 0x50)
    assert may_change_state(parse_body(b"", "SET a = 2"), 0x50)
    # the same key as a Query is another question: its text starts with the NUL
    assert not may_change_state(parse_body(b"", "SET a = 3"))


def test_a_shape_has_zeros_for_digits_and_is_the_last_one_when_equal() -> None:
    every_byte = bytes(range(256))
    for make in (shape_of, SHAPE_OF):  # the pure build's and the compiled one (or the same)
        shape = make(every_byte, b"")
        assert shape == every_byte.translate(bytes.maketrans(b"123456789", b"0" * 9))
        assert shape[ord("0") : ord(":")] == b"0" * 10
        assert make(every_byte, shape) is shape
        assert make(b"", b"") == b""
        for size in range(70):  # every length around the 16- and 32-byte steps
            text = bytes(b"a1b2c3d4e5f6g7h8i9j0"[index % 20] for index in range(size))
            expected = text.translate(bytes.maketrans(b"123456789", b"0" * 9))
            assert make(text, b"x" * size) == expected
            assert make(text, expected) is expected
            if size:  # the same length, one byte other: a new shape
                other = expected[:-1] + b"~"
                assert make(text, other) == expected
                assert make(text, other) is not other


@settings(deadline=None, database=None)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_the_compiled_shape_is_the_pure_one(text: bytes, last: bytes) -> None:
    assert SHAPE_OF(text, last) == shape_of(text, last)
    assert SHAPE_OF(text, shape_of(text, b"")) == shape_of(text, last)


def test_first_look_at_a_parse_skips_the_statement_name() -> None:
    # the name is not SQL: a name that looks like a statement does not count
    assert not may_change_state(parse_body(b"set_config", "SELECT $1"), 0x50)
    assert not may_change_state(parse_body(b"set", "SELECT 1;"), 0x50)
    assert not may_change_state(parse_body(b"", "UPDATE t SET a = $1;"), 0x50)
    assert may_change_state(parse_body(b"s1", "SET search_path TO a"), 0x50)
    int8_parameter = b"\x00\x01\x00\x00\x00\x14"
    assert may_change_state(parse_body(b"", "select pg_advisory_lock($1)", int8_parameter), 0x50)
    # the same bytes read as a Query start with the name
    assert may_change_state(parse_body(b"set", "SELECT 1"))


def test_first_look_keeps_queries_and_parses_apart() -> None:
    body = parse_body(b"set", "SELECT 1")
    assert not may_change_state(body, 0x50)
    assert may_change_state(body)  # the same bytes as a Query: its text starts with "set"
    assert not may_change_state(bytes(bytearray(body)), 0x50)  # a copy: from the cache
    assert may_change_state(bytes(bytearray(body)))


_NAMING_WORDS = [
    "SELECT",
    "prepare",
    "EXECUTE",
    "deallocate",
    "Discard",
    "p1",
    "1",
    "42",
    ";",
    " ",
    "(",
    "/*",
    "--",
    "\n",
    "all",
    "x",
]


@settings(deadline=None, database=None)
@given(st.lists(st.sampled_from(_NAMING_WORDS), max_size=8))
def test_first_look_says_what_may_name_statements_says(words: list[str]) -> None:
    body = " ".join(words).encode() + b"\x00"
    names = may_name_statements(body)
    assert bool(first_look(body) & NAMES_STATEMENTS) == names
    assert bool(first_look(bytes(bytearray(body))) & NAMES_STATEMENTS) == names  # cached
    assert bool(first_look(body) & CHANGES_STATE) == may_change_state(body)


# A property: whatever has effects (other than transaction control, which is parsed only while
# something is pending) gets through the first look, however it is spaced, cased or commented.

_STATE_TEMPLATES = [
    "SET search_path TO a{n}",
    "SET LOCAL work_mem = {n}",
    "SET SESSION a.b TO DEFAULT",
    "SET a.b FROM CURRENT",
    "RESET a.b",
    "RESET ALL",
    "SET TIME ZONE 'UTC'",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "SET ROLE r{n}",
    "RESET ROLE",
    "SET SESSION AUTHORIZATION r",
    "SET SEED TO 0.{n}",
    "DISCARD ALL",
    "DISCARD TEMP",
    "LOAD 'auto_explain'",
    "DECLARE c{n} CURSOR WITH HOLD FOR SELECT {n}",
    "CLOSE c{n}",
    "CLOSE ALL",
    "LISTEN ch{n}",
    "UNLISTEN ch",
    "UNLISTEN *",
    "CREATE TEMP TABLE t{n} (a int)",
    "CREATE TEMPORARY TABLE t AS SELECT {n}",
    "CREATE TEMP VIEW v AS SELECT {n}",
    "CREATE TEMP SEQUENCE s{n}",
    "CREATE TABLE pg_temp.t{n} (a int)",
    "SELECT {n} INTO TEMP t",
    "SELECT * INTO TEMPORARY t FROM x",
    "SELECT set_config('a.b', '{n}', false)",
    "SELECT set_config('a.b', x, true) FROM t",
    "SELECT pg_advisory_lock({n})",
    "SELECT pg_try_advisory_lock_shared({n}, {n})",
    "SELECT pg_advisory_unlock({n})",
    "SELECT pg_advisory_unlock_all()",
    "SELECT pg_advisory_lock(id) FROM t",
    "VALUES (pg_advisory_lock({n}))",
    "EXPLAIN ANALYZE SELECT pg_advisory_lock({n})",
    "WITH x AS (SELECT set_config('a.b', 'c', false)) SELECT * FROM x",
    "PREPARE p AS SELECT pg_advisory_lock($1)",
    "DROP TABLE t{n}",
    "DROP VIEW IF EXISTS v",
]
_PLAIN_TEMPLATES = [
    "SELECT {n}",
    "INSERT INTO t VALUES ({n})",
    "UPDATE t SET a = {n}",
    "DELETE FROM t",
    "BEGIN",
    "START TRANSACTION",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "RELEASE s",
    "ROLLBACK TO s",
    "COMMIT AND CHAIN",
    "END",
    "ABORT",
    "PREPARE TRANSACTION 'x'",
]
_SPACES = [" ", "  ", "\t", "\n", "\r\n", "\f", " /* c */ "]
_TAILS = ["", ";", " ;", ";\n", " -- tail", "; -- tail", " /* tail */", ";/* tail */ "]


def _random_case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.swapcase() if flip else c for c, flip in zip(text, flips, strict=True))


@st.composite
def statement_texts(draw: st.DrawFn) -> str:
    statements = []
    for _ in range(draw(st.integers(1, 3))):
        template = draw(st.sampled_from(_STATE_TEMPLATES + _PLAIN_TEMPLATES))
        sql = template.replace("{n}", str(draw(st.integers(0, 10**6))))
        words = sql.split(" ")
        spaced = words[0] + "".join(draw(st.sampled_from(_SPACES)) + word for word in words[1:])
        statements.append(_random_case(draw, spaced))
    lead = draw(st.sampled_from(["", " ", "\n\t", "\r\n  "]))
    return lead + ";".join(statements) + draw(st.sampled_from(_TAILS))


def _changes_state(sql: str) -> bool:
    return any(effect[0] not in TRANSACTION_CONTROL for effect in effects(sql))


@FUZZ
@given(statement_texts())
def test_whatever_changes_state_gets_through_the_first_look(sql: str) -> None:
    if _changes_state(sql):
        assert may_change_state(query(sql))
        assert may_change_state(parse_body(b"s", sql), 0x50)


@pytest.mark.parametrize("template", _STATE_TEMPLATES)
def test_each_state_template_has_effects(template: str) -> None:
    # keeps the property above honest: its state templates do change state
    assert _changes_state(template.replace("{n}", "7"))


# --- the texts of messages -----------------------------------------------------------------------


def test_query_and_parse_texts() -> None:
    assert query_text(b"SET a.b = 1\x00") == "SET a.b = 1"
    assert parse_text(parse_body(b"s1", "SELECT $1", b"\x00\x01\x00\x00\x00\x17")) == (
        b"s1",
        "SELECT $1",
    )
    assert parse_text(parse_body(b"", "SET x.y = 'caf\u00e9'")) == (b"", "SET x.y = 'caf\u00e9'")


# --- effects of each statement form --------------------------------------------------------------


# A SET is replayed as it was sent (PostgreSQL took it so); SET LOCAL in its session form.
@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SET search_path TO a, b", [(SET, "search_path", "SET search_path TO a, b")]),
        ("set Work_Mem = '64MB'", [(SET, "work_mem", "set Work_Mem = '64MB'")]),
        ("SET SESSION a.b = 1", [(SET, "a.b", "SET SESSION a.b = 1")]),
        ("SET TIME ZONE 'UTC'", [(SET, "timezone", "SET TIME ZONE 'UTC'")]),
        ("SET SCHEMA 'x'", [(SET, "search_path", "SET SCHEMA 'x'")]),
        ("SET a.b = 'it''s'", [(SET, "a.b", "SET a.b = 'it''s'")]),
        ("SET LOCAL work_mem = 64", [(LOCAL, "work_mem", "SET work_mem TO 64")]),
        ("SET work_mem FROM CURRENT", [(FROM_CURRENT, "work_mem")]),
        ("SET LOCAL work_mem FROM CURRENT", []),
        ("SET search_path TO DEFAULT", [(RESET, "search_path")]),
        ("SET TIME ZONE LOCAL", [(RESET, "timezone")]),
        ("SET LOCAL search_path TO DEFAULT", []),
        ("RESET search_path", [(RESET, "search_path")]),
        ("RESET ALL", [(RESET_ALL,)]),
        (
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY",
            [
                (
                    SET,
                    "default_transaction_isolation",
                    "SET default_transaction_isolation TO 'serializable'",
                ),
                (SET, "default_transaction_read_only", "SET default_transaction_read_only TO 'on'"),
            ],
        ),
        (
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE, NOT DEFERRABLE",
            [
                (
                    SET,
                    "default_transaction_read_only",
                    "SET default_transaction_read_only TO 'off'",
                ),
                (
                    SET,
                    "default_transaction_deferrable",
                    "SET default_transaction_deferrable TO 'off'",
                ),
            ],
        ),
        # this transaction only
        ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", []),
        ("SET transaction_read_only = on", []),
        ("SET LOCAL transaction_isolation = 'serializable'", []),
        # roles
        ("SET ROLE a", [(ROLE, "role", True)]),
        ("SET ROLE NONE", [(ROLE, "role", False)]),
        ("RESET ROLE", [(ROLE, "role", False)]),
        ("SET LOCAL ROLE a", []),
        ("SET SESSION AUTHORIZATION a", [(ROLE, "session_authorization", True)]),
        ("SET SESSION AUTHORIZATION DEFAULT", [(ROLE, "session_authorization", False)]),
        ("RESET SESSION AUTHORIZATION", [(ROLE, "session_authorization", False)]),
        # the random seed
        ("SET SEED TO 0.5", [(SEED,)]),
        ("SET LOCAL seed = 0.5", []),
    ],
)
def test_set_and_reset(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert effects(sql) == expected


def test_a_set_replays_as_valid_sql_of_the_same_effect() -> None:
    for sql in (
        'SET search_path = "$user", public',
        "SET DateStyle = iso, mdy",
        "SET a.b = E'x\\ny'",
        "SET TIME ZONE -7",
        "SET statement_timeout = 1.5",
    ):
        [(kind, name, replay)] = effects(sql)
        assert kind == SET
        assert effects(replay) == [(SET, name, replay)]


@pytest.mark.parametrize(
    "sql",
    [
        "SET TIME ZONE INTERVAL '-08:00' HOUR TO MINUTE",
        "SET TIME ZONE INTERVAL '-08:00'",
        "SET LOCAL TIME ZONE INTERVAL '+02:00'",
    ],
)
def test_set_time_zone_interval_replays_as_valid_sql(sql: str) -> None:
    [(_kind, name, replay)] = effects(sql)
    assert name == "timezone"
    parse_sql(replay)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "SELECT set_config('search_path', 'a', false)",
            [(SET, "search_path", "SELECT set_config('search_path', 'a', false)")],
        ),
        (
            "SELECT set_config('Work_Mem', '64MB', true)",
            [(LOCAL, "work_mem", "SELECT set_config('work_mem', '64MB', false)")],
        ),
        (
            "select set_config('a.b', 'c', 't')",
            [(LOCAL, "a.b", "SELECT set_config('a.b', 'c', false)")],
        ),
        (
            "select set_config('a.b', 'c'::text, false::boolean)",
            [(SET, "a.b", "SELECT set_config('a.b', 'c', false)")],
        ),
        (
            "select set_config('a.b', 'it''s', false)",
            [(SET, "a.b", "SELECT set_config('a.b', 'it''s', false)")],
        ),
        (
            "select set_config('a.b', 1.5, false)",
            [(SET, "a.b", "SELECT set_config('a.b', '1.5', false)")],
        ),
        (
            "SELECT set_config('a.b', x, false) FROM t",
            [(UNTRACKED, "set_config with arguments that are not literals")],
        ),
        (
            "SELECT set_config($1, $2, false)",
            [(UNTRACKED, "set_config with arguments that are not literals")],
        ),
        (
            "SELECT set_config('a.b', NULL, false)",
            [(UNTRACKED, "set_config with arguments that are not literals")],
        ),
        (
            "SELECT set_config('a.b', 'c', $1)",
            [(UNTRACKED, "set_config with arguments that are not literals")],
        ),
        ("select set_config('role', 'r', false)", [(ROLE, "role", True)]),
        ("select set_config('role', 'none', false)", [(ROLE, "role", False)]),
        ("select set_config('role', 'r', true)", []),
        ("select set_config('seed', '0.5', false)", [(SEED,)]),
        ("select set_config('transaction_read_only', 'on', false)", []),
        (
            "SELECT set_config('a.b', 'c', false), set_config('d.e', 'f', false)",
            [
                (SET, "a.b", "SELECT set_config('a.b', 'c', false)"),
                (SET, "d.e", "SELECT set_config('d.e', 'f', false)"),
            ],
        ),
    ],
)
def test_set_config(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert effects(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # a lock function alone in a one-row SELECT: its statement's row says what it did
        # (key, tried / shared, statement, column, columns)
        ("SELECT pg_advisory_lock(1)", [(LOCK_ROW, "1", False, 0, 0, 1)]),
        ("SELECT pg_advisory_lock(-1)", [(LOCK_ROW, "-1", False, 0, 0, 1)]),
        ("SELECT pg_advisory_lock(1, 2)", [(LOCK_ROW, "1,2", False, 0, 0, 1)]),
        ("SELECT pg_catalog.pg_advisory_lock(3)", [(LOCK_ROW, "3", False, 0, 0, 1)]),
        ("SELECT pg_advisory_lock($1)", [(LOCK_ROW, "$1", False, 0, 0, 1)]),
        ("SELECT pg_try_advisory_lock(4)", [(LOCK_ROW, "4", True, 0, 0, 1)]),
        ("SELECT pg_advisory_lock_shared(5)", [(LOCK_ROW, "shared 5", False, 0, 0, 1)]),
        ("SELECT pg_try_advisory_lock_shared(5, 6)", [(LOCK_ROW, "shared 5,6", True, 0, 0, 1)]),
        (
            "SELECT pg_advisory_lock(1), pg_try_advisory_lock(1) AS got",
            [(LOCK_ROW, "1", False, 0, 0, 2), (LOCK_ROW, "1", True, 0, 1, 2)],
        ),
        ("SELECT pg_advisory_unlock(1)", [(UNLOCK_ROW, "1", False, 0, 0, 1)]),
        ("SELECT pg_advisory_unlock_shared($2)", [(UNLOCK_ROW, "shared $2", True, 0, 0, 1)]),
        ("SELECT pg_advisory_unlock(id)", [(UNLOCK_ROW, None, False, 0, 0, 1)]),
        ("SELECT pg_try_advisory_lock(1 + 1)", [(LOCK_ROW, None, True, 0, 0, 1)]),
        ("SELECT pg_advisory_unlock_all()", [(UNLOCK_ALL_ROW, 0, 0, 1)]),
        ("SELECT 1; SELECT pg_try_advisory_lock(7)", [(LOCK_ROW, "7", True, 1, 0, 1)]),
        # no row of its own to read: counted as written
        ("EXPLAIN ANALYZE SELECT pg_advisory_lock(1)", [(LOCK, "1")]),
        ("SELECT pg_advisory_lock(1) INTO TEMP t", [(TEMP, "t"), (LOCK, "1")]),
        ("EXPLAIN ANALYZE SELECT pg_advisory_unlock_all()", [(UNLOCK_ALL,)]),
        # how many run cannot be known: the locks are not counted, the unlocks not followed
        ("SELECT pg_advisory_lock(id) FROM t", [(LOCK_UNCOUNTED,)]),
        ("SELECT pg_advisory_lock(1) FROM t", [(LOCK_UNCOUNTED,)]),
        ("SELECT pg_advisory_lock(1) WHERE random() > 0.5", [(LOCK_UNCOUNTED,)]),
        ("SELECT pg_advisory_lock(1), 1 / 0", [(LOCK_UNCOUNTED,)]),
        ("WITH x AS (SELECT 1) SELECT pg_advisory_lock(1)", [(LOCK_UNCOUNTED,)]),
        (
            "SELECT pg_advisory_lock(1) UNION ALL SELECT pg_advisory_lock(1)",
            [(LOCK_UNCOUNTED,), (LOCK_UNCOUNTED,)],
        ),
        ("VALUES (pg_advisory_lock(1))", [(LOCK_UNCOUNTED,)]),
        ("SELECT pg_advisory_unlock(1) FROM t", []),
        # may run for no row: the locks stay (pinned) until one sure to run
        ("SELECT pg_advisory_unlock_all() FROM t", []),
        ("SELECT pg_advisory_unlock_all() WHERE false", []),
        # transaction-level locks go with their transaction
        ("SELECT pg_advisory_xact_lock(1)", []),
        ("SELECT pg_try_advisory_xact_lock_shared(1, 2)", []),
        ("SELECT pg_advisory_xact_lock_shared(1)", []),
    ],
)
def test_advisory_locks(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert effects(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("CREATE TEMP TABLE t (a int)", [(TEMP, "t")]),
        ("CREATE TEMPORARY TABLE IF NOT EXISTS t (a int)", [(TEMP, "t")]),
        ("CREATE TEMP TABLE t (a int) ON COMMIT DELETE ROWS", [(TEMP, "t")]),
        ("CREATE TEMP TABLE t (a int) ON COMMIT DROP", []),
        ("CREATE TABLE pg_temp.t (a int)", [(TEMP, "t")]),
        ("CREATE TABLE t (a int)", []),
        ("CREATE UNLOGGED TABLE t (a int)", []),
        ("CREATE TEMP VIEW v AS SELECT 1", [(TEMP, "v")]),
        ("CREATE VIEW pg_temp.v AS SELECT 1", [(TEMP, "v")]),
        ("CREATE VIEW v AS SELECT 1", []),
        ("CREATE TEMP SEQUENCE s", [(TEMP, "s")]),
        ("CREATE SEQUENCE s", []),
        ("CREATE TEMP TABLE t AS SELECT 1", [(TEMP, "t")]),
        ("CREATE TEMP TABLE t ON COMMIT DROP AS SELECT 1", []),
        ("CREATE TABLE t AS SELECT 1", []),
        ("SELECT 1 INTO TEMP t", [(TEMP, "t")]),
        ("SELECT * INTO TEMPORARY TABLE t FROM x", [(TEMP, "t")]),
        ("SELECT 1 INTO t", []),
        ('CREATE TEMP TABLE "T" (a int)', [(TEMP, "T")]),
        # a DROP of a relation's name (in pg_temp, or unqualified): the state keeps the ones
        # that name a temporary relation of the client's
        ("DROP TABLE t", [(DROP_TEMP, "t", False)]),
        (
            "DROP TABLE IF EXISTS pg_temp.t, u CASCADE",
            [(DROP_TEMP, "t", True), (DROP_TEMP, "u", False)],
        ),
        ("DROP VIEW v", [(DROP_TEMP, "v", False)]),
        ("DROP SEQUENCE s", [(DROP_TEMP, "s", False)]),
        ("DROP TABLE public.t", []),
        ("DROP INDEX i", []),
        ("DROP FUNCTION pg_temp.f()", []),
        ("CREATE TEMP TABLE t AS SELECT pg_advisory_lock(1)", [(TEMP, "t"), (LOCK_UNCOUNTED,)]),
    ],
)
def test_temporary_objects(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert effects(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("DISCARD ALL", [(DISCARD_ALL,)]),
        ("DISCARD TEMP", [(DISCARD_TEMP,)]),
        ("DISCARD TEMPORARY", [(DISCARD_TEMP,)]),
        ("DISCARD PLANS", []),
        ("DISCARD SEQUENCES", []),
        ("LOAD 'auto_explain'", [(LOAD,)]),
        ("DECLARE c CURSOR WITH HOLD FOR SELECT 1", [(HOLD, "c")]),
        ("DECLARE C NO SCROLL CURSOR WITH HOLD FOR SELECT 1", [(HOLD, "c")]),
        ("DECLARE c CURSOR WITHOUT HOLD FOR SELECT 1", []),
        ("DECLARE c CURSOR FOR SELECT 1", []),
        ("DECLARE c CURSOR WITH HOLD FOR SELECT pg_advisory_lock(1)", [(HOLD, "c"), (LOCK, "1")]),
        ("CLOSE c", [(CLOSE, "c")]),
        ("CLOSE ALL", [(CLOSE, None)]),
        ("LISTEN ch", [(LISTEN, "ch")]),
        ('LISTEN "Ch"', [(LISTEN, "Ch")]),
        ("UNLISTEN ch", [(UNLISTEN, "ch")]),
        ("UNLISTEN *", [(UNLISTEN, None)]),
    ],
)
def test_session_objects(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert effects(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("BEGIN", [(BEGIN,)]),
        ("BEGIN ISOLATION LEVEL SERIALIZABLE", [(BEGIN,)]),
        ("START TRANSACTION READ ONLY", [(BEGIN,)]),
        ("COMMIT", [(COMMIT, False)]),
        ("END", [(COMMIT, False)]),
        ("COMMIT AND CHAIN", [(COMMIT, True)]),
        ("COMMIT AND NO CHAIN", [(COMMIT, False)]),
        ("ROLLBACK", [(ROLLBACK, False)]),
        ("ABORT", [(ROLLBACK, False)]),
        ("ROLLBACK AND CHAIN", [(ROLLBACK, True)]),
        ("SAVEPOINT a", [(SAVEPOINT, "a")]),
        ("SAVEPOINT A", [(SAVEPOINT, "a")]),
        ("RELEASE a", [(RELEASE, "a")]),
        ("RELEASE SAVEPOINT a", [(RELEASE, "a")]),
        ("ROLLBACK TO a", [(ROLLBACK_TO, "a")]),
        ("ROLLBACK TO SAVEPOINT a", [(ROLLBACK_TO, "a")]),
        # the session leaves its transaction, whose settings it keeps
        ("PREPARE TRANSACTION 'x'", [(COMMIT, False)]),
        ("COMMIT PREPARED 'x'", []),
        ("ROLLBACK PREPARED 'x'", []),
    ],
)
def test_transaction_control(sql: str, expected: list[tuple[object, ...]]) -> None:
    assert effects(sql) == expected


def test_prepare_of_a_statement_that_changes_state_cannot_be_followed() -> None:
    why = "a prepared statement that changes session state"
    assert effects("PREPARE p AS SELECT pg_advisory_lock(1)") == [(UNTRACKED, why)]
    assert effects("PREPARE p (text) AS SELECT set_config('a.b', $1, false)") == [(UNTRACKED, why)]
    assert effects("PREPARE p AS SELECT 1 INTO TEMP t") == [(UNTRACKED, why)]
    assert effects("PREPARE p AS SELECT $1") == []
    assert effects("EXECUTE p") == []


def test_statements_of_a_query_in_order() -> None:
    parsed = effects_of("BEGIN; SET a.b = 1; SELECT 1; SAVEPOINT s; LISTEN ch; COMMIT")
    assert parsed.statements == 6
    assert parsed.effects == [
        (BEGIN,),
        (SET, "a.b", "SET a.b = 1"),
        (SAVEPOINT, "s"),
        (LISTEN, "ch"),
        (COMMIT, False),
    ]
    assert effects_of("SELECT 1").statements == 1
    assert effects_of("SELECT 1;").statements == 1


@pytest.mark.parametrize(
    "sql",
    [
        "SELEC 1",
        "SET",
        "SET a.b = 1; SELEC 1",
        "BEGIN; SET a.b =",
        "SELECT pg_advisory_lock(1",
        "SET search_path TO 'a",
    ],
)
def test_a_syntax_error_has_no_effects(sql: str) -> None:
    parsed = effects_of(sql)
    assert parsed.effects == []
    assert parsed.statements == 1


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "UPDATE t SET a = 1",
        "DELETE FROM t",
        "INSERT INTO t SELECT * FROM u",
        "SHOW search_path",
        "SELECT current_setting('search_path')",
        "EXECUTE p(1)",
        "DEALLOCATE ALL",
        "NOTIFY ch",
    ],
)
def test_plain_statements_have_no_effects(sql: str) -> None:
    assert effects(sql) == []


# --- gaps: state PostgreSQL keeps in the session that the effects miss ---------------------------


def test_a_temporary_function_is_a_temporary_object() -> None:
    # ("": no DROP of a name ends it)
    assert effects("CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'") == [
        (TEMP, "")
    ]


@pytest.mark.parametrize(
    "sql",
    ["EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1", "EXPLAIN (ANALYZE) SELECT 1 INTO TEMP t"],
)
def test_explain_analyze_creating_a_temporary_table(sql: str) -> None:
    assert (TEMP, "t") in effects(sql)


def test_setseed_is_like_set_seed() -> None:
    assert may_change_state(query("SELECT setseed(0.5)"))
    assert effects("SELECT setseed(0.5)") == [(SEED,)]


# --- LISTEN and UNLISTEN answered by pgtarn ------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("LISTEN a", [(SUBSCRIBE, "a")]),
        ('LISTEN "Mixed Case"', [(SUBSCRIBE, "Mixed Case")]),
        ("listen Folded;", [(SUBSCRIBE, "folded")]),
        ("/* why */ LISTEN a -- now", [(SUBSCRIBE, "a")]),
        (
            "LISTEN a; UNLISTEN b; UNLISTEN *",
            [(SUBSCRIBE, "a"), (UNSUBSCRIBE, "b"), (UNSUBSCRIBE, None)],
        ),
        ("LISTEN a; LISTEN a", [(SUBSCRIBE, "a"), (SUBSCRIBE, "a")]),
    ],
)
def test_a_text_of_listen_and_unlisten_only_is_answered_by_pgtarn(
    sql: str, expected: list[tuple[str, str | None]]
) -> None:
    parsed = effects_of(sql)
    subscriptions = as_subscriptions(parsed)
    assert subscriptions is not None
    assert subscriptions.effects == expected
    assert subscriptions.statements == parsed.statements == len(expected)


@pytest.mark.parametrize(
    "sql",
    [
        "LISTEN a; SELECT 1",  # a statement without effects
        "SELECT 1; LISTEN a",
        "LISTEN a; SET a.b = 1",
        "BEGIN; LISTEN a; COMMIT",
        "LISTEN a; SELECT pg_advisory_lock(1)",
        "NOTIFY a",
        "SELECT 1",
        "",
        "LISTEN",  # parse errors: PostgreSQL answers them
        "LISTEN a; SELEC 1",
        "LISTEN a; UNLISTEN",
    ],
)
def test_a_text_with_anything_else_runs_on_the_server(sql: str) -> None:
    assert as_subscriptions(effects_of(sql)) is None


@pytest.mark.parametrize(
    ("text", "changes"),
    [
        ("ALTER TABLE t ALTER COLUMN c TYPE bigint", True),
        ("create table t (a int)", True),
        ("  /* migration 7 */ DROP TYPE mood", True),
        ("-- note\ncomment on table t is 'x'", True),
        ("select 1; drop table t", True),
        ("DO $$BEGIN ALTER TABLE t ADD b int; END$$", True),
        ("create temp table scratch (a int)", False),
        ("CREATE LOCAL TEMPORARY TABLE scratch (a int)", False),
        ("select created_at, dropped from t", False),
        ("insert into t values (1)", False),
        ("DO $$BEGIN PERFORM 1; END$$", False),
        ("select 1; -- drop\n/* alter */ drop table t", True),
        ("select 1; /* a */ /* b */ -- c\n\t alter table t add b int", True),
        ("select 1; -- drop table t; alter table t", False),  # (one comment to the end)
        ("select 1; /* ; drop table t */ select 2", False),
        ("do $$ begin perform 1; end $$; do $$ begin drop table t; end $$", True),
        ("select 1; do $$ begin perform 1; end $$; select 'dropped'", False),
        ("select 1;" + " --" * 40 + "x", False),  # (exponential before)
        ("select 1;" + " /* x */" * 40 + " /*", False),
        ("select 1;" + "; do x" * 20_000, False),
        ("select 1;" + "; -- x" * 20_000, False),
        ("select 1;" + " /*" * 20_000, False),
    ],
)
def test_first_look_sees_schema_changes(text: str, changes: bool) -> None:
    body = text.encode() + b"\x00"
    assert bool(effects_module.first_look(body) & effects_module.SCHEMA_CHANGE) is changes
    parse = b"\x00" + body + b"\x00\x00"  # the unnamed statement's Parse
    assert bool(effects_module.first_look(parse, 0x50) & effects_module.SCHEMA_CHANGE) is changes


def _bind(*values: bytes | None) -> bytes:
    body = b"\x00stmt\x00" + b"\x00\x01\x00\x01" + len(values).to_bytes(2, "big")
    for value in values:
        body += b"\xff\xff\xff\xff" if value is None else len(value).to_bytes(4, "big") + value
    return body + b"\x00\x00"


def test_set_config_with_a_parameter_is_a_setting_once_bound() -> None:
    parsed = effects_of("SELECT set_config('jit', $1, false)")
    assert parsed.parameters and parsed.effects == [(effects_module.SET_PARAM, "jit", 1, False)]
    bound = effects_module.with_parameters(parsed, _bind(b"on"))
    assert bound.effects == [(SET, "jit", "SELECT set_config('jit', 'on', false)")]
    local = effects_module.with_parameters(
        effects_of("SELECT set_config('work_mem', $2::text, true)"), _bind(b"x", b"64kB")
    )
    assert local.effects == [(LOCAL, "work_mem", "SELECT set_config('work_mem', '64kB', false)")]
    for unreadable in (None, _bind(None), _bind(b"\xff"), b"\x00"):
        assert effects_module.with_parameters(parsed, unreadable).effects[0][0] == UNTRACKED
    role = effects_of("SELECT set_config('role', $1, false)")
    assert role.effects[0][0] == UNTRACKED
