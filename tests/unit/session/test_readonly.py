"""Tests for pgtarn.session.readonly: which texts and message chunks may start a transaction on
a read-only replica."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pglast import parse_sql
from pglast.parser import ParseError

from pgtarn.proto import build
from pgtarn.session import readonly
from pgtarn.session.effects import Kind
from pgtarn.session.readonly import (
    ALLOWED_FUNCTIONS,
    classify,
    classify_bytes,
    classify_chunk,
)

FUZZ = settings(max_examples=300, deadline=None, database=None)

READ = [
    "SELECT 1",
    "select 1;",
    "SELECT 1 ;  ",
    "select  /* c */ 1",
    "/* c */ SELECT 1",
    "/* a /* nested */ comment */ SELECT 1",
    "-- comment\nSELECT 1",
    "  \n\t SELECT 1",
    "SELECT * FROM t",
    "SELECT abalance FROM pgbench_accounts WHERE aid = 42;",
    "SELECT count(*) FROM t WHERE x = $1",
    "SELECT a, b FROM t WHERE a IN (1, 2) AND b LIKE 'x%' ORDER BY a DESC LIMIT 10 OFFSET 5",
    "SELECT DISTINCT ON (a) a, b FROM t ORDER BY a, b",
    "SELECT DISTINCT a FROM t",
    "VALUES (1)",
    "VALUES (1, 'a'), (2, 'b')",
    "TABLE t",
    "(SELECT 1) UNION SELECT 2",
    "SELECT 1 UNION ALL SELECT 2 INTERSECT SELECT 3 EXCEPT SELECT 4",
    "((SELECT 1))",
    "SELECT pg_catalog.lower('a')",
    "SELECT lower(name), upper(name), length(name), substr(name, 1, 2) FROM t",
    "SELECT substring('abc' from 2), trim(both ' ' from ' a '), position('b' in 'abc')",
    "SELECT extract(year from now()), date_trunc('day', now()), now() AT TIME ZONE 'UTC'",
    "SELECT 'a' SIMILAR TO 'b', overlay('abc' placing 'x' from 2)",
    "SELECT CURRENT_TIMESTAMP, CURRENT_USER, CURRENT_DATE, LOCALTIME, SESSION_USER",
    "SELECT coalesce(a, 0), nullif(a, 1), greatest(a, b), least(a, b) FROM t",
    "SELECT CASE WHEN a > 0 THEN 'p' ELSE 'n' END FROM t",
    "SELECT a::text, CAST(b AS int), '1'::int4 FROM t",
    "SELECT sum(a), avg(a), min(a), max(a), array_agg(a ORDER BY a) FROM t GROUP BY b "
    "HAVING count(*) > 1",
    "SELECT string_agg(name, ',') FILTER (WHERE id > 1) FROM t",
    "SELECT row_number() OVER (PARTITION BY a ORDER BY b), lag(a) OVER w FROM t "
    "WINDOW w AS (ORDER BY a)",
    "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.id)",
    "SELECT (SELECT max(a) FROM u) FROM t",
    "SELECT * FROM t WHERE a = ANY($1::int[])",
    "SELECT * FROM t JOIN u USING (id) LEFT JOIN v ON v.id = t.id",
    "SELECT * FROM t, LATERAL (SELECT * FROM u WHERE u.id = t.id ORDER BY lower(u.n)) s",
    "SELECT * FROM generate_series(1, 10) g",
    "SELECT * FROM unnest(ARRAY[1, 2]) WITH ORDINALITY",
    "WITH x AS (SELECT 1 AS a) SELECT * FROM x",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT * FROM r",
    "SELECT data->>'a', data->'b', data #>> '{c,d}' FROM t",
    "SELECT jsonb_build_object('a', 1), json_agg(t), to_jsonb(t) FROM t",
    "SELECT current_setting('search_path'), version(), current_database()",
    "SELECT format('%s', 1), concat_ws(',', 'a', 'b'), regexp_replace('a', 'a', 'b')",
    "SELECT round(1.5), abs(-1), floor(1.5), ceil(1.5), mod(5, 2)",
    "SELECT to_char(now(), 'YYYY'), age(now()), make_interval(days => 1)",
    "SELECT ROW(1, 2), ARRAY[1, 2], ARRAY(SELECT 1), (ARRAY[1, 2])[1]",
    "SELECT a IS NULL, a IS DISTINCT FROM b, a BETWEEN 1 AND 2 FROM t",
    "SELECT 1 OPERATOR(pg_catalog.+) 2",
    "SELECT * FROM t TABLESAMPLE bernoulli (10)",
    "SELECT * FROM t ORDER BY a USING <",
    "SELECT 1 FROM t FOR READ ONLY",
    "SELECT * FROM ROWS FROM (generate_series(1, 2), unnest(ARRAY[1]))",
    "SELECT * FROM json_table('[1]'::jsonb, '$[*]' PASSING 1 AS x COLUMNS (a int PATH '$'))",
    "SELECT xmlelement(name a), xmlserialize(content x AS text), json_object('a': 1), "
    "x IS JSON FROM t",
    "SELECT * FROM xmltable('/a' PASSING x COLUMNS b int PATH 'b')",
    "SELECT 1 WHERE 'a' COLLATE \"C\" < 'b'",
    "SELECT GROUPING(a), a, b FROM t GROUP BY ROLLUP (a, b)",
    "EXPLAIN SELECT 1",
    "EXPLAIN (COSTS off) SELECT * FROM t",
]

OTHER = [
    "",
    "   ",
    ";",
    "-- only a comment",
    "SELECT * FROM t FOR UPDATE",
    "SELECT * FROM t FOR NO KEY UPDATE",
    "SELECT * FROM t FOR SHARE",
    "SELECT * FROM t FOR KEY SHARE SKIP LOCKED",
    "SELECT * FROM (SELECT * FROM t FOR SHARE) s",
    "SELECT * FROM t WHERE id IN (SELECT id FROM u FOR UPDATE)",
    "WITH x AS (SELECT * FROM t FOR UPDATE) SELECT * FROM x",
    "(SELECT 1 FROM t) UNION (SELECT 2 FROM u) FOR UPDATE",
    "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
    "WITH x AS (INSERT INTO t VALUES (1) RETURNING *) SELECT * FROM x",
    "WITH x AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM x",
    "WITH a AS (SELECT 1), b AS (WITH c AS (DELETE FROM t RETURNING 1) SELECT * FROM c) "
    "SELECT * FROM b",
    "SELECT * FROM (WITH c AS (UPDATE t SET a = 1 RETURNING 1) SELECT * FROM c) s",
    "WITH m AS (MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN DELETE RETURNING t.*) "
    "SELECT * FROM m",
    "SELECT nextval('s')",
    "SELECT setval('s', 1)",
    "SELECT currval('s')",
    "SELECT lastval()",
    "SELECT random()",
    "SELECT pg_catalog.random()",
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_lock(1)",
    "SELECT pg_advisory_xact_lock(1)",
    "SELECT pg_notify('c', 'p')",
    "SELECT pg_sleep(1)",
    "SELECT clock_timestamp()",
    "SELECT txid_current()",
    "SELECT pg_current_xact_id()",
    "SELECT set_config('a.b', 'c', false)",
    "SELECT pg_terminate_backend(1)",
    "SELECT pg_cancel_backend(1)",
    "SELECT lo_import('/etc/passwd')",
    "SELECT pg_read_file('x')",
    "SELECT dblink('x', 'y')",
    "SELECT gen_random_uuid()",
    "SELECT myfunc()",
    "SELECT public.lower('a')",
    "SELECT other.pg_catalog.lower('a')",
    "SELECT * FROM t WHERE a = myfunc()",
    "SELECT * FROM t ORDER BY random()",
    "SELECT * FROM t, LATERAL (SELECT nextval('s')) s",
    "SELECT * FROM myfunc()",
    "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.a = myfunc(t.a))",
    "WITH x AS (SELECT nextval('s')) SELECT * FROM x",
    "SELECT count(*) FILTER (WHERE myfunc(a)) FROM t",
    "SELECT 1 OPERATOR(public.+) 2",
    "SELECT 1 >>> 2",
    "SELECT * FROM t ORDER BY a USING OPERATOR(public.>>>)",
    "SELECT * FROM t ORDER BY a USING >>>",
    "VALUES (nextval('s'))",
    "SELECT * FROM ROWS FROM (generate_series(1, 2), myfunc())",
    "SELECT json_object('a': nextval('s'))",
    "SELECT * FROM t WHERE a = ANY(ARRAY(SELECT nextval('s')))",
    "SELECT * FROM t TABLESAMPLE my_sampler (10)",
    "SELECT 1; SELECT 2",
    "SELECT 1; BEGIN",
    "SELECT INTO newtable FROM t",
    "SELECT * INTO newtable FROM t",
    "SELECT 1 INTO TEMP x",
    "CREATE TABLE x AS SELECT 1",
    "INSERT INTO t VALUES (1)",
    "insert into t select * from u",
    "UPDATE t SET a = 1",
    "DELETE FROM t",
    "MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN DELETE",
    "COPY t TO STDOUT",
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "SET TRANSACTION READ WRITE",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "SET transaction_read_only = on",
    "SET LOCAL transaction_read_only = off",
    "SET LOCAL transaction_read_only TO DEFAULT",
    "RESET transaction_read_only",
    "DECLARE c CURSOR FOR SELECT 1",
    "EXPLAIN ANALYZE SELECT 1",
    "EXPLAIN (ANALYZE) SELECT 1",
    "EXPLAIN (ANALYZE true, BUFFERS) SELECT 1",
    "EXPLAIN DELETE FROM t",
    "EXPLAIN SELECT nextval('s')",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
    "CALL proc()",
    "DO $$ BEGIN PERFORM 1; END $$",
    "COMMIT",
    "ROLLBACK",
    "END",
    "BEGIN READ WRITE",
    "BEGIN ISOLATION LEVEL SERIALIZABLE, READ WRITE",
    "START TRANSACTION READ WRITE, READ ONLY",
    "BEGIN; SELECT 1",
    "BEGIN; COMMIT",
    "BEGIN READ ONLY; SELECT 1; COMMIT",
    "BEGIN; SET TRANSACTION READ ONLY; SELECT 1; COMMIT",
    "BEGIN; SET TRANSACTION READ ONLY; SELECT 1; END",
    "BEGIN; SET TRANSACTION READ ONLY; SELECT 1; ROLLBACK",
    "BEGIN; SET TRANSACTION READ ONLY; COMMIT AND CHAIN",
    "BEGIN; SET TRANSACTION READ ONLY; SET TRANSACTION READ WRITE; DELETE FROM t",
    "BEGIN; SET TRANSACTION READ ONLY; SET LOCAL transaction_read_only = off",
    "BEGIN; SET TRANSACTION READ ONLY; RESET transaction_read_only",
    "BEGIN; SELECT 1; SET TRANSACTION READ ONLY",
    "BEGIN; SET search_path = a; SET TRANSACTION READ ONLY",
    "BEGIN; SAVEPOINT a; SET TRANSACTION READ ONLY",
    "BEGIN READ WRITE; SET TRANSACTION READ ONLY",
    "BEGIN READ ONLY; BEGIN",
    "BEGIN READ ONLY; PREPARE TRANSACTION 'x'",
    "SELECT 1; BEGIN READ ONLY",
    "SET TRANSACTION READ ONLY; SELECT 1",
    "SELEC 1",
    "SELECT (",
    "SELECT 'unterminated",
    "BEGIN READ",
    "SELECT 1 \x00 ; DELETE FROM t",
]

BEGIN_READ_ONLY = [
    "BEGIN READ ONLY",
    "begin read only;",
    "BEGIN TRANSACTION READ ONLY",
    "BEGIN WORK ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE",
    "START TRANSACTION READ ONLY",
    "START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
    "/* c */ START TRANSACTION READ ONLY",
    "BEGIN; SET TRANSACTION READ ONLY",
    "BEGIN; SET TRANSACTION READ ONLY; SELECT 1",
    "BEGIN; SET TRANSACTION READ ONLY; SELECT nextval('s'); INSERT INTO t VALUES (1)",
    "BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET TRANSACTION READ ONLY; SELECT 1",
    "START TRANSACTION; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE READ ONLY; SELECT 1",
    "BEGIN; SET LOCAL transaction_read_only = on; SELECT 1",
    "BEGIN READ ONLY; SELECT 1",
    "BEGIN READ ONLY; SAVEPOINT a; SELECT 1; ROLLBACK TO SAVEPOINT a; RELEASE a",
]

BEGIN = [
    "BEGIN",
    "begin;",
    "BEGIN WORK",
    "BEGIN TRANSACTION",
    "begin isolation level serializable",
    "BEGIN ISOLATION LEVEL REPEATABLE READ DEFERRABLE",
    "START TRANSACTION",
    "start transaction isolation level read committed",
    "-- c\nBEGIN",
]

SET_READ_ONLY = [
    "SET TRANSACTION READ ONLY",
    "set transaction read only;",
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE",
    "SET TRANSACTION READ ONLY, ISOLATION LEVEL REPEATABLE READ",
    "SET LOCAL transaction_read_only = on",
    "SET LOCAL transaction_read_only = true",
    "SET LOCAL transaction_read_only TO 'on'",
    "SET LOCAL transaction_read_only TO 1",
]

CASES = (
    [(sql, Kind.READ) for sql in READ]
    + [(sql, Kind.OTHER) for sql in OTHER]
    + [(sql, Kind.BEGIN_READ_ONLY) for sql in BEGIN_READ_ONLY]
    + [(sql, Kind.BEGIN) for sql in BEGIN]
    + [(sql, Kind.SET_READ_ONLY) for sql in SET_READ_ONLY]
)


def test_the_kinds_are_distinct() -> None:
    kinds = [Kind.READ, Kind.BEGIN_READ_ONLY, Kind.BEGIN, Kind.SET_READ_ONLY, Kind.OTHER]
    assert len(set(kinds)) == 5


@pytest.mark.parametrize(("sql", "kind"), CASES)
def test_classify(sql: str, kind: int) -> None:
    assert classify(sql) == kind


@pytest.mark.parametrize(("sql", "kind"), CASES)
def test_classify_bytes_as_the_wire_gives_them(sql: str, kind: int) -> None:
    assert classify_bytes(sql.encode()) == kind
    assert classify(sql.encode()) == kind


@pytest.mark.parametrize(("sql", "kind"), CASES)
def test_a_query_message_is_its_text(sql: str, kind: int) -> None:
    if "\x00" in sql:
        return  # a Query's text ends at its NUL
    assert classify_chunk(build.query(sql), _none) == kind


def test_a_cached_answer_is_the_same_and_needs_no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    sql = "SELECT 'cached once' FROM t"
    assert classify(sql) == Kind.READ
    assert classify(sql.encode()) == Kind.READ  # the bytes form is cached apart

    def fail(text: str) -> object:
        raise AssertionError(f"parsed again: {text}")

    monkeypatch.setattr(readonly, "parse_sql", fail)
    assert classify(sql) == Kind.READ
    assert classify(sql.encode()) == Kind.READ


def test_str_and_bytes_are_cached_apart() -> None:
    """An ASCII str and its bytes hash alike: in one dict a lookup would compare them, which
    python -bb turns into an error."""
    code = (
        "from pgtarn.session.readonly import classify\n"
        "assert classify('SELECT 7') == classify(b'SELECT 7') == 1\n"
        "assert classify(b'SELECT 8') == classify('SELECT 8') == 1\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(readonly.__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-bb", "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_first_look_decides_other_words_without_a_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(text: str) -> object:
        raise AssertionError(f"parsed: {text}")

    monkeypatch.setattr(readonly, "parse_sql", fail)
    for sql in (
        "INSERT INTO t VALUES (1) -- never seen",
        "  update t set a = 2 /* x */",
        "/* c */ delete from t where id = 7",
        "-- c\nCOPY t FROM STDIN",
        "SHOW all;",
    ):
        assert classify(sql) == Kind.OTHER


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readonly, "_CACHE_MAX", 8)
    for cache in ("_TEXTS", "_BYTES", "_READ_SHAPES"):
        monkeypatch.setattr(readonly, cache, {})
    for n in range(50):
        assert classify(f"SELECT {n}") == Kind.READ
        assert classify(f"SELECT {n}".encode()) == Kind.READ
        assert len(readonly._TEXTS) <= 8
        assert len(readonly._BYTES) <= 8
        classify(f"SELECT {n} FROM t{n}".encode())  # a new shape each time
        assert len(readonly._READ_SHAPES) <= 8


def test_a_long_text_is_not_cached() -> None:
    sql = "SELECT " + ", ".join(["1"] * 5000)
    assert len(sql) > readonly._CACHE_TEXT_MAX
    assert classify(sql) == Kind.READ
    assert classify(sql.encode()) == Kind.READ
    assert sql not in readonly._TEXTS
    assert sql.encode() not in readonly._BYTES


def test_bytes_that_are_not_utf8_are_other() -> None:
    assert classify(b"SELECT '\xff\xfe'") == Kind.OTHER
    assert classify(b"SELECT 'caf\xc3\xa9'") == Kind.READ


@given(st.text(max_size=200))
@FUZZ
def test_classify_never_raises(sql: str) -> None:
    assert classify(sql) in (
        Kind.READ,
        Kind.BEGIN_READ_ONLY,
        Kind.BEGIN,
        Kind.SET_READ_ONLY,
        Kind.OTHER,
    )


# --- the allow-list -------------------------------------------------------------------------

NEVER = [
    "random",
    "nextval",
    "setval",
    "currval",
    "lastval",
    "txid_current",
    "pg_current_xact_id",
    "set_config",
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "pg_try_advisory_lock",
    "pg_advisory_unlock",
    "pg_notify",
    "pg_sleep",
    "pg_sleep_for",
    "clock_timestamp",
    "timeofday",
    "pg_cancel_backend",
    "pg_terminate_backend",
    "dblink",
    "lo_import",
    "lo_export",
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_dir",
    "gen_random_uuid",
    "setseed",
    "pg_is_in_recovery",
    "pg_backend_pid",
    "pg_current_wal_lsn",
    "array_shuffle",
    "array_sample",
    "uuidv4",
    "uuidv7",
]


@pytest.mark.parametrize("name", NEVER)
def test_volatile_and_side_effecting_functions_are_not_allowed(name: str) -> None:
    assert name not in ALLOWED_FUNCTIONS
    assert classify(f"SELECT {name}(1)") == Kind.OTHER


@pytest.mark.parametrize("name", sorted(ALLOWED_FUNCTIONS))
def test_an_allowed_function_makes_a_read(name: str) -> None:
    try:  # some are keywords with a syntax of their own (extract, position...)
        parse_sql(f"SELECT {name}(a) FROM t")
    except ParseError:
        pass
    else:
        assert classify(f"SELECT {name}(a) FROM t") == Kind.READ
    assert classify(f"SELECT pg_catalog.{name}(a) FROM t") == Kind.READ
    assert classify(f"SELECT public.{name}(a) FROM t") == Kind.OTHER


# --- message chunks ----------------------------------------------------------------------------


def _none(name: bytes) -> bytes | None:
    return None


def parse(name: str, sql: str) -> bytes:
    return build.parse(name, sql)


def bind(statement: str, portal: str = "") -> bytes:
    return build.bind(portal, statement, ["42"])


def describe(what: bytes, name: str = "") -> bytes:
    return build.message(b"D", what + name.encode() + b"\x00")


def execute(portal: str = "") -> bytes:
    return build.execute(portal)


def close(what: bytes, name: str) -> bytes:
    return build.message(b"C", what + name.encode() + b"\x00")


SYNC = build.SYNC
FLUSH = build.message(b"H")
SELECT = "SELECT abalance FROM pgbench_accounts WHERE aid = $1"


def known(statements: dict[bytes, str]) -> Callable[[bytes], bytes | None]:
    def statement_text(name: bytes) -> bytes | None:
        sql = statements.get(name)
        return None if sql is None else sql.encode()

    return statement_text


def test_one_query() -> None:
    assert classify_chunk(build.query("SELECT 1"), _none) == Kind.READ
    assert classify_chunk(build.query("UPDATE t SET a = 1"), _none) == Kind.OTHER
    assert classify_chunk(build.query("BEGIN READ ONLY"), _none) == Kind.BEGIN_READ_ONLY


def test_two_queries_are_other() -> None:
    chunk = build.query("SELECT 1") + build.query("SELECT 2")
    assert classify_chunk(chunk, _none) == Kind.OTHER


def test_a_query_with_anything_after_it_is_other() -> None:
    for tail in (SYNC, FLUSH, b"Q", build.query("SELECT 2")[:7]):
        assert classify_chunk(build.query("SELECT 1") + tail, _none) == Kind.OTHER


def test_a_query_with_its_text_cut_at_a_nul_is_other() -> None:
    chunk = build.message(b"Q", b"SELECT 1\x00; DELETE FROM t\x00")
    assert classify_chunk(chunk, _none) == Kind.OTHER


def test_a_read_batch() -> None:
    chunk = parse("", SELECT) + bind("") + describe(b"P") + execute() + SYNC
    assert classify_chunk(chunk, _none) == Kind.READ


def test_a_read_batch_of_several_statements_with_flush_and_close() -> None:
    chunk = (
        parse("s1", SELECT)
        + parse("s2", "SELECT 2")
        + bind("s1")
        + execute()
        + FLUSH
        + bind("s2", "p")
        + describe(b"S", "s2")
        + execute("p")
        + close(b"P", "p")
        + close(b"S", "s1")
        + SYNC
    )
    assert classify_chunk(chunk, _none) == Kind.READ


def test_a_batch_with_a_write_is_other() -> None:
    chunk = (
        parse("", SELECT)
        + bind("")
        + execute()
        + parse("", "UPDATE t SET a = 1")
        + bind("")
        + execute()
        + SYNC
    )
    assert classify_chunk(chunk, _none) == Kind.OTHER


def test_a_write_parsed_but_not_bound_is_other() -> None:
    chunk = parse("w", "DELETE FROM t") + parse("", SELECT) + bind("") + execute() + SYNC
    assert classify_chunk(chunk, _none) == Kind.OTHER


def test_a_bind_uses_the_latest_parse_of_its_name() -> None:
    chunk = parse("", "DELETE FROM t") + parse("", SELECT) + bind("") + execute() + SYNC
    assert classify_chunk(chunk, _none) == Kind.OTHER  # the DELETE's Parse is in the batch
    chunk = parse("", SELECT) + bind("") + parse("", "DELETE FROM t") + bind("") + SYNC
    assert classify_chunk(chunk, _none) == Kind.OTHER


def test_a_bind_to_a_statement_known_from_before() -> None:
    chunk = bind("s9") + execute() + SYNC
    assert classify_chunk(chunk, known({b"s9": SELECT})) == Kind.READ
    assert classify_chunk(chunk, known({b"s9": "INSERT INTO t VALUES ($1)"})) == Kind.OTHER


def test_a_bind_to_an_unknown_statement_is_other() -> None:
    assert classify_chunk(bind("nope") + execute() + SYNC, _none) == Kind.OTHER


def test_a_bind_to_the_unnamed_statement_not_parsed_here_is_other() -> None:
    asked: list[bytes] = []

    def statement_text(name: bytes) -> bytes | None:
        asked.append(name)
        return SELECT.encode()

    assert classify_chunk(bind("") + execute() + SYNC, statement_text) == Kind.OTHER
    assert asked == []


def test_a_batch_without_a_statement_is_other() -> None:
    assert classify_chunk(SYNC, _none) == Kind.OTHER
    assert classify_chunk(describe(b"S", "s1") + SYNC, known({b"s1": SELECT})) == Kind.OTHER


def test_a_batch_must_end_with_one_sync() -> None:
    batch = parse("", SELECT) + bind("") + execute()
    assert classify_chunk(batch, _none) == Kind.OTHER
    assert classify_chunk(batch + FLUSH, _none) == Kind.OTHER
    assert classify_chunk(batch + SYNC + SYNC, _none) == Kind.OTHER
    assert classify_chunk(batch + SYNC + build.query("SELECT 1"), _none) == Kind.OTHER
    assert classify_chunk(batch + SYNC + parse("", SELECT), _none) == Kind.OTHER
    assert (
        classify_chunk(parse("", SELECT) + SYNC + bind("") + execute() + SYNC, _none) == Kind.OTHER
    )


def test_other_message_types_in_a_batch_are_other() -> None:
    function_call = build.message(b"F", struct.pack("!IhhIh", 1234, 0, 0, 0, 0))
    copy_data = build.message(b"d", b"1\n")
    for extra in (function_call, copy_data, build.query("SELECT 1"), build.TERMINATE):
        chunk = parse("", SELECT) + bind("") + extra + execute() + SYNC
        assert classify_chunk(chunk, _none) == Kind.OTHER
    assert classify_chunk(function_call, _none) == Kind.OTHER


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("BEGIN READ ONLY", Kind.BEGIN_READ_ONLY),
        ("BEGIN", Kind.BEGIN),
        ("SET TRANSACTION READ ONLY", Kind.SET_READ_ONLY),
        ("BEGIN READ WRITE", Kind.OTHER),
    ],
)
def test_a_batch_of_one_transaction_statement(sql: str, kind: int) -> None:
    assert classify_chunk(parse("", sql) + bind("") + execute() + SYNC, _none) == kind
    named = parse("b", sql) + bind("b") + describe(b"P") + execute() + SYNC
    assert classify_chunk(named, _none) == kind
    assert classify_chunk(bind("b") + execute() + SYNC, known({b"b": sql})) == kind


def test_a_transaction_statement_among_others_in_a_batch_is_other() -> None:
    chunk = (
        parse("", "BEGIN READ ONLY")
        + bind("")
        + execute()
        + parse("", SELECT)
        + bind("")
        + execute()
        + SYNC
    )
    assert classify_chunk(chunk, _none) == Kind.OTHER
    chunk = parse("", "BEGIN READ ONLY") + bind("") + execute() + bind("") + execute() + SYNC
    assert classify_chunk(chunk, _none) == Kind.OTHER


@pytest.mark.parametrize(
    "sql",
    [
        "SET search_path = a, b",
        "set application_name to 'x'",
        "RESET ALL",
        "reset work_mem",
        "SHOW work_mem",
        "SET default_transaction_read_only = on",
        "SET ROLE other",
    ],
)
def test_settings_run_anywhere(sql: str) -> None:
    assert classify(sql) == Kind.NOTHING


@pytest.mark.parametrize(
    "sql",
    [
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
        "SET transaction_read_only = off",
        "SET search_path = a; INSERT INTO t VALUES (1)",
    ],
)
def test_settings_with_more_are_other(sql: str) -> None:
    assert classify(sql) == Kind.OTHER


def test_a_batch_that_goes_on_after_a_flush_is_read_only_when_all_of_it_so_far_is() -> None:
    # asyncpg prepares with Parse, Describe, Flush, and binds in the next chunk
    flush = build.message(b"H")
    assert classify_chunk(parse("s1", SELECT) + describe(b"S", "s1") + flush, _none) == Kind.READ
    assert (
        classify_chunk(
            parse("s1", "INSERT INTO t VALUES ($1)") + describe(b"S", "s1") + flush, _none
        )
        == Kind.OTHER
    )
    assert classify_chunk(flush, _none) == Kind.OTHER
    assert classify_chunk(parse("s1", SELECT) + flush + SYNC[:3], _none) == Kind.OTHER


def test_a_batch_that_binds_nothing_runs_nothing() -> None:
    # a driver preparing statements ahead (psycopg past its prepare_threshold): any server
    for text in ("BEGIN READ ONLY", "INSERT INTO t VALUES (1)", SELECT):
        assert classify_chunk(parse("s1", text) + SYNC, _none) == Kind.NOTHING
        assert (
            classify_chunk(parse("s1", text) + describe(b"S", "s1") + SYNC, _none) == Kind.NOTHING
        )
    assert classify_chunk(SYNC, _none) == Kind.OTHER
    assert classify_chunk(parse("s1", SELECT) + execute() + SYNC, _none) == Kind.OTHER


def test_a_truncated_message_is_other() -> None:
    whole = parse("", SELECT) + bind("") + execute() + SYNC
    for cut in range(len(whole)):
        assert classify_chunk(whole[:cut], _none) == Kind.OTHER
    query = build.query("SELECT 1")
    for cut in range(len(query)):
        assert classify_chunk(query[:cut], _none) == Kind.OTHER


def test_garbage_lengths_are_other() -> None:
    for length in (0, 3, 4, 5, 2**31, 2**32 - 1):
        assert (
            classify_chunk(b"Q" + struct.pack("!I", length) + b"SELECT 1\x00", _none) == Kind.OTHER
        )
        assert classify_chunk(b"S" + struct.pack("!I", length), _none) == Kind.OTHER
        chunk = parse("", SELECT) + b"B" + struct.pack("!I", length) + b"\x00\x00" + SYNC
        assert classify_chunk(chunk, _none) == Kind.OTHER


def test_malformed_bodies_are_other() -> None:
    no_nul = build.message(b"P", b"name-without-nul")
    text_without_nul = build.message(b"P", b"\x00SELECT 1")
    bind_without_nul = build.message(b"B", b"portal\x00statement")
    for bad in (no_nul, text_without_nul, bind_without_nul):
        assert classify_chunk(bad + SYNC, _none) == Kind.OTHER
    assert (
        classify_chunk(parse("", "SELECT 1") + build.message(b"B", b"") + SYNC, _none) == Kind.OTHER
    )


@given(st.binary(max_size=120))
@FUZZ
def test_classify_chunk_never_raises(data: bytes) -> None:
    assert classify_chunk(data, _none) in (
        Kind.READ,
        Kind.BEGIN_READ_ONLY,
        Kind.BEGIN,
        Kind.SET_READ_ONLY,
        Kind.OTHER,
    )


@given(
    st.lists(
        st.sampled_from(
            [
                parse("", SELECT),
                parse("s", "SELECT 1"),
                bind(""),
                bind("s"),
                execute(),
                FLUSH,
                SYNC,
                describe(b"P"),
                parse("", "DELETE FROM t"),
                build.query("SELECT 1"),
            ]
        ),
        max_size=8,
    ),
    st.integers(min_value=0, max_value=200),
)
@FUZZ
def test_classify_chunk_of_message_soup_never_raises(parts: list[bytes], cut: int) -> None:
    data = b"".join(parts)
    for chunk in (data, data[:cut], data[cut:]):
        assert classify_chunk(chunk, _none) in (
            Kind.READ,
            Kind.BEGIN_READ_ONLY,
            Kind.BEGIN,
            Kind.SET_READ_ONLY,
            Kind.OTHER,
            Kind.NOTHING,
        )


def test_a_read_with_other_numbers_needs_no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    # pgbench -S sends a new literal each time: one parse for all of them
    assert classify_bytes(b"SELECT abalance FROM pgbench_accounts WHERE aid = 1;") == Kind.READ

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed again")

    with monkeypatch.context() as patched:
        patched.setattr(readonly, "parse_sql", fail)
        for aid in (2, 77, 123456, 3.5):
            text = f"SELECT abalance FROM pgbench_accounts WHERE aid = {aid};".encode()
            assert classify_bytes(text) == Kind.READ


def test_numbers_in_names_and_other_statements_are_not_shapes() -> None:
    assert classify_bytes(b"SELECT log10(2)") == Kind.READ
    assert classify_bytes(b"SELECT log20(2)") == Kind.OTHER  # not a built-in
    assert classify_bytes(b"SELECT f1 FROM t WHERE x = $1") == Kind.READ
    assert classify_bytes(b"SET LOCAL transaction_read_only = 1") == Kind.SET_READ_ONLY
    assert classify_bytes(b"SET LOCAL transaction_read_only = 0") == Kind.OTHER
    assert classify_bytes(b"SELECT 1 FROM t FOR UPDATE") == Kind.OTHER
    assert classify_bytes(b"SELECT 2 FROM t") == Kind.READ
    assert classify_bytes(b"SELECT 3 FROM t FOR UPDATE") == Kind.OTHER
