"""Unit tests for auth_file (userlist.txt) parsing, writing and secret classification."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pgtarn.auth.md5 import md5_secret
from pgtarn.auth.scram import make_verifier
from pgtarn.auth.userlist import (
    SecretKind,
    load_userlist,
    parse_userlist,
    secret_kind,
    userlist_line,
)


def test_basic_entries() -> None:
    text = '"alice" "secret"\n"bob" "md5' + "0" * 32 + '"\n'
    entries, warnings = parse_userlist(text)
    assert entries == {"alice": "secret", "bob": "md5" + "0" * 32}
    assert warnings == []


def test_doubled_quotes_are_literal_quotes() -> None:
    entries, warnings = parse_userlist('"we""ird" "pa""ss""word"\n"x" """"\n"e" ""')
    assert entries == {'we"ird': 'pa"ss"word', "x": '"', "e": ""}
    assert warnings == []


def test_userlist_line_reads_back() -> None:
    assert userlist_line('we"ird', "p w") == '"we""ird" "p w"\n'
    entries = {'we"ird': 'pa"ss', "plain": "", "spaced": " a b ", "uni": "p\u00e4ss"}
    text = "".join(userlist_line(user, secret) for user, secret in entries.items())
    assert parse_userlist(text) == (entries, [])


def test_comments_blank_lines_and_whitespace() -> None:
    text = "\n".join(
        [
            "; a comment",
            "# another comment",
            "   ; indented comment",
            "",
            "   \t",
            '\t "alice"\t  "pw with spaces" ',
            '"bob" "pw;#not a comment"\r',
        ]
    )
    entries, warnings = parse_userlist(text)
    assert entries == {"alice": "pw with spaces", "bob": "pw;#not a comment"}
    assert warnings == []


def test_extra_fields_are_ignored() -> None:
    entries, warnings = parse_userlist('"alice" "pw" "extra" 123 whatever\n"bob" "pw2"trailing')
    assert entries == {"alice": "pw", "bob": "pw2"}
    assert warnings == []


@pytest.mark.parametrize(
    "line",
    [
        "alice pw",
        '"alice"',
        '"alice" ',
        '"alice" pw',
        '"alice" "unterminated',
        '"unterminated',
        '"" "pw"',
        '"alice""pw"',
        'x"alice" "pw"',
    ],
)
def test_bad_lines_warn_and_are_skipped(line: str) -> None:
    entries, warnings = parse_userlist(f'"ok" "fine"\n{line}\n"also" "fine"')
    assert entries == {"ok": "fine", "also": "fine"}
    assert len(warnings) == 1
    assert warnings[0].startswith("line 2:")


def test_duplicate_user_later_wins_with_warning() -> None:
    entries, warnings = parse_userlist('"a" "one"\n"a" "two"\n')
    assert entries == {"a": "two"}
    assert len(warnings) == 1 and "line 2" in warnings[0]


def test_unicode_entries() -> None:
    entries, _ = parse_userlist('"üser" "pässwörd"')
    assert entries == {"üser": "pässwörd"}


def test_load_userlist(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "userlist.txt"
    path.write_bytes(b'"alice" "pw"\r\nbroken line\n"bob" "\xff\xfe"\n"carol" "ok"\n')
    with caplog.at_level(logging.WARNING, logger="pgtarn.auth"):
        entries = load_userlist(str(path))
    assert entries == {"alice": "pw", "carol": "ok"}
    messages = [r.getMessage() for r in caplog.records if r.name == "pgtarn.auth"]
    assert len(messages) == 2
    assert "line 2" in messages[0] and str(path) in messages[0]
    assert "line 3" in messages[1] and "UTF-8" in messages[1]


def test_load_userlist_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_userlist(str(tmp_path / "missing.txt"))
    with pytest.raises(OSError):
        load_userlist(str(tmp_path))  # a directory


def test_secret_kind() -> None:
    assert secret_kind("pencil") is SecretKind.PLAIN
    assert secret_kind("") is SecretKind.PLAIN
    assert secret_kind(md5_secret("pencil", "user")) is SecretKind.MD5
    assert secret_kind("md5" + "A" * 32) is SecretKind.MD5
    assert secret_kind("md5" + "0" * 31) is SecretKind.PLAIN
    assert secret_kind(make_verifier("pencil", iterations=1).to_string()) is SecretKind.SCRAM
    assert secret_kind("SCRAM-SHA-256$4096:salt$broken") is SecretKind.PLAIN
