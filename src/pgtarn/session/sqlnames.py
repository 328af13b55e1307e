"""Find the prepared-statement names of SQL-level PREPARE, EXECUTE and DEALLOCATE in a query.

A small lexer, enough to tell names from the same words inside string literals, quoted
identifiers, dollar-quoted bodies and comments. It knows where PostgreSQL's grammar puts a
prepared statement's name: ``PREPARE name [(types)] AS ...``, ``EXECUTE name``,
``EXPLAIN [options] EXECUTE name``, ``CREATE ... AS EXECUTE name`` and
``DEALLOCATE [PREPARE] name | ALL``. Stdlib only, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


def may_name_statements(data: bytes, start: int = 0) -> bool:
    """A cheap first look, on every query (its text from start): False when it cannot name a
    prepared statement, so needs no scan.

    Names are only where a statement begins with PREPARE, EXECUTE, DEALLOCATE, EXPLAIN or
    CREATE: a single statement starting with another letter is done with one byte test and
    one search for a ';' that is not trailing.
    """
    if start >= len(data):
        return False
    # A ';' before the last byte (the query's NUL) means a second statement may follow.
    if data[start] in _MAY_START or data.find(b";", start, len(data) - 2) >= 0:
        return has_statement_words(data)
    return False


def begins_plainly(data: bytes, start: int) -> bool:
    """Whether the text from start begins, after blanks, with a word that no statement
    naming a prepared statement begins with (PREPARE, EXECUTE, DEALLOCATE, EXPLAIN, CREATE,
    DISCARD), the whole word in data: then a single statement names none, whatever follows
    (for a text whose rest is not here). A comment or parenthesis first: False."""
    text = data[start:].lstrip(b" \t\r\n\f\v")
    match = _FIRST_WORD.match(text)
    return match is not None and match.group(1).lower() not in _NAMING_WORDS


_FIRST_WORD: Final = re.compile(rb"([A-Za-z_]+)[^A-Za-z0-9_$]")
_NAMING_WORDS: Final = frozenset(
    (b"prepare", b"execute", b"deallocate", b"explain", b"create", b"discard")
)


def has_statement_words(data: bytes) -> bool:
    """Whether data holds PREPARE, EXECUTE, DEALLOCATE or DISCARD in any case (DISCARD ALL
    drops every prepared statement, pgtarn's own too: the framer must see it)."""
    low = data.lower()
    return b"execute" in low or b"prepare" in low or b"deallocate" in low or b"discard" in low


_MAY_START: Final = frozenset(b"PpEeDdCc \t\r\n\f\v-/(")

PREPARE: Final = 1
EXECUTE: Final = 2
DEALLOCATE: Final = 3

_IDENT: Final = 1  # unquoted identifier or key word
_QIDENT: Final = 2  # "quoted identifier"
_SEMI: Final = 3
_LPAREN: Final = 4
_RPAREN: Final = 5
_OTHER: Final = 6  # literals, numbers, operators, parameters

_IDENT_START = re.compile(rb"[A-Za-z_\x80-\xff]")
_IDENT_REST = re.compile(rb"[A-Za-z0-9_$\x80-\xff]*")
_DOLLAR_TAG = re.compile(rb"\$([A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*)?\$")
_EXPLAIN_OPTIONS = frozenset((b"analyze", b"analyse", b"verbose"))


class Unterminated(ValueError):
    """The query ends inside a literal, quoted identifier or comment."""


@dataclass(frozen=True)
class NameUse:
    """One prepared-statement name in a query."""

    kind: int  # PREPARE, EXECUTE or DEALLOCATE
    name: bytes  # as PostgreSQL knows it: unquoted names folded to lower case
    start: int  # where the name's token is in the text
    end: int
    statement_end: int  # PREPARE: where its statement ends (before any ';')


@dataclass(frozen=True)
class Scan:
    uses: list[NameUse]
    statements: int  # how many statements the query holds


Token = tuple[int, int, int]  # kind, start, end


def tokens(text: bytes, partial: bool = False) -> list[Token]:
    """The tokens of a query, comments and white space left out. partial: text is the start
    of a longer query, and a literal, quoted identifier or comment left open at its end is
    its last token (to the end of text), not an error."""
    out: list[Token] = []
    pos = 0
    n = len(text)
    while pos < n:
        c = text[pos]
        if c in b" \t\r\n\f\v":
            pos += 1
        elif c == 0x2D and text.startswith(b"--", pos):  # -- comment
            end = text.find(b"\n", pos)
            pos = n if end < 0 else end + 1
        elif c == 0x2F and text.startswith(b"/*", pos):  # /* nested comment */
            end = _skip_block_comment(text, pos)
            if end < 0:
                if partial:
                    break
                raise Unterminated("unterminated /* comment")
            pos = end
        elif c == 0x27:  # 'string'
            escapes = (
                bool(out)
                and out[-1][0] == _IDENT
                and out[-1][2] == pos
                and text[out[-1][1] : pos] in (b"E", b"e")
            )
            end = _skip_string(text, pos, escapes)
            if end < 0:
                if partial:
                    out.append((_OTHER, pos, n))
                    break
                raise Unterminated("unterminated quoted string")
            out.append((_OTHER, pos, end))
            pos = end
        elif c == 0x22:  # "quoted identifier"
            end = _skip_quoted(text, pos)
            if end < 0:
                if partial:
                    out.append((_QIDENT, pos, n))
                    break
                raise Unterminated("unterminated quoted identifier")
            out.append((_QIDENT, pos, end))
            pos = end
        elif c == 0x24:  # $n parameter or $tag$ dollar quote
            match = _DOLLAR_TAG.match(text, pos)
            if match is None:
                end = pos + 1
                while end < n and text[end] in b"0123456789":
                    end += 1
                out.append((_OTHER, pos, end))
                pos = end
                continue
            tag = match.group(0)
            close = text.find(tag, match.end())
            if close < 0:
                if partial:
                    out.append((_OTHER, pos, n))
                    break
                raise Unterminated("unterminated dollar-quoted string")
            out.append((_OTHER, pos, close + len(tag)))
            pos = close + len(tag)
        elif _IDENT_START.match(text, pos):
            end = _IDENT_REST.match(text, pos + 1).end()  # type: ignore[union-attr]
            out.append((_IDENT, pos, end))
            pos = end
        elif c == 0x3B:
            out.append((_SEMI, pos, pos + 1))
            pos += 1
        elif c == 0x28:
            out.append((_LPAREN, pos, pos + 1))
            pos += 1
        elif c == 0x29:
            out.append((_RPAREN, pos, pos + 1))
            pos += 1
        else:
            out.append((_OTHER, pos, pos + 1))
            pos += 1
    return out


def _skip_block_comment(text: bytes, pos: int) -> int:
    depth = 0
    n = len(text)
    while pos < n:
        if text.startswith(b"/*", pos):
            depth += 1
            pos += 2
        elif text.startswith(b"*/", pos):
            depth -= 1
            pos += 2
            if depth == 0:
                return pos
        else:
            pos += 1
    return -1


def _skip_string(text: bytes, pos: int, escapes: bool) -> int:
    pos += 1
    n = len(text)
    while pos < n:
        c = text[pos]
        if escapes and c == 0x5C:
            pos += 2
        elif c == 0x27:
            if text.startswith(b"''", pos):
                pos += 2
            else:
                return pos + 1
        else:
            pos += 1
    return -1


def _skip_quoted(text: bytes, pos: int) -> int:
    pos += 1
    while True:
        end = text.find(b'"', pos)
        if end < 0:
            return -1
        if text.startswith(b'""', end):
            pos = end + 2
            continue
        return end + 1


def _word(text: bytes, token: Token) -> bytes:
    """An unquoted token in lower case (b'' for anything else)."""
    kind, start, end = token
    return text[start:end].lower() if kind == _IDENT else b""


def _name(text: bytes, token: Token) -> bytes | None:
    """A name as PostgreSQL knows it, or None if the token is not one."""
    kind, start, end = token
    if kind == _IDENT:
        # PostgreSQL folds only ASCII letters (the multibyte encodings leave the rest).
        return text[start:end].translate(_ASCII_LOWER)
    if kind == _QIDENT:
        if end - start < 3:
            return None  # "" is not a name
        return text[start + 1 : end - 1].replace(b'""', b'"')
    return None


_ASCII_LOWER = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")


def scan(text: bytes) -> Scan:
    """Every prepared-statement name a query defines, runs or drops.

    Raises Unterminated for a query PostgreSQL would refuse anyway.
    """
    found = tokens(text)
    uses: list[NameUse] = []
    statements = 0
    begin = 0
    depth = 0
    for i, token in enumerate([*found, (_SEMI, len(text), len(text))]):
        kind = token[0]
        if kind == _LPAREN:
            depth += 1
        elif kind == _RPAREN:
            depth = max(0, depth - 1)
        elif kind == _SEMI and depth == 0:
            statement = found[begin:i]
            begin = i + 1
            if statement:
                statements += 1
                _statement(text, statement, uses)
    return Scan(uses, statements)


def scan_head(head: bytes) -> NameUse | None:
    """The statement name an EXECUTE runs or a PREPARE defines, read from the head of a
    query too long to hold (its first bytes, the rest to follow unread), or None when the
    head is not the start of one EXECUTE (or EXPLAIN ... EXECUTE, CREATE ... AS EXECUTE)
    or PREPARE with its whole name.

    A query that is one such statement is long for its arguments or its statement's text,
    and its name can be read (an EXECUTE's rewritten) in the head alone. Any other head
    that may name statements is read whole (client/large.py): a DEALLOCATE's outcome is
    undone when its query fails, which a query not held cannot be known to be alone in,
    and a head that holds a whole statement may be the start of a script that names
    statements all along. A token that reaches the head's end may go on past it: it is
    not read.
    """
    found = tokens(head, True)
    if found and found[-1][2] >= len(head):
        found.pop()  # (it may go on past the head)
    depth = 0
    for kind, _start, _end in found:
        if kind == _LPAREN:
            depth += 1
        elif kind == _RPAREN:
            depth = max(0, depth - 1)
        elif kind == _SEMI and depth == 0:
            return None
    uses: list[NameUse] = []
    if found:
        _statement(head, found, uses)
    if len(uses) != 1 or uses[0].kind == DEALLOCATE:
        return None
    return uses[0]


def head_names_none(head: bytes) -> bool:
    """Whether the head of a query too long to hold (its first bytes) names no prepared
    statement, nor drops them all: no statement there begins with PREPARE, EXECUTE,
    DEALLOCATE, EXPLAIN, CREATE or DISCARD, nor with a word cut by the head's end. Those
    words inside literals, quoted identifiers and comments name nothing (a long text of
    data that holds them need not be read whole); a name past the head is not seen here
    (its client is treated conservatively: client/large.py)."""
    found = tokens(head, True)
    if found and found[-1][2] >= len(head):
        cut = found.pop()
        if cut[0] == _IDENT and (not found or found[-1][0] == _SEMI):
            return False  # (a statement's first word, cut: it may be one of them)
    starts = True  # the next token begins a statement
    depth = 0
    for token in found:
        kind = token[0]
        if starts and _word(head, token) in _NAMING_WORDS:
            return False
        starts = False
        if kind == _LPAREN:
            depth += 1
        elif kind == _RPAREN:
            depth = max(0, depth - 1)
        elif kind == _SEMI and depth == 0:
            starts = True
    return True


def _statement(text: bytes, statement: list[Token], uses: list[NameUse]) -> None:
    """Add the names one statement uses (DEALLOCATE ALL is FORGETS_ALL's, not a name)."""
    first = _word(text, statement[0])
    if first == b"prepare" and len(statement) >= 3:
        name = _name(text, statement[1])
        follows = statement[2]
        if (
            name is not None
            and _word(text, statement[1]) != b"transaction"
            and (follows[0] == _LPAREN or _word(text, follows) == b"as")
        ):
            uses.append(NameUse(PREPARE, name, statement[1][1], statement[1][2], statement[-1][2]))
    elif first == b"deallocate" and len(statement) >= 2:
        at = 2 if _word(text, statement[1]) == b"prepare" and len(statement) >= 3 else 1
        if _word(text, statement[at]) != b"all":
            _use(text, DEALLOCATE, statement, at, uses)
    elif first == b"execute":
        _use(text, EXECUTE, statement, 1, uses)
    elif first == b"explain":
        at = 1
        if at < len(statement) and statement[at][0] == _LPAREN:
            depth = 0
            for j in range(at, len(statement)):
                if statement[j][0] == _LPAREN:
                    depth += 1
                elif statement[j][0] == _RPAREN:
                    depth -= 1
                    if depth == 0:
                        at = j + 1
                        break
        while at < len(statement) and _word(text, statement[at]) in _EXPLAIN_OPTIONS:
            at += 1
        if at < len(statement) and _word(text, statement[at]) == b"execute":
            _use(text, EXECUTE, statement, at + 1, uses)
    elif first == b"create":
        depth = 0
        for j, token in enumerate(statement[:-2]):
            if token[0] == _LPAREN:
                depth += 1
            elif token[0] == _RPAREN:
                depth -= 1
            elif (
                depth == 0
                and _word(text, token) == b"as"
                and _word(text, statement[j + 1]) == b"execute"
            ):
                _use(text, EXECUTE, statement, j + 2, uses)
                break


def _use(text: bytes, kind: int, statement: list[Token], at: int, uses: list[NameUse]) -> None:
    if at < len(statement):
        name = _name(text, statement[at])
        if name is not None:
            token = statement[at]
            uses.append(NameUse(kind, name, token[1], token[2], statement[-1][2]))


def rename(text: bytes, renames: list[tuple[int, int, bytes]]) -> bytes:
    """text with each (start, end) span replaced, spans in increasing order."""
    out = bytearray()
    pos = 0
    for start, end, new in renames:
        out += text[pos:start]
        out += new
        pos = end
    out += text[pos:]
    return bytes(out)
