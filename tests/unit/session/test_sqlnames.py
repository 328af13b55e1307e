"""Tests for pgtarn.session.sqlnames: names found where PostgreSQL's grammar puts them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtarn.session.sqlnames import (
    DEALLOCATE,
    EXECUTE,
    PREPARE,
    Unterminated,
    begins_plainly,
    head_names_none,
    may_name_statements,
    rename,
    scan,
    scan_head,
)


def uses(text: str) -> list[tuple[int, bytes]]:
    return [(u.kind, u.name) for u in scan(text.encode()).uses]


def test_prepare_execute_deallocate() -> None:
    assert uses("PREPARE q (int, text) AS SELECT $1") == [(PREPARE, b"q")]
    assert uses("prepare Q as select 1") == [(PREPARE, b"q")]  # folded to lower case
    assert uses('PREPARE "Mixed Case" AS SELECT 1') == [(PREPARE, b"Mixed Case")]
    assert uses('EXECUTE "a""b"(1, 2)') == [(EXECUTE, b'a"b')]
    assert uses("execute q") == [(EXECUTE, b"q")]
    assert uses("DEALLOCATE q") == [(DEALLOCATE, b"q")]
    assert uses("DEALLOCATE PREPARE q") == [(DEALLOCATE, b"q")]
    assert uses("DEALLOCATE ALL") == [] and uses("DEALLOCATE PREPARE ALL") == []


def test_statements_that_embed_execute() -> None:
    assert uses("EXPLAIN EXECUTE q(1)") == [(EXECUTE, b"q")]
    assert uses("EXPLAIN (ANALYZE, BUFFERS) EXECUTE q") == [(EXECUTE, b"q")]
    assert uses("EXPLAIN ANALYZE VERBOSE EXECUTE q") == [(EXECUTE, b"q")]
    assert uses("CREATE TEMP TABLE t AS EXECUTE q(1)") == [(EXECUTE, b"q")]
    assert uses("SELECT 1; EXECUTE a; EXECUTE b") == [(EXECUTE, b"a"), (EXECUTE, b"b")]
    assert scan(b"SELECT 1; EXECUTE a;").statements == 2


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 'EXECUTE q'",
        "SELECT E'\\' EXECUTE q'",
        "SELECT $$EXECUTE q$$",
        "SELECT $body$ ; EXECUTE q; $body$",
        "SELECT 1 -- EXECUTE q",
        "SELECT 1 /* EXECUTE /* nested */ q */",
        'SELECT "EXECUTE q" FROM t',
        "PREPARE TRANSACTION 'execute q'",
        "GRANT EXECUTE ON FUNCTION f() TO PUBLIC",
        "CREATE TRIGGER t AFTER INSERT ON x FOR EACH ROW EXECUTE FUNCTION f()",
        "DO $$BEGIN EXECUTE 'SELECT 1'; END$$",
    ],
)
def test_the_words_elsewhere_are_not_names(text: str) -> None:
    assert uses(text) == []


def test_prepare_knows_where_its_statement_ends() -> None:
    text = b"PREPARE q (int) AS SELECT $1 ; "
    use = scan(text).uses[0]
    assert text[use.end : use.statement_end] == b" (int) AS SELECT $1"
    assert (
        rename(text, [(use.start, use.end, b"pgtarn_s1")])
        == b"PREPARE pgtarn_s1 (int) AS SELECT $1 ; "
    )


@pytest.mark.parametrize(
    "text", ["SELECT 'open", 'SELECT "open', "SELECT $$open", "SELECT /* open"]
)
def test_unterminated_queries_are_reported(text: str) -> None:
    with pytest.raises(Unterminated):
        scan(text.encode())


@given(st.binary(max_size=200))
def test_any_bytes_scan_or_raise_unterminated(data: bytes) -> None:
    try:
        found = scan(data)
    except Unterminated:
        return
    for use in found.uses:
        assert 0 <= use.start < use.end <= len(data)


@given(
    st.lists(
        st.sampled_from(
            [
                "SELECT 1",
                "execute q",
                " EXECUTE q(1)",
                "prepare q as x",
                "Deallocate q",
                "explain execute q",
                "/* c */ execute q",
                "create table t as execute q",
                "select ';'",
            ]
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["", ";", "; "]),
)
def test_the_first_look_never_misses_a_name(statements: list[str], end: str) -> None:
    text = ("; ".join(statements) + end).encode()
    if scan(text).uses:
        assert may_name_statements(text + b"\x00")
        assert may_name_statements(b"Q\x00\x00\x00\x00" + text + b"\x00", 5)


def test_the_first_look_skips_plain_queries() -> None:
    assert not may_name_statements(b"SELECT abalance FROM t WHERE aid = 1;\x00")
    assert not may_name_statements(b"UPDATE t SET v = 'execute';\x00")


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("SELECT 1", True),
        ("\n  delete from t where x = 'execute s'", True),
        ("WITH a AS (SELECT 1) SELECT * FROM a", True),
        ("EXECUTE s", False),
        ("explain execute s", False),
        ("CREATE TABLE t AS EXECUTE s", False),
        ("Prepare s AS SELECT 1", False),
        ("deallocate s", False),
        ("DISCARD ALL", False),
        ("/* c */ EXECUTE s", False),
        ("(SELECT 1)", False),
        ("   ", False),
        ("SELECT", False),  # (the word may go on past what is here)
    ],
)
def test_begins_plainly(text: str, plain: bool) -> None:
    """Only a first word that no statement naming prepared statements begins with, seen
    whole, says the text names none whatever follows."""
    assert begins_plainly(b"s1\x00" + text.encode(), 3) is plain


@pytest.mark.parametrize(
    ("head", "name"),
    [
        ("EXECUTE big('aaaa", b"big"),  # cut inside its literal
        ('execute "Big""One"(1, 2, ', b'Big"One'),
        ("EXECUTE x(E'\\'", b"x"),  # an escaped quote at the head's end
        ("EXECUTE x($q$ ; EXECUTE y", b"x"),  # inside a dollar quote
        ("EXECUTE x(1, /* ; EXECUTE y", b"x"),  # inside a comment
        ("EXECUTE x(1, (2), '", b"x"),
        ("EXPLAIN (COSTS OFF) EXECUTE q('", b"q"),
        ("CREATE TABLE t AS EXECUTE q('", b"q"),
        ("/* c */ EXECUTE q('", b"q"),
    ],
)
def test_scan_head_an_execute_cut_anywhere_after_its_name(head: str, name: bytes) -> None:
    use = scan_head(head.encode())
    assert use is not None and use.kind == EXECUTE and use.name == name
    assert head.encode()[use.start : use.end].replace(b'""', b'"').strip(b'"').lower() == (
        name.lower()
    )


@pytest.mark.parametrize(
    "head",
    [
        "EXECUTE big",  # the name may go on past the head
        "EXECUTE ",
        "EXECU",
        '"EXECUTE big"',
        "EXECUTE a(1); EXECUTE b('",  # a whole statement: maybe a script of them
        "SELECT 1; EXECUTE b('",
        "DEALLOCATE x",
        "DEALLOCATE x /* ",  # (undone when its query fails: held whole)
        "PREPARE x AS SELECT 1; SELECT '",  # a whole statement
        "PREPARE x",  # the name may go on past the head
        "PREPARE TRANSACTION 'x",
        "SELECT 'execute x(', '",  # names none
        "EXPLAIN SELECT '",
        "EXECUTE a('x'); ",
    ],
)
def test_scan_head_anything_else_is_read_whole(head: str) -> None:
    assert scan_head(head.encode()) is None


@pytest.mark.parametrize(
    ("head", "name"),
    [
        ("PREPARE big AS SELECT md5('aaaa", b"big"),
        ('prepare "Big""One"(int, text) AS INSERT INTO t VALUES ($1, \'', b'Big"One'),
        ("PREPARE x (int", b"x"),  # its types cut
        ("/* c */ PREPARE q AS SELECT $x$ ; DEALLOCATE q", b"q"),
    ],
)
def test_scan_head_a_prepare_cut_in_its_statement(head: str, name: bytes) -> None:
    """A PREPARE long for its statement's text: its name read from the head."""
    use = scan_head(head.encode())
    assert use is not None and use.kind == PREPARE and use.name == name


@given(st.text(alphabet="ab ;'$/*-\n(", max_size=30))
def test_scan_head_agrees_with_scan_where_both_read(tail: str) -> None:
    """Any cut of an EXECUTE: scan_head finds the name scan finds in the whole text."""
    text = ("EXECUTE q1(" + tail).encode()
    for cut in range(len("EXECUTE q1") + 1, len(text) + 1):
        use = scan_head(text[:cut])
        if use is not None:
            assert (use.name, use.start, use.end) == (b"q1", 8, 10)


@pytest.mark.parametrize(
    ("head", "none"),
    [
        ("SELECT md5('execute x', '", True),
        ("INSERT INTO t VALUES ('prepare", True),
        ("select 1; /* execute */ select '", True),
        ('select "execute" from t where a = \'', True),
        ("select 1 -- discard all\n, '", True),
        ("EXECUTE x('", False),
        ("select 1; EXEC", False),  # (a first word cut: it may be one)
        ("select 1; execute", False),
        ("SELECT ('x'); discard all; select '", False),
        ("  explain select '", False),
        ("create table t as select '", False),
        ("EXEC", False),
    ],
)
def test_head_names_none(head: str, none: bool) -> None:
    assert head_names_none(head.encode()) is none
