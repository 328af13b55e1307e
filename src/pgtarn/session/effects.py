"""What a query does to its session's state: the kinds of effect, and the first look.

Every statement becomes a list of effects (tuples whose first item names the kind): settings
SET or RESET, transaction control, and the session-only state that cannot move to another
server (advisory locks, temporary objects, WITH HOLD cursors, roles, LOAD, LISTEN). The
model in tracking.py replays them with PostgreSQL's transaction semantics. Parsing is done
only for texts that may_change_state lets through: a cheap first look, cached per text.
The parse itself (parsing.py, with PostgreSQL's own parser, pglast) is imported at the
first text that needs it (client/parsers.py, load_pglast), not at start.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from .. import native
from ..errors import ProtocolViolation
from ..proto.build import quote_literal
from ..proto.messages import parse_bind_parameters
from ..proto.msgtypes import PARSE, QUERY
from .sqlnames import may_name_statements

Effect = tuple[Any, ...]

# Effect kinds (the first item of an Effect).
SET = "set"  # (SET, name, sql): a session value, replayed by running sql
#: (SET_PARAM, name, parameter number, local): set_config whose value is a parameter of the
#: statement: a SET (or LOCAL) once its Bind gives the value (with_parameters).
SET_PARAM = "set_param"
LOCAL = "local"  # (LOCAL, name, sql): SET LOCAL (only for a later SET ... FROM CURRENT)
FROM_CURRENT = "from_current"  # (FROM_CURRENT, name)
RESET = "reset"  # (RESET, name)
RESET_ALL = "reset_all"
DISCARD_ALL = "discard_all"
DISCARD_TEMP = "discard_temp"
BEGIN = "begin"
COMMIT = "commit"  # (COMMIT, chain)
ROLLBACK = "rollback"  # (ROLLBACK, chain)
SAVEPOINT = "savepoint"  # (SAVEPOINT, name)
RELEASE = "release"  # (RELEASE, name)
ROLLBACK_TO = "rollback_to"  # (ROLLBACK_TO, name)
TEMP = "temp"  # (TEMP, name): a temporary table, view or sequence ("": another object)
DROP_TEMP = "drop_temp"  # (DROP_TEMP, name, in pg_temp): DROP TABLE/VIEW/SEQUENCE of a name
HOLD = "hold"  # (HOLD, cursor name)
CLOSE = "close"  # (CLOSE, cursor name or None for ALL)
LISTEN = "listen"  # (LISTEN, channel)
UNLISTEN = "unlisten"  # (UNLISTEN, channel or None for *)
#: LISTEN and UNLISTEN answered by pgtarn (the listener connection listens for the client).
SUBSCRIBE = "subscribe"  # (SUBSCRIBE, channel)
UNSUBSCRIBE = "unsubscribe"  # (UNSUBSCRIBE, channel or None for *)
ROLE = "role"  # (ROLE, "role" | "session_authorization", set: bool)
LOCK = "lock"  # (LOCK, key): a session advisory lock taken
LOCK_UNCOUNTED = "lock_uncounted"  # advisory locks taken, how many unknown
UNLOCK = "unlock"  # (UNLOCK, key)
UNLOCK_ALL = "unlock_all"
#: An advisory lock function alone in a one-row SELECT, whose result says what it did: read
#: from the statement's DataRow (SessionTracker.result) and made one of the effects above.
#: statement: its place among the statements of the text; column: its place in the row, of
#: columns (the last three items of each); tried: a pg_try_advisory_lock* (true when
#: granted), else the row alone says so.
LOCK_ROW = "lock_row"  # (LOCK_ROW, key or None, tried, statement, column, columns)
UNLOCK_ROW = "unlock_row"  # (UNLOCK_ROW, key or None, shared, statement, column, columns)
UNLOCK_ALL_ROW = "unlock_all_row"  # (UNLOCK_ALL_ROW, statement, column, columns)
#: What a row said: a lock granted, an unlock that released one (key None: an expression).
LOCK_TAKEN = "lock_taken"  # (LOCK_TAKEN, key)
UNLOCKED = "unlocked"  # (UNLOCKED, key or None, shared)
UNLOCKED_ALL = "unlocked_all"  # pg_advisory_unlock_all() ran
LOAD = "load"
SEED = "seed"
UNTRACKED = "untracked"  # (UNTRACKED, why)
#: Why (UNTRACKED) a client with a named statement too long to hold keeps its server: its
#: text is only there. It happened whatever its batch's outcome (its Parse may have).
HELD: Final = "a prepared statement longer than client_message_buffer"
#: Why (UNTRACKED) a client whose statements became its server's own keeps it (a long text
#: naming them went as written: client/large.py); so whatever its batch's outcome.
CEDED: Final = (
    "a message longer than client_message_buffer naming prepared statements: they are the"
    " server's own from now on"
)

#: Effects of transaction control: an error in a batch holding one leaves its outcome unknown.
TRANSACTION_CONTROL = frozenset((BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, ROLLBACK_TO))


# --- the first look -------------------------------------------------------------------------

_STARTS: Final = (
    b"set",
    b"reset",
    b"discard",
    b"load",
    b"declare",
    b"close",
    b"listen",
    b"unlisten",
    b"create",
    b"drop",
)
_WORDS: Final = (b"advisory", b"set_config", b"setseed", b"temp", b"/*", b"--")
#: Transaction control: looked for in a named statement only. A Query of it matters only
#: while a transaction holds changes (and is parsed then); a named statement prepared
#: before runs at each Bind, maybe inside such a transaction.
_CONTROLS: Final = (
    b"begin",
    b"start",
    b"commit",
    b"end",
    b"rollback",
    b"abort",
    b"savepoint",
    b"release",
    b"prepare",
)


#: first_look's answers: bits of an int.
CHANGES_STATE: Final = 1  # may change session state (a named statement: or its transaction)
NAMES_STATEMENTS: Final = 2  # a Query's text may name prepared statements (sqlnames)
SCHEMA_CHANGE: Final = 4  # may change the schema (DDL): shared statements go stale

#: A statement of a text that changes the schema: CREATE (but a temporary object's, seen by
#: its own session only, which PostgreSQL re-plans by itself), ALTER, DROP, COMMENT, ... at
#: the start of one of its statements (after blanks and comments: schema_change), or DO.
_SCHEMA_START: Final = re.compile(
    rb"create\s+(?!(?:(?:local|global)\s+)?temp(?:orary)?\b)|alter\s|drop\s|comment\s|"
    rb"import\s+foreign\s|security\s+label\s|(do\b)"
)
#: What makes a DO block's body change the schema.
_SCHEMA_IN_DO: Final = re.compile(rb"\b(?:create|alter|drop)\s")
_BLANKS: Final = b" \t\n\r\f\v"


def schema_change(low: bytes) -> bool:
    """Whether a text (in lower case) may change the schema (_SCHEMA_START at the start of a
    statement, a DO block's body creating, altering or dropping). Every ';' is taken as a
    statement's start, but for those in a comment skipped after another's; a DO block
    looks on to the text's end. Linear: each byte is read a bounded number of times,
    whatever the text (a regular expression skipping comments after each ';' went
    exponential on a short text of many '--')."""
    pos = 0
    end = len(low)
    do_looked = False  # (a DO found nothing after it: a later one would find nothing more)
    while True:
        while pos < end:  # blanks and comments
            if low[pos] in _BLANKS:
                pos += 1
            elif low.startswith(b"--", pos):
                newline = low.find(b"\n", pos)
                pos = end if newline < 0 else newline + 1
            elif low.startswith(b"/*", pos):
                close = low.find(b"*/", pos + 2)
                pos = end if close < 0 else close + 2
            else:
                break
        match = _SCHEMA_START.match(low, pos)
        if match is not None:
            if match.group(1) is None:
                return True
            if not do_looked:
                if _SCHEMA_IN_DO.search(low, match.end()) is not None:
                    return True
                do_looked = True
        semicolon = low.find(b";", pos)
        if semicolon < 0:
            return False
        pos = semicolon + 1


def may_change_state(body: bytes, msg_type: int = QUERY) -> bool:
    """A cheap first look at the text of a Query's (or a Parse's) body: False when it cannot
    change session state (nor, for a named statement, control its transaction)."""
    return first_look(body, msg_type) & CHANGES_STATE != 0


def first_look(body: bytes, msg_type: int = QUERY) -> int:
    """What a Query's or a Parse's body (msg_type QUERY or PARSE) may do: CHANGES_STATE
    (may_change_state), SCHEMA_CHANGE (DDL) and, for a Query, NAMES_STATEMENTS
    (sqlnames.may_name_statements).

    Digits never decide either, so the answer is cached per body's shape, its digits made
    zeros: a query sent again, with other numbers or not, costs its shape and one dict lookup.
    The last body looked at is remembered: by identity, since the relay asks both questions
    of the same body object, and the second answer is free; and by its shape, since a busy
    pool sees the same query again and again, and a body of the last shape costs neither a
    new shape nor a lookup (SHAPE_OF returns the last shape itself).
    """
    last = _LAST
    if body is last.body and msg_type == last.msg_type:
        return last.look
    key = SHAPE_OF(body, last.key)
    if key is last.key and msg_type == last.msg_type:
        look = last.look
    else:
        looks = _PARSE_LOOKS if msg_type == PARSE else _LOOKS
        cached = looks.get(key)
        if cached is None:
            if len(looks) >= _LOOKS_MAX:  # texts that differ every time: start again
                looks.clear()
            if msg_type == PARSE:  # the statement's name comes first
                name_end = key.find(b"\x00")
                text = key[name_end + 1 :]
                look = CHANGES_STATE if _look(text, name_end > 0) else 0
            else:
                text = key
                look = (CHANGES_STATE if _look(key, False) else 0) | (
                    NAMES_STATEMENTS if may_name_statements(key) else 0
                )
            if schema_change(text[: text.find(b"\x00")].lower()):
                look |= SCHEMA_CHANGE
            looks[key] = look
        else:
            look = cached
    last.body, last.key, last.msg_type, last.look = body, key, msg_type, look
    return look


class _LastLook:
    """first_look's last body (held, so that its identity is not reused), its key and answer."""

    __slots__ = ("body", "key", "look", "msg_type")

    def __init__(self) -> None:
        self.body = b""
        self.key = b""
        self.msg_type = 0
        self.look = 0


_LAST: Final = _LastLook()
#: First looks by body with zeros for digits, Queries' and Parses' apart (plain dicts,
#: emptied when full: functools.lru_cache would wrap a bytes argument in a tuple per call).
_LOOKS: Final[dict[bytes, int]] = {}
_PARSE_LOOKS: Final[dict[bytes, int]] = {}
_LOOKS_MAX: Final = 4096
_ZEROS: Final = bytes.maketrans(b"123456789", b"000000000")


def shape_of(text: bytes, last: bytes) -> bytes:
    """text with every digit made a zero; last itself when that is last (the pure build's
    native/_shape.c)."""
    shape = text.translate(_ZEROS)
    return last if shape == last else shape


#: shape_of of native/_shape.c when it is built, else the pure build's.
SHAPE_OF: Final[Callable[[bytes, bytes], bytes]] = (
    shape_of if native.shape_of is None else native.shape_of
)


def _look(text: bytes, named: bool) -> bool:
    low = text.lower()
    start = low.lstrip(b" \t\r\n\f(")
    if start.startswith(_STARTS) or (named and start.startswith(_CONTROLS)):
        return True
    if any(word in low for word in _WORDS):
        return True
    semicolon = low.find(b";")
    # a second statement after a ';' (a ';' at the end, before the NUL, is only a terminator)
    return semicolon >= 0 and bool(low[semicolon:].strip(b" \t\r\n\f;\x00"))


# --- the parse --------------------------------------------------------------------------------


class Kind:
    """What a transaction's first text (or chunk) is to replica routing (session/readonly.py
    reads it; here, without pglast, for the pools that compare them): plain ints."""

    OTHER: Final = 0
    READ: Final = 1  # a single statement provably read-only
    BEGIN_READ_ONLY: Final = 2  # starts a read-only transaction
    BEGIN: Final = 3  # a bare transaction start: the next statement decides
    SET_READ_ONLY: Final = 4  # SET TRANSACTION READ ONLY
    NOTHING: Final = 5  # a batch that runs no statement (Parse, Describe, Close only)


#: Effects read from a statement's row.
ROW_EFFECTS: Final = frozenset((LOCK_ROW, UNLOCK_ROW, UNLOCK_ALL_ROW))


class Parsed:
    """The effects of one query text, how many statements it holds, and whether some of
    them are read from a row (ROW_EFFECTS)."""

    __slots__ = ("effects", "parameters", "rows", "statements")

    def __init__(self, effects: list[Effect], statements: int) -> None:
        self.effects = effects
        self.statements = statements
        self.rows = any(effect[0] in ROW_EFFECTS for effect in effects)
        #: Some effect takes its value from a parameter (SET_PARAM): known at each Bind.
        self.parameters = any(effect[0] == SET_PARAM for effect in effects)


def with_parameters(parsed: Parsed, bind: bytes | None) -> Parsed:
    """parsed's effects with the values a Bind's body gives its parameters (SET_PARAM made
    a SET or LOCAL, as set_config with those literals would be); without a Bind, or a value
    that cannot be read (NULL, not UTF-8, a parameter missing), the state is not followed
    (UNTRACKED), as before."""
    if not parsed.parameters:
        return parsed
    values = _bind_values(bind) if bind is not None else None
    out: list[Effect] = []
    for effect in parsed.effects:
        if effect[0] != SET_PARAM:
            out.append(effect)
            continue
        _kind, name, number, local = effect
        value = values[number - 1] if values is not None and 0 < number <= len(values) else None
        if value is None:
            out.append((UNTRACKED, "set_config with arguments that are not literals"))
            continue
        sql = f"SELECT set_config({quote_literal(name)}, {quote_literal(value)}, false)"
        out.append((LOCAL if local else SET, name, sql))
    return Parsed(out, parsed.statements)


def _bind_values(body: bytes) -> list[str | None] | None:
    """A Bind's parameter values as text (None: NULL, or not UTF-8); None if malformed. A
    text parameter's binary form is its text, and set_config takes text."""
    try:
        raw_values = parse_bind_parameters(body)
    except ProtocolViolation:
        return None
    values: list[str | None] = []
    for raw in raw_values:
        try:
            text = None if raw is None else raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        values.append(None if text is None or "\x00" in text else text)
    return values


def query_text(body: bytes) -> str:
    """The SQL of a Query message's body (text and its NUL)."""
    return body[: body.find(b"\x00")].decode("utf-8", "replace")


def parse_text(body: bytes) -> tuple[bytes, str]:
    """The statement name and SQL of a Parse message's body."""
    name_end = body.find(b"\x00")
    text_end = body.find(b"\x00", name_end + 1)
    return body[:name_end], body[name_end + 1 : text_end].decode("utf-8", "replace")


def as_subscriptions(parsed: Parsed) -> Parsed | None:
    """A text made only of LISTEN and UNLISTEN, as the subscriptions pgtarn answers itself;
    None when it holds anything else (it then runs on the server)."""
    effects = parsed.effects
    if not effects or len(effects) != parsed.statements:
        return None
    out: list[Effect] = []
    for effect in effects:
        if effect[0] == LISTEN:
            out.append((SUBSCRIBE, effect[1]))
        elif effect[0] == UNLISTEN:
            out.append((UNSUBSCRIBE, effect[1]))
        else:
            return None
    return Parsed(out, parsed.statements)
