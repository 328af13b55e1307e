"""StreamedText: a text looked at in pieces, erring only towards keeping the server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.session.streamlook import StreamedText


def look(text: bytes, cut: int) -> StreamedText:
    streamed = StreamedText()
    for at in range(0, len(text), cut):
        streamed.feed(text[at : at + cut])
    streamed.finish()
    return streamed


@pytest.mark.parametrize("cut", [1, 3, 7, 64, 100000])
def test_a_set_at_the_end_of_a_long_text(cut: int) -> None:
    text = b"SELECT 'abc';" * 3000 + b"SeT application_name = 'x'"
    assert look(text, cut).changes_state


@pytest.mark.parametrize("cut", [1, 5, 64, 100000])
def test_a_long_literal_of_data(cut: int) -> None:
    text = b"SELECT md5('" + b"0123456789abcdef" * 5000 + b"')"
    streamed = look(text, cut)
    assert not streamed.changes_state and not streamed.schema_change


@pytest.mark.parametrize(
    "text",
    [
        b"SELECT pg_advisory_lock(1), '" + b"x" * 5000 + b"'",
        b"SELECT '" + b"x" * 5000 + b"'; CREATE TEMP TABLE t (a int)",
        b"SELECT '" + b"x" * 5000 + b"'; COMMIT",
        b"SELECT '" + b"x" * 5000 + b"'; EXECUTE s",
        b"SELECT set_config('a.b', '" + b"x" * 5000 + b"', false)",
    ],
)
def test_words_of_state_anywhere(text: bytes) -> None:
    assert look(text, 100).changes_state


def test_schema_words() -> None:
    assert look(b"SELECT '" + b"x" * 5000 + b"'; ALTER TABLE t ADD b int", 64).schema_change
    assert not look(b"SELECT '" + b"x" * 5000 + b"'; SELECT altered", 64).schema_change


def test_words_inside_other_words_do_not_count() -> None:
    streamed = look(b"SELECT offset_x, settings, dataset, ended FROM t_set1", 4)
    assert not streamed.changes_state


@pytest.mark.parametrize("cut", [1, 2, 5, 100])
def test_a_word_that_ends_the_text(cut: int) -> None:
    assert look(b"SELECT 1; COMMIT", cut).changes_state
    assert look(b"SELECT 1; drop", cut).schema_change


@pytest.mark.parametrize("cut", [1, 3, 64, 100000])
def test_a_rewritten_heads_names_do_not_count_the_rests_do(cut: int) -> None:
    """names=False for a head whose statement names pgtarn rewrote: EXECUTE there is no
    reason to pin; after it (a word cut at the head's end too) it is."""
    head = b"EXECUTE q('x', '" + b"y" * 100
    streamed = StreamedText()
    streamed.feed(head, False)
    assert not streamed.changes_state
    rest = b"y" * 5000 + b"')"
    for at in range(0, len(rest), cut):
        streamed.feed(rest[at : at + cut])
    streamed.finish()
    assert not streamed.changes_state
    for tail_of_head, rest in [
        (b"x'); EXECU", b"TE q('z')"),
        (b"x', '", b"'); EXECUTE q('z')"),
        (b"x'); ", b"deallocate q"),
        (b"x'); SE", b"T a = 1"),  # (a word of state: it counts in the head too)
    ]:
        streamed = StreamedText()
        streamed.feed(b"EXECUTE q('" + tail_of_head, False)
        for at in range(0, len(rest), cut):
            streamed.feed(rest[at : at + cut])
        streamed.finish()
        assert streamed.changes_state, (tail_of_head, rest)


#: (text, changes state, changes the schema): each read with blanks around it, so that
#: the look decides inside pieces, not only at the end.
LEXED = [
    (b"SELECT md5('a SET b = 1; COMMIT; DROP TABLE t')", False, False),
    (b"SELECT 'it''s SET x', 'y'", False, False),
    (b"SELECT E'it\\'s SET x', E'\\\\', 'z'", False, False),
    (b"SELECT $q$ SET x; $Q$ $q$, $$ drop $$", False, False),
    (b"SELECT 1 -- SET x\n, 2", False, False),
    (b"SELECT /* SET /* nested */ drop */ 1", False, False),
    (b"SELECT \"it's\" FROM t WHERE a = ' SET '", False, False),
    (b"SELECT $1, a$b, x$$y FROM t", False, False),
    (b"SELECT 'x'; SET a = 1", True, False),
    (b"SELECT 'x''; SET a = 1 --'", False, False),
    (b"SELECT 'x', 1; ALTER TABLE t ADD b int", False, True),
    (b"SELECT \"set_config\"('a', 'b', false)", True, False),
    (b'SELECT pg_catalog."pg_advisory_lock"(1)', True, False),
    (b"DO $$ BEGIN PERFORM set_config('a', 'b', false); END $$", True, False),
    (b"do 'BEGIN EXECUTE ''SET a = 1''; END'", True, False),
    (b"SELECT 'abc\\'; SET x = 1; --'", True, False),  # (standard_conforming_strings off)
    (b"SELECT e'\\\\'; SET x = 1", True, False),
    (b"SELECT $a$ x $a$; commit", True, False),
    (b"SELECT 1 --c\nSET x = 1", True, False),
    (b"SELECT /* c */ 1; create temp table t ()", True, True),
    # a tag longer than LOOKAHEAD: where a piece ends inside it every word counts after it
    (b"SELECT $" + b"t" * 100 + b"$ x $" + b"t" * 100 + b"$; SET a = 1", True, False),
    (b"SELECT 1 AS settings, 2 AS offset_set, 3 AS dataset", False, False),
    (b"SELECT 'x'; SET", True, False),
]


def lexed(text: bytes, cuts: list[int]) -> tuple[bool, bool]:
    streamed = StreamedText()
    previous = 0
    for cut in [*cuts, len(text)]:
        streamed.feed(text[previous:cut])
        previous = cut
    streamed.finish()
    return streamed.changes_state, streamed.schema_change


@pytest.mark.parametrize(("core", "state", "schema"), LEXED)
def test_literals_and_comments_are_skipped_cut_anywhere(
    core: bytes, state: bool, schema: bool
) -> None:
    """The same text split in two at every offset, and in pieces of 1 to 5 bytes: the same
    answer (a piece may end inside any token), the one the text holds."""
    text = b" " * 100 + core + b" " * 100
    assert lexed(text, []) == (state, schema)
    for cut in range(len(text) + 1):
        assert lexed(text, [cut]) == (state, schema), cut
    for size in range(1, 6):
        assert lexed(text, list(range(size, len(text), size))) == (state, schema), size


def test_a_ten_mb_literal_holding_words_of_state_does_not_pin() -> None:
    text = b"INSERT INTO t VALUES ('" + b"SET x = 1; DISCARD ALL; " * 450_000 + b"')"
    streamed = StreamedText()
    for at in range(0, len(text), 65536):
        streamed.feed(text[at : at + 65536])
    streamed.finish()
    assert not streamed.changes_state and not streamed.schema_change


@settings(max_examples=300)
@given(
    st.lists(
        st.sampled_from(
            [
                "'",
                '"',
                "$",
                "$q$",
                "--",
                "/*",
                "*/",
                "\\",
                "\n",
                " ",
                ";",
                "e",
                "E'",
                "set ",
                "do ",
                "drop ",
                "x",
                "1",
            ]
        ),
        max_size=60,
    ),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_where_pieces_end_never_changes_the_answer(tokens: list[str], cuts: list[int]) -> None:
    text = b" " * 90 + "".join(tokens).encode() + b" " * 90
    assert lexed(text, sorted(set(cut % (len(text) + 1) for cut in cuts))) == lexed(text, [])


@pytest.mark.parametrize("cut", [1, 3, 64, 100000])
def test_words_naming_statements(cut: int) -> None:
    """names_statements: a statement naming prepared statements, or DISCARD, may be there
    (outside literals and comments); SET and the like are not such words."""
    data = b"SELECT md5('" + b"x" * 5000 + b"')"
    assert not look(data + b" /* execute */; SELECT 'prepare'", cut).names_statements
    assert not look(data + b"; SET a = 1", cut).names_statements
    for tail in (b"; EXECUTE q", b"; Deallocate q", b"; prepare q AS SELECT 1", b"; discard all"):
        assert look(data + tail, cut).names_statements, tail


def test_a_rewritten_heads_names_do_not_name_statements() -> None:
    """names=False for the head: its EXECUTE names no statement past what was rewritten,
    one after it does (DISCARD counts in the head too)."""
    for rest, names in [(b"y')", False), (b"y'); EXECUTE q", True)]:
        streamed = StreamedText()
        streamed.feed(b"EXECUTE q('x', '" + b"y" * 100, False)
        streamed.feed(rest)
        streamed.finish()
        assert streamed.names_statements is names
    streamed = StreamedText()
    streamed.feed(b"DISCARD ALL; SELECT '" + b"y" * 100, False)
    streamed.finish()
    assert streamed.names_statements
