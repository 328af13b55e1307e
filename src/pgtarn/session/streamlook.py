"""A look at a text too long to hold (a streamed Query or Parse), chunk by chunk.

The relay parses a text that may change session state (effects.first_look says which);
a text longer than client_message_buffer is never held whole, so it cannot be parsed. This
look reads it in the pieces it is passed on in and keeps only a few bytes across them: it
answers whether the text holds any word a statement that changes session state (or
controls a transaction, or names a prepared statement) must hold, and any word of a schema
change. A text that holds one is taken as changing state in a way that is not followed: its
client keeps its server, which is closed when the client leaves (UNTRACKED). Words inside
string literals count too: the answer errs only towards keeping the server.
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
    rb"%s|advisory|set_config|setseed|temp"
)
#: Words a schema change holds (effects._SCHEMA's).
_SCHEMA: Final = rb"(?<![a-z0-9_$])(?:create|alter|drop|comment|import|security)%s"
#: A whole word is one followed by a byte that cannot go on with it; in the middle of the
#: text that byte must have come (a word at a piece's end may go on in the next piece),
#: at its end none need come.
_GOES_ON: Final = rb"(?=[^a-z0-9_$])"
_ENDS: Final = rb"(?![a-z0-9_$])"
_STATE_WORDS: Final = re.compile(_STATE % _GOES_ON)
#: The same without the words of statements naming prepared statements: for a head whose
#: names pgtarn rewrote (client/large.py).
_STATE_WORDS_UNNAMED: Final = re.compile(
    (_STATE % _GOES_ON).replace(b"|prepare|execute|deallocate)", b")")
)
#: The end of a piece that may be the start of a word going on in the next (with the byte
#: before it, for its boundary).
_WORD_START: Final = re.compile(rb"[^a-z0-9_$]?[a-z0-9_$]{0,15}\Z")
_SCHEMA_WORDS: Final = re.compile(_SCHEMA % _GOES_ON)
_STATE_WORDS_AT_END: Final = re.compile(_STATE % _ENDS)
_SCHEMA_WORDS_AT_END: Final = re.compile(_SCHEMA % _ENDS)
#: Bytes kept from one piece to the next: longer than any word above, so that a word cut
#: between two pieces is still found (with the byte before it, for its boundary).
_OVERLAP: Final = 16


class StreamedText:
    """Whether a text fed in pieces may change session state or the schema (conservative:
    see the module docstring)."""

    __slots__ = ("_tail", "changes_state", "schema_change")

    def __init__(self) -> None:
        self._tail = b""
        #: Some piece held a word of a statement that may change session state.
        self.changes_state = False
        #: Some piece held a word of a schema change.
        self.schema_change = False

    def feed(self, piece: bytes, names: bool = True) -> None:
        """Look at the next piece of the text. names False: the words of statements naming
        prepared statements do not count in this piece (their names were rewritten), only
        in later ones (a word cut at its end counts whole)."""
        if self.changes_state and self.schema_change:
            return  # (nothing more to learn)
        text = self._tail + piece.lower()
        words = _STATE_WORDS if names else _STATE_WORDS_UNNAMED
        if not self.changes_state and words.search(text) is not None:
            self.changes_state = True
        if not self.schema_change and _SCHEMA_WORDS.search(text) is not None:
            self.schema_change = True
        if names:
            self._tail = text[-_OVERLAP:]
        else:  # only what may begin a word going on in the next piece
            match = _WORD_START.search(text)
            self._tail = b"" if match is None else match.group(0)

    def finish(self) -> None:
        """The text is over: a word that ends it counts too."""
        tail = self._tail
        if _STATE_WORDS_AT_END.search(tail) is not None:
            self.changes_state = True
        if _SCHEMA_WORDS_AT_END.search(tail) is not None:
            self.schema_change = True
