"""The form PostgreSQL reports a tracked parameter in, for a value a client gave at startup.

A client that starts with client_encoding=utf8 is told UTF8 by PostgreSQL; pgtarn welcomes
clients itself, so it must say the same. The rules below are PostgreSQL's for the parameters
whose form follows from the value alone (or from the server's current value, for DateStyle);
a value they do not know is kept as given, and the value a server reports once the client's
SET has run corrects it (client/link.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

#: PostgreSQL's encoding names, by their cleaned spelling (lowercase, letters and digits
#: only), aliases included: what SET client_encoding accepts, and the name it reports.
_ENCODINGS = {
    "abc": "WIN1258",
    "alt": "WIN866",
    "big5": "BIG5",
    "euccn": "EUC_CN",
    "eucjis2004": "EUC_JIS_2004",
    "eucjp": "EUC_JP",
    "euckr": "EUC_KR",
    "euctw": "EUC_TW",
    "gb18030": "GB18030",
    "gbk": "GBK",
    "iso88591": "LATIN1",
    "iso885910": "LATIN6",
    "iso885913": "LATIN7",
    "iso885914": "LATIN8",
    "iso885915": "LATIN9",
    "iso885916": "LATIN10",
    "iso88592": "LATIN2",
    "iso88593": "LATIN3",
    "iso88594": "LATIN4",
    "iso88595": "ISO_8859_5",
    "iso88596": "ISO_8859_6",
    "iso88597": "ISO_8859_7",
    "iso88598": "ISO_8859_8",
    "iso88599": "LATIN5",
    "johab": "JOHAB",
    "koi8": "KOI8R",
    "koi8r": "KOI8R",
    "koi8u": "KOI8U",
    "mskanji": "SJIS",
    "muleinternal": "MULE_INTERNAL",
    "shiftjis": "SJIS",
    "shiftjis2004": "SHIFT_JIS_2004",
    "sjis": "SJIS",
    "sqlascii": "SQL_ASCII",
    "tcvn": "WIN1258",
    "tcvn5712": "WIN1258",
    "uhc": "UHC",
    "unicode": "UTF8",
    "utf8": "UTF8",
    "vscii": "WIN1258",
    "win": "WIN1251",
    "win866": "WIN866",
    "win874": "WIN874",
    "win932": "SJIS",
    "win936": "GBK",
    "win949": "UHC",
    "win950": "BIG5",
    "windows866": "WIN866",
    "windows874": "WIN874",
    "windows932": "SJIS",
    "windows936": "GBK",
    "windows949": "UHC",
    "windows950": "BIG5",
    **{f"latin{n}": f"LATIN{n}" for n in range(1, 11)},
    **{f"win{n}": f"WIN{n}" for n in range(1250, 1259)},
    **{f"windows{n}": f"WIN{n}" for n in range(1250, 1259)},
}

_STYLES = {"iso": "ISO", "sql": "SQL", "german": "German"}
_ORDERS = {
    "ymd": "YMD",
    "dmy": "DMY",
    "mdy": "MDY",
    "euro": "DMY",
    "european": "DMY",
    "us": "MDY",
    "noneuro": "MDY",
    "noneuropean": "MDY",
}
_INTERVAL_STYLES = ("postgres", "postgres_verbose", "sql_standard", "iso_8601")
_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")


def _encoding(value: str, _current: str | None) -> str | None:
    return _ENCODINGS.get(re.sub(r"[^a-z0-9]", "", value.lower()))


def _datestyle(value: str, current: str | None) -> str | None:
    """DateStyle: a style and/or an order, each taken from the current value when not given
    (German alone also means DMY)."""
    style, order = "ISO", "MDY"
    if current and ", " in current:
        style, order = current.split(", ", 1)
    styles = orders = 0
    for token in re.split(r"[\s,]+", value.strip().lower()):
        if not token:
            continue
        if token.startswith("postgres"):
            style, styles = "Postgres", styles + 1
        elif token in _STYLES:
            style, styles = _STYLES[token], styles + 1
            if token == "german" and not orders:
                order = "DMY"
        elif token in _ORDERS:
            order, orders = _ORDERS[token], orders + 1
        elif token == "default":
            style, order = "ISO", "MDY"
        else:
            return None
    if styles > 1 or orders > 1:
        return None  # PostgreSQL refuses conflicting specifications
    return f"{style}, {order}"


def _interval_style(value: str, _current: str | None) -> str | None:
    lowered = value.strip().lower()
    return lowered if lowered in _INTERVAL_STYLES else None


def _on_off(value: str, _current: str | None) -> str | None:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return "on"
    if lowered in _FALSE:
        return "off"
    return None


_RULES: dict[str, Callable[[str, str | None], str | None]] = {
    "client_encoding": _encoding,
    "datestyle": _datestyle,
    "intervalstyle": _interval_style,
    "standard_conforming_strings": _on_off,
}


def has_rule(name: str) -> bool:
    """True when the reported form of name follows from its value (see reported_form)."""
    return name.lower() in _RULES


def reported_form(name: str, value: str, current: Mapping[str, str]) -> str:
    """The value PostgreSQL reports after name is set to value on a server whose parameters
    are current (what it reported last); value itself when no rule knows better."""
    rule = _RULES.get(name.lower())
    if rule is None:
        return value
    reported = rule(value, current.get(name))
    return value if reported is None else reported


#: PgBouncer's refusal of an options parameter it cannot read.
BAD_OPTIONS = (
    "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed"
)


def parse_options(text: str) -> list[tuple[str, str]] | None:
    """The (name, value) pairs of a StartupMessage's options parameter, which holds
    command-line switches as PostgreSQL reads them: `-c name=value` or `--name=value`,
    separated by whitespace, a backslash taking the next character as it is (`\\ ` for a
    space). None when it holds anything else (another switch, a pair without '=').
    A '-' in a name is a '_', as PostgreSQL reads it."""
    pairs: list[tuple[str, str]] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos == end:
            return pairs
        if text.startswith("-c", pos):
            pos += 2
            while pos < end and text[pos].isspace():
                pos += 1
        elif text.startswith("--", pos):
            pos += 2
        else:
            return None
        token: list[str] = []
        while pos < end and not text[pos].isspace():
            if text[pos] == "\\":
                pos += 1
                if pos == end:
                    break
            token.append(text[pos])
            pos += 1
        name, equals, value = "".join(token).partition("=")
        if not equals or not name:
            return None
        pairs.append((name.replace("-", "_"), value))
