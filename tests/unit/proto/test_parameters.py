"""proto/parameters.py: the form PostgreSQL reports a startup value in."""

from __future__ import annotations

import pytest

from pgtarn.proto.parameters import has_rule, parse_options, reported_form

DEFAULTS = {"DateStyle": "ISO, MDY", "TimeZone": "UTC"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("utf8", "UTF8"),
        ("UTF-8", "UTF8"),
        ("unicode", "UTF8"),
        ("latin1", "LATIN1"),
        ("ISO-8859-1", "LATIN1"),
        ("iso_8859_5", "ISO_8859_5"),
        ("Windows-1251", "WIN1251"),
        ("win1252", "WIN1252"),
        ("sql_ascii", "SQL_ASCII"),
        ("euc_jp", "EUC_JP"),
        ("shift_jis", "SJIS"),
        ("no such encoding", "no such encoding"),
    ],
)
def test_client_encoding(value: str, expected: str) -> None:
    assert reported_form("client_encoding", value, DEFAULTS) == expected


@pytest.mark.parametrize(
    ("value", "current", "expected"),
    [
        ("iso, mdy", "ISO, MDY", "ISO, MDY"),
        ("german", "ISO, MDY", "German, DMY"),
        ("german, ymd", "ISO, MDY", "German, YMD"),
        ("ymd, german", "ISO, MDY", "German, YMD"),
        ("sql", "ISO, DMY", "SQL, DMY"),
        ("ymd", "Postgres, MDY", "Postgres, YMD"),
        ("euro", "ISO, MDY", "ISO, DMY"),
        ("US", "SQL, DMY", "SQL, MDY"),
        ("postgres,dmy", "ISO, MDY", "Postgres, DMY"),
        ("default", "SQL, DMY", "ISO, MDY"),
        ("iso, sql", "ISO, MDY", "iso, sql"),
        ("nonsense", "ISO, MDY", "nonsense"),
    ],
)
def test_datestyle_takes_what_is_not_given_from_the_current_value(
    value: str, current: str, expected: str
) -> None:
    assert reported_form("DateStyle", value, {"DateStyle": current}) == expected


def test_other_rules_and_values_kept_as_given() -> None:
    assert reported_form("IntervalStyle", "ISO_8601", DEFAULTS) == "iso_8601"
    assert reported_form("standard_conforming_strings", "yes", DEFAULTS) == "on"
    assert reported_form("standard_conforming_strings", "0", DEFAULTS) == "off"
    assert reported_form("TimeZone", "europe/paris", DEFAULTS) == "europe/paris"
    assert reported_form("application_name", "Mixed Case", DEFAULTS) == "Mixed Case"
    assert has_rule("datestyle") and has_rule("client_encoding")
    assert not has_rule("TimeZone") and not has_rule("application_name")


@pytest.mark.parametrize(
    ("text", "pairs"),
    [
        ("", []),
        ("   ", []),
        ("-c a=1", [("a", "1")]),
        ("-ca=1 --b=2", [("a", "1"), ("b", "2")]),
        ("  -c   datestyle=German,\\ YMD  ", [("datestyle", "German, YMD")]),
        ("-c t\\imezone=\\P\\ortugal", [("timezone", "Portugal")]),
        ("--work-mem=8MB", [("work_mem", "8MB")]),
        ("-c x=a=b", [("x", "a=b")]),
        ("-c x= ", [("x", "")]),
        ("-c x=a\\", [("x", "a")]),
    ],
)
def test_parse_options(text: str, pairs: list[tuple[str, str]]) -> None:
    assert parse_options(text) == pairs


@pytest.mark.parametrize("text", ["-d", "-c timezone", "-c =x", "work_mem=1", "-c a=1 -x", "-"])
def test_parse_options_refuses_other_switches(text: str) -> None:
    assert parse_options(text) is None
