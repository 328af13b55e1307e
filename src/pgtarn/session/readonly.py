"""Whether a transaction may run on a read-only replica, from the text or messages that open it.

In transaction pooling with replica routing, the first bytes a client without a server sends
decide where its transaction runs. classify reads a query text with PostgreSQL's own parser
(pglast) into a Kind: READ (one statement provably read-only: a SELECT, VALUES or TABLE with
no locking clause, no SELECT INTO, no data-modifying WITH, and only allow-listed built-in
functions), BEGIN_READ_ONLY (the text opens a read-only transaction and does not end it),
BEGIN (a lone BEGIN with no access mode: the next statement decides), SET_READ_ONLY (a lone
SET TRANSACTION READ ONLY) or OTHER. What cannot be proved read-only is OTHER, and runs on
the primary. classify_chunk applies it to the messages of one chunk (a Query, or an extended
protocol batch ending with its Sync).

Answers are cached per text, so a text seen before costs one dict lookup; a first look at
the first word decides most writes without a parse. pglast is large: this module imports
it at its top, so it is itself imported only when replica routing is on
(as session/parsing.py is, at the first text to parse).

Long: the allow-list of built-in functions and the walk over pglast's node kinds are one proof
of read-only-ness; split, each half would be unreadable without the other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, AnyStr, Final

from pglast import ast, parse_sql
from pglast.enums import TransactionStmtKind, VariableSetKind

from ..proto.msgtypes import BIND, EXECUTE, FLUSH, PARSE, PASSING_TYPES, QUERY, SYNC
from .effects import Kind

OTHER: Final = Kind.OTHER
READ: Final = Kind.READ
BEGIN_READ_ONLY: Final = Kind.BEGIN_READ_ONLY
BEGIN: Final = Kind.BEGIN
SET_READ_ONLY: Final = Kind.SET_READ_ONLY
NOTHING: Final = Kind.NOTHING

# --- the cache and the first look ------------------------------------------------------------

#: Kinds by text, as str and as the wire's bytes apart (an ASCII str and its bytes hash alike:
#: in one dict a lookup would compare them). Plain dicts emptied when full: texts that differ
#: every time start them again.
_TEXTS: dict[str, int] = {}
_BYTES: dict[bytes, int] = {}
_CACHE_MAX = 4096
#: READ texts with their numeric constants made 0 (see classify_bytes). Digits that follow a
#: letter, digit, underscore, dollar sign or non-ASCII byte belong to a name or a parameter
#: ($1), and stay.
_READ_SHAPES: dict[bytes, int] = {}
_NUMBERS: Final = re.compile(rb"(?<![\w$\x80-\xff])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
#: Longer texts are classified each time (their first look still spares most a parse).
_CACHE_TEXT_MAX = 8192


def classify(text: str | bytes) -> int:
    """The Kind of a query text; a text seen before is one dict lookup."""
    if isinstance(text, bytes):
        return classify_bytes(text)
    kind = _TEXTS.get(text)
    if kind is None:
        kind = _remember(_TEXTS, text, _kind_of_text(text))
    return kind


def classify_bytes(text: bytes) -> int:
    """The Kind of a query text as a Query or Parse carries it (UTF-8, without its NUL); a
    text seen before is one dict lookup, and a READ text with other numbers in it (pgbench's
    and many an application's literals) a substitution and one lookup."""
    kind = _BYTES.get(text)
    if kind is not None:
        return kind
    shape = _NUMBERS.sub(b"0", text) if len(text) <= _CACHE_TEXT_MAX else b""
    if shape and _READ_SHAPES.get(shape):
        return READ
    try:  # strict: a text in another client_encoding might lex otherwise
        kind = _kind_of_text(text.decode())
    except UnicodeDecodeError:
        kind = OTHER
    if kind == READ and shape:
        # Numeric constants do not make a statement that only reads do anything else; in
        # other statements they may (SET LOCAL transaction_read_only = 0 or 1): exact only.
        _remember(_READ_SHAPES, shape, READ)
    return _remember(_BYTES, text, kind)


def _remember(cache: dict[AnyStr, int], text: AnyStr, kind: int) -> int:
    if len(text) <= _CACHE_TEXT_MAX:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[text] = kind
    return kind


def _kind_of_text(sql: str) -> int:
    if "\x00" in sql or not _first_look(sql):  # PostgreSQL would end the text at a NUL
        return OTHER
    try:
        return _kind_of(parse_sql(sql))
    except Exception:  # a parse error, or a tree this reading does not expect
        return OTHER


#: The first words a text of a Kind other than OTHER can start with ("(" is skipped).
_FIRST_WORDS: Final = (
    "select",
    "values",
    "table",
    "with",
    "begin",
    "start",
    "set",
    "explain",
    "show",
    "reset",
)
_BLANKS: Final = frozenset(" \t\n\r\f\v(")


def _first_look(sql: str) -> bool:
    """False when the text surely is OTHER: its first word, after blanks, comments and
    opening parentheses, is none of _FIRST_WORDS. Only a shortcut: the parse decides the rest."""
    pos, end = 0, len(sql)
    while pos < end:
        char = sql[pos]
        if char in _BLANKS:
            pos += 1
        elif sql.startswith("--", pos):
            pos = _line_end(sql, pos)
        elif sql.startswith("/*", pos):
            pos = _comment_end(sql, pos)
        else:
            return sql[pos : pos + 7].lower().startswith(_FIRST_WORDS)
    return False


def _line_end(sql: str, pos: int) -> int:
    ends = [at for at in (sql.find("\n", pos), sql.find("\r", pos)) if at >= 0]
    return min(ends) if ends else len(sql)


def _comment_end(sql: str, pos: int) -> int:
    """Where a /* comment */ starting at pos ends (they nest in PostgreSQL); len(sql) when
    it does not."""
    depth = 0
    while True:
        opening, closing = sql.find("/*", pos), sql.find("*/", pos)
        if closing < 0:
            return len(sql)
        if 0 <= opening < closing:
            depth, pos = depth + 1, opening + 2
        else:
            depth, pos = depth - 1, closing + 2
            if depth == 0:
                return pos


# --- message chunks --------------------------------------------------------------------------

#: Kinds a batch may have when it runs that one statement alone.
_ALONE: Final = frozenset((BEGIN_READ_ONLY, BEGIN, SET_READ_ONLY))


def classify_chunk(data: bytes, statement_text: Callable[[bytes], bytes | None]) -> int:
    """The Kind of one chunk of client messages that starts a transaction.

    A lone whole Query is its text's Kind. An extended-protocol batch (Parse, Bind,
    Describe, Execute, Flush, Close, then one Sync that ends the chunk) is READ when every
    statement it parses or binds is; NOTHING when it binds none (statements prepared ahead:
    it runs nothing); the Kind of its one statement when it binds one BEGIN, BEGIN READ ONLY
    or SET TRANSACTION READ ONLY. A chunk that ends with a Flush (the batch goes on in later
    chunks, to the same server) is READ only when it parses SELECTs and runs nothing.
    statement_text gives the text of a named statement prepared before (None: unknown).
    Anything else, malformed included, is OTHER."""
    if data and data[0] == QUERY:
        if len(data) > 5 and data[-1] == 0 and int.from_bytes(data[1:5]) == len(data) - 1:
            return classify_bytes(data[5:-1])
        return OTHER
    return _batch(data, statement_text)


def _batch(data: bytes, statement_text: Callable[[bytes], bytes | None]) -> int:
    parsed: dict[bytes, int] = {}  # statement name -> Kind of its latest Parse here
    parse_names: list[bytes] = []
    binds: list[tuple[bytes, int]] = []  # (statement name, Kind) of each Bind
    all_read = True
    runs = False  # an Execute (of a portal bound before, when no Bind is here)
    flushed = False  # the chunk ends with a Flush: the batch goes on in later chunks
    pos, end = 0, len(data)
    while True:
        if pos == end and flushed:
            # the rest of the batch goes to the same server unseen: READ only for a driver
            # preparing SELECTs before it runs one (asyncpg); nothing run yet
            return READ if all_read and parse_names and not binds and not runs else OTHER
        if end - pos < 5:
            return OTHER  # no Sync at the end, or a message cut short
        msg_type = data[pos]
        length = int.from_bytes(data[pos + 1 : pos + 5])
        after = pos + 1 + length
        if length < 4 or after > end:
            return OTHER
        if msg_type == SYNC:
            if length != 4 or after != end:
                return OTHER
            break
        if msg_type == PARSE:  # name NUL text NUL parameter types
            name_end = data.find(b"\x00", pos + 5, after)
            text_end = data.find(b"\x00", name_end + 1, after) if name_end >= 0 else -1
            if text_end < 0:
                return OTHER
            name = data[pos + 5 : name_end]
            # A Parse of several statements fails on any server: its Kind is not told apart.
            kind = parsed[name] = classify_bytes(data[name_end + 1 : text_end])
            parse_names.append(name)
        elif msg_type == BIND:  # portal NUL statement NUL ...
            portal_end = data.find(b"\x00", pos + 5, after)
            name_end = data.find(b"\x00", portal_end + 1, after) if portal_end >= 0 else -1
            if name_end < 0:
                return OTHER
            name = data[portal_end + 1 : name_end]
            found = parsed.get(name)
            if found is None:  # prepared before: the unnamed statement never counts
                text = statement_text(name) if name else None
                found = OTHER if text is None else classify_bytes(text)
            kind = found
            binds.append((name, kind))
        elif msg_type in PASSING_TYPES:
            runs = runs or msg_type == EXECUTE
            flushed = msg_type == FLUSH
            pos = after
            continue
        else:
            return OTHER
        all_read = all_read and kind == READ
        pos = after
    if not binds:  # statements parsed (a driver preparing one), none run: any server will do
        return NOTHING if parse_names and not runs else OTHER
    if all_read:
        return READ
    if len(binds) == 1 and len(parse_names) <= 1:
        name, kind = binds[0]
        if kind in _ALONE and (not parse_names or parse_names[0] == name):
            return kind
    return OTHER


# --- the parse ---------------------------------------------------------------------------------

_STARTS: Final = (TransactionStmtKind.TRANS_STMT_BEGIN, TransactionStmtKind.TRANS_STMT_START)
#: Savepoints keep a read-only transaction open (and read-only).
_SAVEPOINTS: Final = (
    TransactionStmtKind.TRANS_STMT_SAVEPOINT,
    TransactionStmtKind.TRANS_STMT_RELEASE,
    TransactionStmtKind.TRANS_STMT_ROLLBACK_TO,
)
_TRUE: Final = frozenset(("on", "true", "yes", "1", "t", "y"))


def _kind_of(statements: tuple[Any, ...]) -> int:
    if len(statements) == 1:
        stmt = statements[0].stmt
        if _is_read(stmt):
            return READ
        if isinstance(stmt, ast.TransactionStmt) and stmt.kind in _STARTS:
            mode = _access_mode(stmt.options)
            return BEGIN if mode is None else BEGIN_READ_ONLY if mode else OTHER
        access = _sets_access(stmt)
        if access is True:
            return SET_READ_ONLY
        if access is None and _session_only(stmt):
            return NOTHING
        return OTHER
    return _read_only_transaction(statements)


def _session_only(stmt: Any) -> bool:
    """SET, RESET and SHOW of a setting, outside any transaction statement: they change or
    read the session only (tracked settings go with the client to every server), so they
    run anywhere and are no write."""
    if isinstance(stmt, ast.VariableShowStmt):
        return True
    return (
        isinstance(stmt, ast.VariableSetStmt)
        and not _is_set_transaction(stmt)
        and stmt.name != "SESSION CHARACTERISTICS"
    )


def _read_only_transaction(statements: tuple[Any, ...]) -> int:
    """BEGIN_READ_ONLY for several statements that open a transaction, make it read-only
    before anything else (SET TRANSACTION ... may come first) and neither end it nor make
    it read-write; OTHER for anything else."""
    if not statements:
        return OTHER
    first = statements[0].stmt
    if not isinstance(first, ast.TransactionStmt) or first.kind not in _STARTS:
        return OTHER
    mode = _access_mode(first.options)
    if mode is False:
        return OTHER
    read_only = mode is True
    for raw in statements[1:]:
        stmt = raw.stmt
        if isinstance(stmt, ast.TransactionStmt):
            if stmt.kind not in _SAVEPOINTS or not read_only:
                return OTHER  # ends the transaction, or a statement before READ ONLY
            continue
        access = _sets_access(stmt)
        if access is True:
            read_only = True
        elif access is False or (not read_only and not _is_set_transaction(stmt)):
            return OTHER  # made read-write, or a statement before READ ONLY
    return BEGIN_READ_ONLY if read_only else OTHER


def _access_mode(options: tuple[Any, ...] | None) -> bool | None:
    """The access mode transaction options give: True read only, False read write (or one
    not understood), None when they set none."""
    mode: bool | None = None
    for option in options or ():
        if getattr(option, "defname", None) != "transaction_read_only":
            continue
        value = getattr(getattr(option, "arg", None), "val", None)
        if not isinstance(value, ast.Integer) or value.ival != 1:
            return False
        mode = True
    return mode


def _sets_access(stmt: Any) -> bool | None:
    """Whether a statement makes the transaction read-only: True for SET TRANSACTION ...
    READ ONLY and SET LOCAL transaction_read_only = on, False for any other statement that
    sets (or resets) transaction_read_only, None for statements that do not touch it."""
    if not isinstance(stmt, ast.VariableSetStmt):
        return None
    if _is_set_transaction(stmt):
        return _access_mode(stmt.args)
    if (stmt.name or "").lower() != "transaction_read_only":
        return None
    args = stmt.args or ()
    if stmt.kind != VariableSetKind.VAR_SET_VALUE or not stmt.is_local or len(args) != 1:
        return False
    value = getattr(args[0], "val", None)
    if isinstance(value, ast.Integer):
        return value.ival == 1
    return isinstance(value, ast.String) and str(value.sval).lower() in _TRUE


def _is_set_transaction(stmt: Any) -> bool:
    return (
        isinstance(stmt, ast.VariableSetStmt)
        and stmt.kind == VariableSetKind.VAR_SET_MULTI
        and stmt.name == "TRANSACTION"
    )


def _is_read(stmt: Any) -> bool:
    """A SELECT (VALUES, TABLE, set operations) that reads only; EXPLAIN of one, without
    ANALYZE (which would run it)."""
    if isinstance(stmt, ast.ExplainStmt):
        if any(getattr(option, "defname", None) == "analyze" for option in stmt.options or ()):
            return False
        stmt = stmt.query
    return isinstance(stmt, ast.SelectStmt) and _reads_only(stmt)


def _reads_only(root: ast.Node) -> bool:
    """Every node of the tree is of a kind in _NODES (so no locking clause, no INTO, no
    INSERT/UPDATE/DELETE/MERGE in a WITH), every function call is allow-listed, every
    operator (also ORDER BY ... USING) built-in by its name, every TABLESAMPLE method
    built-in."""
    stack: list[Any] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(item)
            continue
        if not isinstance(item, ast.Node):
            continue  # None in a list (DISTINCT), or a scalar
        node: Any = item
        cls = type(node)
        if cls not in _NODES:
            return False
        if cls is ast.FuncCall:
            if _builtin(node.funcname) not in ALLOWED_FUNCTIONS:
                return False
        elif cls is ast.A_Expr:
            if _builtin(node.name) not in _OPERATORS:
                return False
        elif cls is ast.SortBy:
            if node.useOp and _builtin(node.useOp) not in _OPERATORS:  # ORDER BY a USING op
                return False
        elif cls is ast.RangeTableSample and _builtin(node.method) not in _SAMPLERS:
            return False
        for slot in cls.__slots__:
            value = getattr(node, slot, None)
            if isinstance(value, (ast.Node, tuple)):
                stack.append(value)
    return True


def _builtin(names: tuple[Any, ...] | None) -> str:
    """A function's or operator's name, unqualified or in pg_catalog; "" when in another
    schema (a user's: it may do anything)."""
    if not names:
        return ""
    if len(names) == 1:
        return str(names[0].sval)
    if len(names) == 2 and names[0].sval == "pg_catalog":
        return str(names[1].sval)
    return ""


#: The node kinds a read-only SELECT's raw parse tree may hold: LockingClause, IntoClause,
#: the data-modifying statements and everything not thought about are missing on purpose.
_NODES: Final = frozenset(
    (
        ast.SelectStmt,
        ast.ResTarget,
        ast.ColumnRef,
        ast.A_Star,
        ast.A_Const,
        ast.Integer,
        ast.Float,
        ast.String,
        ast.Boolean,
        ast.BitString,
        ast.ParamRef,
        ast.A_Expr,
        ast.A_Indices,
        ast.A_Indirection,
        ast.A_ArrayExpr,
        ast.BoolExpr,
        ast.NullTest,
        ast.BooleanTest,
        ast.TypeCast,
        ast.TypeName,
        ast.CollateClause,
        ast.SubLink,
        ast.CaseExpr,
        ast.CaseWhen,
        ast.CoalesceExpr,
        ast.MinMaxExpr,
        ast.RowExpr,
        ast.SQLValueFunction,
        ast.RangeVar,
        ast.Alias,
        ast.JoinExpr,
        ast.RangeSubselect,
        ast.RangeFunction,
        ast.RangeTableSample,
        ast.RangeTableFunc,
        ast.RangeTableFuncCol,
        ast.SortBy,
        ast.WindowDef,
        ast.WithClause,
        ast.CommonTableExpr,
        ast.CTESearchClause,
        ast.CTECycleClause,
        ast.GroupingSet,
        ast.GroupingFunc,
        ast.FuncCall,
        ast.NamedArgExpr,
        ast.XmlExpr,
        ast.XmlSerialize,
        ast.JsonValueExpr,
        ast.JsonFormat,
        ast.JsonOutput,
        ast.JsonReturning,
        ast.JsonKeyValue,
        ast.JsonObjectConstructor,
        ast.JsonArrayConstructor,
        ast.JsonArrayQueryConstructor,
        ast.JsonAggConstructor,
        ast.JsonObjectAgg,
        ast.JsonArrayAgg,
        ast.JsonParseExpr,
        ast.JsonScalarExpr,
        ast.JsonSerializeExpr,
        ast.JsonIsPredicate,
        ast.JsonFuncExpr,
        ast.JsonArgument,
        ast.JsonBehavior,
        ast.JsonTable,
        ast.JsonTableColumn,
        ast.JsonTablePathSpec,
    )
)

_SAMPLERS: Final = frozenset(("bernoulli", "system"))

#: Operators by name: PostgreSQL's built-in ones (a new name is a user's operator, whose
#: function may do anything), and the names the parser gives BETWEEN.
_OPERATORS: Final = frozenset(
    (
        "!!",
        "!~",
        "!~*",
        "!~~",
        "!~~*",
        "#",
        "##",
        "#-",
        "#>",
        "#>>",
        "%",
        "&",
        "&&",
        "&<",
        "&<|",
        "&>",
        "*",
        "*<",
        "*<=",
        "*<>",
        "*=",
        "*>",
        "*>=",
        "+",
        "-",
        "->",
        "->>",
        "-|-",
        "/",
        "<",
        "<->",
        "<<",
        "<<=",
        "<<|",
        "<=",
        "<>",
        "!=",
        "<@",
        "<^",
        "=",
        ">",
        ">=",
        ">>",
        ">>=",
        ">^",
        "?",
        "?#",
        "?&",
        "?-",
        "?-|",
        "?|",
        "?||",
        "@",
        "@-@",
        "@>",
        "@?",
        "@@",
        "@@@",
        "^",
        "^@",
        "|",
        "|&>",
        "|/",
        "|>>",
        "||",
        "||/",
        "~",
        "~*",
        "~<=~",
        "~<~",
        "~=",
        "~>=~",
        "~>~",
        "~~",
        "~~*",
        "BETWEEN",
        "NOT BETWEEN",
        "BETWEEN SYMMETRIC",
        "NOT BETWEEN SYMMETRIC",
    )
)

#: Built-in functions that only read: immutable or stable in pg_proc, no side effect, no
#: answer that differs on a replica in a way that matters (pg_is_in_recovery, pg_backend_pid
#: and the WAL positions are missing on purpose, as are all volatile ones). Checked against
#: a live PostgreSQL's catalog by tests/integration/test_readonly_catalog.py.
ALLOWED_FUNCTIONS: Final = frozenset(
    (
        # aggregates
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "array_agg",
        "string_agg",
        "bool_and",
        "bool_or",
        "every",
        "bit_and",
        "bit_or",
        "bit_xor",
        "json_agg",
        "jsonb_agg",
        "json_agg_strict",
        "jsonb_agg_strict",
        "json_object_agg",
        "jsonb_object_agg",
        "json_object_agg_strict",
        "jsonb_object_agg_strict",
        "json_object_agg_unique",
        "jsonb_object_agg_unique",
        "json_object_agg_unique_strict",
        "jsonb_object_agg_unique_strict",
        "xmlagg",
        "stddev",
        "stddev_pop",
        "stddev_samp",
        "variance",
        "var_pop",
        "var_samp",
        "corr",
        "covar_pop",
        "covar_samp",
        "regr_avgx",
        "regr_avgy",
        "regr_count",
        "regr_intercept",
        "regr_r2",
        "regr_slope",
        "regr_sxx",
        "regr_sxy",
        "regr_syy",
        "percentile_cont",
        "percentile_disc",
        "mode",
        "any_value",
        "range_agg",
        "range_intersect_agg",
        # window functions
        "row_number",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "ntile",
        "lag",
        "lead",
        "first_value",
        "last_value",
        "nth_value",
        # strings
        "lower",
        "upper",
        "initcap",
        "length",
        "char_length",
        "character_length",
        "octet_length",
        "bit_length",
        "substr",
        "substring",
        "replace",
        "btrim",
        "ltrim",
        "rtrim",
        "lpad",
        "rpad",
        "concat",
        "concat_ws",
        "format",
        "left",
        "right",
        "position",
        "strpos",
        "split_part",
        "repeat",
        "reverse",
        "translate",
        "overlay",
        "ascii",
        "chr",
        "starts_with",
        "regexp_replace",
        "regexp_match",
        "regexp_matches",
        "regexp_split_to_array",
        "regexp_split_to_table",
        "regexp_like",
        "regexp_count",
        "regexp_instr",
        "regexp_substr",
        "similar_to_escape",
        "string_to_array",
        "string_to_table",
        "array_to_string",
        "quote_ident",
        "quote_literal",
        "quote_nullable",
        "to_hex",
        "md5",
        "sha224",
        "sha256",
        "sha384",
        "sha512",
        "encode",
        "decode",
        "convert_from",
        "convert_to",
        "normalize",
        "is_normalized",
        "unistr",
        "casefold",
        "text",
        "varchar",
        "bpchar",
        "name",
        # numbers
        "abs",
        "ceil",
        "ceiling",
        "floor",
        "round",
        "trunc",
        "sign",
        "sqrt",
        "cbrt",
        "power",
        "pow",
        "exp",
        "ln",
        "log",
        "log10",
        "mod",
        "div",
        "gcd",
        "lcm",
        "pi",
        "degrees",
        "radians",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sind",
        "cosd",
        "tand",
        "asind",
        "acosd",
        "atand",
        "atan2d",
        "sinh",
        "cosh",
        "tanh",
        "width_bucket",
        "factorial",
        "scale",
        "min_scale",
        "trim_scale",
        "to_number",
        "int2",
        "int4",
        "int8",
        "float4",
        "float8",
        "numeric",
        "bool",
        # dates and times
        "now",
        "transaction_timestamp",
        "statement_timestamp",
        "date_trunc",
        "date_part",
        "extract",
        "age",
        "to_char",
        "to_date",
        "to_timestamp",
        "make_date",
        "make_time",
        "make_timestamp",
        "make_timestamptz",
        "make_interval",
        "justify_days",
        "justify_hours",
        "justify_interval",
        "isfinite",
        "date_bin",
        "date_add",
        "date_subtract",
        "timezone",
        "overlaps",
        "date",
        "time",
        "timestamp",
        "timestamptz",
        "interval",
        "generate_series",
        # json and jsonb
        "to_json",
        "to_jsonb",
        "row_to_json",
        "array_to_json",
        "json_build_object",
        "jsonb_build_object",
        "json_build_array",
        "jsonb_build_array",
        "json_object",
        "jsonb_object",
        "json_array_length",
        "jsonb_array_length",
        "json_array_elements",
        "jsonb_array_elements",
        "json_array_elements_text",
        "jsonb_array_elements_text",
        "json_each",
        "jsonb_each",
        "json_each_text",
        "jsonb_each_text",
        "json_extract_path",
        "jsonb_extract_path",
        "json_extract_path_text",
        "jsonb_extract_path_text",
        "json_object_keys",
        "jsonb_object_keys",
        "json_typeof",
        "jsonb_typeof",
        "json_strip_nulls",
        "jsonb_strip_nulls",
        "jsonb_pretty",
        "jsonb_set",
        "jsonb_set_lax",
        "jsonb_insert",
        "jsonb_path_query",
        "jsonb_path_query_array",
        "jsonb_path_query_first",
        "jsonb_path_exists",
        "jsonb_path_match",
        "jsonb_path_query_tz",
        "jsonb_path_query_array_tz",
        "jsonb_path_query_first_tz",
        "jsonb_path_exists_tz",
        "jsonb_path_match_tz",
        "json_populate_record",
        "jsonb_populate_record",
        "jsonb_populate_record_valid",
        "json_populate_recordset",
        "jsonb_populate_recordset",
        "json_to_record",
        "jsonb_to_record",
        "json_to_recordset",
        "jsonb_to_recordset",
        # arrays
        "array_length",
        "array_lower",
        "array_upper",
        "array_ndims",
        "array_dims",
        "cardinality",
        "array_append",
        "array_prepend",
        "array_cat",
        "array_remove",
        "array_replace",
        "array_position",
        "array_positions",
        "array_fill",
        "trim_array",
        "array_reverse",
        "array_sort",
        "unnest",
        "generate_subscripts",
        # ranges, network addresses, uuids, text search, xml
        "lower_inc",
        "upper_inc",
        "lower_inf",
        "upper_inf",
        "isempty",
        "range_merge",
        "int4range",
        "int8range",
        "numrange",
        "tsrange",
        "tstzrange",
        "daterange",
        "host",
        "hostmask",
        "masklen",
        "netmask",
        "network",
        "broadcast",
        "family",
        "abbrev",
        "set_masklen",
        "inet_same_family",
        "inet_merge",
        "uuid_extract_timestamp",
        "uuid_extract_version",
        "to_tsvector",
        "to_tsquery",
        "plainto_tsquery",
        "phraseto_tsquery",
        "websearch_to_tsquery",
        "ts_rank",
        "ts_rank_cd",
        "ts_headline",
        "setweight",
        "strip",
        "numnode",
        "querytree",
        "tsvector_to_array",
        "array_to_tsvector",
        "xpath",
        "xpath_exists",
        "xmlexists",
        "xml_is_well_formed",
        "xmltext",
        # the session and the catalogs
        "current_setting",
        "version",
        "current_database",
        "current_schema",
        "current_schemas",
        "current_user",
        "session_user",
        "system_user",
        "pg_collation_for",
        "pg_typeof",
        "format_type",
        "to_regclass",
        "to_regtype",
        "to_regtypemod",
        "to_regproc",
        "to_regprocedure",
        "to_regnamespace",
        "to_regrole",
        "to_regoper",
        "to_regcollation",
        "has_table_privilege",
        "has_column_privilege",
        "has_any_column_privilege",
        "has_database_privilege",
        "has_schema_privilege",
        "has_function_privilege",
        "has_sequence_privilege",
        "has_type_privilege",
        "pg_has_role",
        "pg_table_is_visible",
        "pg_type_is_visible",
        "pg_function_is_visible",
        "pg_get_expr",
        "pg_get_indexdef",
        "pg_get_constraintdef",
        "pg_get_viewdef",
        "pg_get_functiondef",
        "pg_get_function_arguments",
        "pg_get_function_identity_arguments",
        "pg_get_function_result",
        "pg_get_triggerdef",
        "pg_get_serial_sequence",
        "pg_get_userbyid",
        "obj_description",
        "col_description",
        "shobj_description",
        "pg_encoding_to_char",
        "pg_char_to_encoding",
        "pg_size_pretty",
        "pg_size_bytes",
        "pg_column_size",
        "num_nulls",
        "num_nonnulls",
    )
)


#: The session settings last asked about by reads_by_default, and the answer (dicts are
#: replaced, never changed, when a setting changes: identity says it is the same).
_LAST_SETTINGS: list[Any] = [None, False]


def reads_by_default(settings: dict[str, str]) -> bool:
    """Whether a client's session settings (name -> the SQL that set it, session/tracking.py)
    make its transactions read-only: default_transaction_read_only set to on."""
    if settings is _LAST_SETTINGS[0]:
        return bool(_LAST_SETTINGS[1])
    sql = settings.get("default_transaction_read_only")
    answer = False
    if sql is not None:
        try:
            statements = parse_sql(sql)
        except Exception:  # (pglast's ParseError, or worse: not read-only then)
            statements = ()
        for raw in statements:
            stmt = raw.stmt
            if isinstance(stmt, ast.VariableSetStmt) and stmt.args and \
                    stmt.kind == VariableSetKind.VAR_SET_VALUE:  # fmt: skip
                value = getattr(stmt.args[0], "val", None)
                answer = (
                    value.ival == 1
                    if isinstance(value, ast.Integer)
                    else isinstance(value, ast.String) and str(value.sval).lower() in _TRUE
                )
    _LAST_SETTINGS[0], _LAST_SETTINGS[1] = settings, answer
    return answer
