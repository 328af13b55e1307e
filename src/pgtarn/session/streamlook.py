"""A look at a text too long to hold (a streamed Query or Parse), chunk by chunk.

The relay parses a text that may change session state (effects.first_look says which);
a text longer than client_message_buffer is never held whole, so it cannot be parsed. This
look reads it in the pieces it is passed on in and keeps only a few bytes across them: it
answers whether the text holds any word a statement that changes session state (or
controls a transaction, or names a prepared statement) must hold, and any word of a schema
change. A text that holds one is taken as changing state in a way that is not followed: its
client keeps its server, which is closed when the client leaves (UNTRACKED). It also tells
whether a statement naming prepared statements may be there (names_statements: its
client's statements are then ceded to its server, client/large.py).

A small lexer skips what runs nothing: string literals ('' and E'' escapes), dollar-quoted
strings and comments (-- and nested /* */), so that a long literal of data holding "SET"
keeps pooling. Quoted identifiers are lexed (a quote inside one opens nothing) but their
words count ("set_config"(...) is a call). Where the skip could be wrong it stops for the
rest of the text and every word counts, as before: after the word DO (a DO block's body is
a literal that runs), after \\' in a plain literal (with standard_conforming_strings off it
does not end the literal), and at a dollar quote's tag too long to read. Every decision is
made with LOOKAHEAD bytes of the text after it in hand (they wait for the next piece), so a
piece may end anywhere, inside a word, a quote's '' or a tag. The answer errs only towards
keeping the server. Sans-IO; it runs for long messages only.
"""

from __future__ import annotations

import re
from typing import Final

#: What every text that may change session state holds: one of the first look's starts or
#: transaction controls (effects._STARTS, _CONTROLS, with the SQL-level statement words) as
#: a whole word, or one of its words (effects._WORDS) anywhere; in any case.
_STATE: Final = (
    rb"(?<![a-z0-9_$])(?:set|reset|discard|load|declare|close|listen|unlisten|create|drop|"
    rb"begin|start|commit|end|rollback|abort|savepoint|release|prepare|execute|deallocate)"
    rb"(?![a-z0-9_$])|advisory|set_config|setseed|temp"
)
#: Words a schema change holds (effects._SCHEMA's).
_SCHEMA: Final = rb"(?<![a-z0-9_$])(?:create|alter|drop|comment|import|security)(?![a-z0-9_$])"
_STATE_WORDS: Final = re.compile(_STATE)
_SCHEMA_WORDS: Final = re.compile(_SCHEMA)
#: The words of statements naming prepared statements: they do not count in a head whose
#: names pgtarn rewrote (client/large.py).
_NAMING: Final = frozenset((b"prepare", b"execute", b"deallocate"))
#: Those words, and DISCARD (which may drop every statement), as whole words.
_NAMING_WORDS: Final = re.compile(
    rb"(?<![a-z0-9_$])(?:" + b"|".join(sorted(_NAMING | {b"discard"})) + rb")(?![a-z0-9_$])"
)
#: A DO block: its body, a literal, runs.
_DO: Final = re.compile(rb"(?<![a-z0-9_$\x80-\xff])do(?![a-z0-9_$\x80-\xff])")
#: Outside literals and comments, what begins one (or a quoted identifier). A $ after a
#: word's byte goes on with the word; a tag that reaches the end of the text is too long
#: to read (LOOKAHEAD is longer than any other).
_EVENT: Final = re.compile(
    rb"['\"]|--|/\*|(?<![a-z0-9_$\x80-\xff])\$(?:[a-z_\x80-\xff][a-z0-9_\x80-\xff]*)?(?:\$|\Z)"
)
_ESCAPED: Final = re.compile(rb"['\\]")
_WORD_CHARS: Final = b"abcdefghijklmnopqrstuvwxyz0123456789_$"
_COMMENT_TURN: Final = re.compile(rb"/\*|\*/")
#: Bytes of text kept unread at the end of each piece, until the next comes: enough for
#: any word above with the byte after it, a quote's '' or \\', a comment's start or end,
#: and a dollar quote's tag.
LOOKAHEAD: Final = 80
#: Bytes kept before the first unread one: the bytes before a word or a quote.
_CONTEXT: Final = 2
#: Longer than any word above, with the byte after it.
_WORD_MAX: Final = 16

# Lexer states.
_PLAIN: Final = 0  # outside literals and comments
_QUOTED: Final = 1  # in a '' literal
_ESCAPES: Final = 2  # in an E'' literal (backslash escapes)
_IDENT: Final = 3  # in a "quoted identifier"
_LINE: Final = 4  # in a -- comment
_BLOCK: Final = 5  # in a /* */ comment (nested: depth)
_DOLLAR: Final = 6  # in a $tag$ quoted string
_ANYWHERE: Final = 7  # no more skipping: every word counts


class StreamedText:
    """Whether a text fed in pieces may change session state or the schema (conservative:
    see the module docstring)."""

    __slots__ = (
        "_depth",
        "_names_until",
        "_pos",
        "_state",
        "_tag",
        "_text",
        "changes_state",
        "names_statements",
        "schema_change",
    )

    def __init__(self) -> None:
        #: The bytes kept: _CONTEXT read ones, then those not read yet (from _pos).
        self._text = b""
        self._pos = 0
        self._state = _PLAIN
        self._depth = 0
        self._tag = b""
        #: Statement-naming words starting before this offset of _text do not count.
        self._names_until = 0
        #: Some piece held a word of a statement that may change session state.
        self.changes_state = False
        #: Some piece held a word of a schema change.
        self.schema_change = False
        #: Some piece held a word of a statement naming prepared statements (or DISCARD,
        #: which may drop them all), where names count.
        self.names_statements = False

    def feed(self, piece: bytes, names: bool = True) -> None:
        """Look at the next piece of the text. names False: the words of statements naming
        prepared statements do not count in this piece (their names were rewritten), only
        in later ones."""
        if self.changes_state and self.schema_change and self.names_statements:
            return  # (nothing more to learn)
        text = self._text + piece.lower()
        if not names:  # (a word cut at the piece's end counts: its name is not here)
            self._names_until = len(text.rstrip(_WORD_CHARS))
        self._read(text, len(text) - LOOKAHEAD)

    def finish(self) -> None:
        """The text is over: what was kept is read to its end."""
        if not (self.changes_state and self.schema_change and self.names_statements):
            self._read(self._text, len(self._text))

    def _read(self, text: bytes, limit: int) -> None:
        """Read text from _pos, deciding only at offsets before limit (the bytes from there
        are kept for the next piece, unless limit is the text's end)."""
        pos = self._pos
        state = self._state
        while pos < limit:
            if state == _PLAIN:
                match = _EVENT.search(text, pos)
                at = limit if match is None or match.start() >= limit else match.start()
                self._words(text, pos, at)
                do = _DO.search(text, pos, at + 3)
                if do is not None and do.start() < at:
                    state = _ANYWHERE  # (a DO block's body runs: read it all)
                    pos = at
                    continue
                if match is None or at == limit:
                    pos = limit
                    break
                event = match.group(0)
                first = event[0]
                if first == 0x27:  # '
                    escapes = at >= 1 and text[at - 1] == 0x65 and (
                        at < 2 or text[at - 2 : at - 1] not in _WORD_BYTES
                    )  # fmt: skip
                    state = _ESCAPES if escapes else _QUOTED
                    pos = at + 1
                elif first == 0x22:  # "
                    state = _IDENT
                    pos = at + 1
                elif first == 0x2D:  # --
                    state = _LINE
                    pos = at + 2
                elif first == 0x2F:  # /*
                    state = _BLOCK
                    self._depth = 1
                    pos = at + 2
                elif event.endswith(b"$") and 1 < len(event) < LOOKAHEAD:
                    state = _DOLLAR
                    self._tag = event
                    pos = at + len(event)
                else:  # a tag too long to read (or find): nothing more is skipped
                    state = _ANYWHERE
                    pos = at
            elif state == _QUOTED:
                end = text.find(b"'", pos, limit)
                if end < 0:
                    pos = limit
                elif text[end - 1] == 0x5C:  # \' : with standard_conforming_strings off,
                    state = _ANYWHERE  # it does not end the literal: read on as if not
                    pos = end
                elif text[end + 1 : end + 2] == b"'":
                    pos = end + 2  # ('' in a literal)
                else:
                    state = _PLAIN
                    pos = end + 1
            elif state == _ESCAPES:
                match = _ESCAPED.search(text, pos, limit)
                at = -1 if match is None else match.start()
                if at < 0:
                    pos = limit
                elif text[at] == 0x5C or text[at + 1 : at + 2] == b"'":
                    pos = at + 2  # (an escaped byte, or '')
                else:
                    state = _PLAIN
                    pos = at + 1
            elif state == _IDENT:
                end = text.find(b'"', pos, limit)
                at = limit if end < 0 else end
                self._words(text, pos, at)  # ("set_config"(...) runs it)
                if end < 0:
                    pos = limit
                elif text[end + 1 : end + 2] == b'"':
                    pos = end + 2
                else:
                    state = _PLAIN
                    pos = end + 1
            elif state == _LINE:
                end = text.find(b"\n", pos, limit)
                if end < 0:
                    pos = limit
                else:
                    state = _PLAIN
                    pos = end + 1
            elif state == _BLOCK:
                match = _COMMENT_TURN.search(text, pos, limit + 1)
                if match is None or match.start() >= limit:
                    pos = limit
                else:
                    pos = match.end()
                    self._depth += 1 if match.group(0) == b"/*" else -1
                    if self._depth == 0:
                        state = _PLAIN
            elif state == _DOLLAR:
                end = text.find(self._tag, pos)
                if end < 0 or end >= limit:
                    pos = limit  # (a tag is shorter than LOOKAHEAD: one before it is here)
                else:
                    state = _PLAIN
                    pos = end + len(self._tag)
            else:  # _ANYWHERE
                self._words(text, pos, limit)
                pos = limit
            if self.changes_state and self.schema_change and self.names_statements:
                break
        self._state = state
        cut = max(min(pos, len(text)) - _CONTEXT, 0)
        self._text = text[cut:]
        self._pos = min(pos, len(text)) - cut
        self._names_until = max(self._names_until - cut, 0)

    def _words(self, text: bytes, start: int, end: int) -> None:
        """Look for the words in text[start:end] (a word that begins there may end after)."""
        if start >= end:
            return
        stop = end + _WORD_MAX  # (a word that begins before end, and the byte after it)
        if not self.changes_state:
            match = _STATE_WORDS.search(text, start, stop)
            while match is not None and match.start() < end:
                if match.start() >= self._names_until or match.group(0) not in _NAMING:
                    self.changes_state = True
                    break
                match = _STATE_WORDS.search(text, match.end(), stop)
        if not self.names_statements:
            match = _NAMING_WORDS.search(text, start, stop)
            while match is not None and match.start() < end:
                if match.start() >= self._names_until or match.group(0) == b"discard":
                    self.names_statements = True
                    break
                match = _NAMING_WORDS.search(text, match.end(), stop)
        if not self.schema_change:
            match = _SCHEMA_WORDS.search(text, start, stop)
            if match is not None and match.start() < end:
                self.schema_change = True


#: The bytes a word goes on with (an E before a quote after one is no E'' prefix).
_WORD_BYTES: Final = frozenset(bytes((c,)) for c in _WORD_CHARS + bytes(range(0x80, 0x100)))
