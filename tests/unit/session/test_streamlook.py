"""StreamedText: a text looked at in pieces, erring only towards keeping the server."""

from __future__ import annotations

import pytest

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
