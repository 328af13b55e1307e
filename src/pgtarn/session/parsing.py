"""The parse of a query text into its effects on session state, with pglast.

PostgreSQL's own parser reads each statement; effects.py names the kinds of effect and
holds the cheap first look that decides which texts come here. pglast is large, and many
poolers never see a text that needs it, so this module is imported at the first text to parse
(client/tracking.py, load_pglast).
"""

from __future__ import annotations

from typing import Any

from pglast import ast, parse_sql
from pglast.enums import (
    DiscardMode,
    ObjectType,
    OnCommitAction,
    TransactionStmtKind,
    VariableSetKind,
)
from pglast.parser import ParseError
from pglast.stream import RawStream

from ..proto.build import quote_literal
from .effects import (
    BEGIN,
    CLOSE,
    COMMIT,
    DISCARD_ALL,
    DISCARD_TEMP,
    DROP_TEMP,
    FROM_CURRENT,
    HOLD,
    LISTEN,
    LOAD,
    LOCAL,
    LOCK,
    LOCK_ROW,
    LOCK_UNCOUNTED,
    RELEASE,
    RESET,
    RESET_ALL,
    ROLE,
    ROLLBACK,
    ROLLBACK_TO,
    SAVEPOINT,
    SEED,
    SET,
    SET_PARAM,
    TEMP,
    UNLISTEN,
    UNLOCK,
    UNLOCK_ALL,
    UNLOCK_ALL_ROW,
    UNLOCK_ROW,
    UNTRACKED,
    Effect,
    Parsed,
)

# Settings that change only the current transaction (SET TRANSACTION ... writes these).
_TRANSACTION_ONLY = frozenset(
    ("transaction_isolation", "transaction_read_only", "transaction_deferrable")
)
# SET SESSION CHARACTERISTICS AS TRANSACTION ...: the session defaults it sets.
_CHARACTERISTICS = {
    "transaction_isolation": "default_transaction_isolation",
    "transaction_read_only": "default_transaction_read_only",
    "transaction_deferrable": "default_transaction_deferrable",
}
_ROLE_SETTINGS = frozenset(("role", "session_authorization"))
_LOCKS = {
    "pg_advisory_lock": False,
    "pg_try_advisory_lock": False,
    "pg_advisory_lock_shared": True,
    "pg_try_advisory_lock_shared": True,
}
_UNLOCKS = {"pg_advisory_unlock": False, "pg_advisory_unlock_shared": True}
_UNLOCK_ALL = "pg_advisory_unlock_all"
_COUNTED = frozenset((*_LOCKS, *_UNLOCKS, _UNLOCK_ALL))
_HOLD = 0x0020  # CURSOR_OPT_HOLD in PostgreSQL's parsenodes.h


def effects_of(sql: str) -> Parsed:
    """The effects of a query's statements, in order; a text PostgreSQL will refuse has none
    (its error changes nothing)."""
    try:
        statements = parse_sql(sql)
    except ParseError:
        return Parsed([], 1)
    effects: list[Effect] = []
    encoded = sql.encode()
    for index, raw in enumerate(statements):
        start = raw.stmt_location or 0
        text = encoded[start : start + raw.stmt_len if raw.stmt_len else None]
        try:
            _statement(raw.stmt, effects, text.decode("utf-8", "replace"), index)
        except Exception:  # a tree this reading does not expect: keep the client's server
            effects.append((UNTRACKED, "a statement pgtarn could not read"))
    return Parsed(effects, len(statements))


def _statement(stmt: Any, out: list[Effect], text: str = "", index: int = -1) -> None:
    """The effects of one statement; text is the statement as sent (a SET is replayed so),
    index its place in the text when its own rows reach the client (-1: they do not)."""
    if isinstance(stmt, ast.ExplainStmt):
        if not any(
            option.defname == "analyze" and _literal(option.arg) != "false"
            for option in stmt.options or ()
        ):
            return  # only planned
        stmt = stmt.query  # EXPLAIN ANALYZE runs it (its rows are the plan's)
        index = -1
    if isinstance(stmt, ast.VariableSetStmt):
        _variable_set(stmt, out, text)
    elif isinstance(stmt, ast.TransactionStmt):
        _transaction(stmt, out)
    elif isinstance(stmt, ast.DiscardStmt):
        if stmt.target == DiscardMode.DISCARD_ALL:
            out.append((DISCARD_ALL,))
        elif stmt.target == DiscardMode.DISCARD_TEMP:
            out.append((DISCARD_TEMP,))
    elif isinstance(stmt, ast.LoadStmt):
        out.append((LOAD,))
    elif isinstance(stmt, ast.DeclareCursorStmt):
        if (stmt.options or 0) & _HOLD:
            out.append((HOLD, stmt.portalname))
        _calls(stmt.query, out)
    elif isinstance(stmt, ast.ClosePortalStmt):
        out.append((CLOSE, stmt.portalname))
    elif isinstance(stmt, ast.ListenStmt):
        out.append((LISTEN, stmt.conditionname))
    elif isinstance(stmt, ast.UnlistenStmt):
        out.append((UNLISTEN, stmt.conditionname))
    elif isinstance(stmt, ast.PrepareStmt):
        inner: list[Effect] = []
        _statement(stmt.query, inner)
        if inner:  # runs at each EXECUTE, which names no state: cannot be followed
            out.append((UNTRACKED, "a prepared statement that changes session state"))
    elif isinstance(stmt, ast.DropStmt):
        if stmt.removeType in _DROPPED_RELATIONS:
            for names in stmt.objects or ():
                if len(names) == 1 or str(names[0].sval).startswith("pg_temp"):
                    out.append((DROP_TEMP, str(names[-1].sval), len(names) > 1))
    else:
        created = _temp_created(stmt)
        if created is not None:
            out.append((TEMP, created))
        _calls(stmt, out, index)


#: What a temporary object's DROP may name (another kind's name is not a relation's).
_DROPPED_RELATIONS = frozenset(
    (ObjectType.OBJECT_TABLE, ObjectType.OBJECT_VIEW, ObjectType.OBJECT_SEQUENCE)
)


def _variable_set(stmt: ast.VariableSetStmt, out: list[Effect], text: str) -> None:
    kind = stmt.kind
    if kind == VariableSetKind.VAR_RESET_ALL:
        out.append((RESET_ALL,))
        return
    if kind == VariableSetKind.VAR_SET_MULTI:
        if stmt.name == "SESSION CHARACTERISTICS" and not stmt.is_local:
            for item in stmt.args or ():
                name = _CHARACTERISTICS.get(item.defname)
                if name is not None:
                    value = _characteristic(item.arg)
                    out.append((SET, name, f"SET {name} TO {quote_literal(value)}"))
        return  # SET TRANSACTION ...: this transaction only
    name = (stmt.name or "").lower()
    if name in _TRANSACTION_ONLY:
        return
    if name in _ROLE_SETTINGS:
        if stmt.is_local:
            return
        unset = kind in (VariableSetKind.VAR_RESET, VariableSetKind.VAR_SET_DEFAULT) or (
            name == "role" and _is_none(stmt.args)
        )
        out.append((ROLE, name, not unset))
        return
    if name == "seed":
        if not stmt.is_local:
            out.append((SEED,))
        return
    if kind == VariableSetKind.VAR_SET_VALUE:
        if not stmt.is_local:
            out.append((SET, name, text.strip()))  # as PostgreSQL took it
            return
        try:  # its session form, should SET ... FROM CURRENT make it the session's
            sql = RawStream()(
                ast.VariableSetStmt(kind=kind, name=stmt.name, args=stmt.args, is_local=False)
            )
        except Exception:
            sql = ""
        out.append((LOCAL, name, sql))
    elif kind == VariableSetKind.VAR_SET_CURRENT:
        if not stmt.is_local:
            out.append((FROM_CURRENT, name))
    elif not stmt.is_local:  # RESET name, SET name TO DEFAULT
        out.append((RESET, name))


def _is_none(args: tuple[Any, ...] | None) -> bool:
    """SET ROLE NONE."""
    return (
        args is not None
        and isinstance(args[0], ast.A_Const)
        and getattr(args[0].val, "sval", None) == "none"
    )


def _characteristic(arg: Any) -> str:
    value = getattr(arg, "val", None)
    if isinstance(value, ast.Integer):
        return "on" if value.ival else "off"
    return str(getattr(value, "sval", ""))


def _transaction(stmt: ast.TransactionStmt, out: list[Effect]) -> None:
    kind = stmt.kind
    if kind in (TransactionStmtKind.TRANS_STMT_BEGIN, TransactionStmtKind.TRANS_STMT_START):
        out.append((BEGIN,))
    elif kind == TransactionStmtKind.TRANS_STMT_COMMIT:
        out.append((COMMIT, bool(stmt.chain)))
    elif kind == TransactionStmtKind.TRANS_STMT_PREPARE:
        out.append((COMMIT, False))  # the session leaves the transaction, its settings kept
    elif kind == TransactionStmtKind.TRANS_STMT_ROLLBACK:
        out.append((ROLLBACK, bool(stmt.chain)))
    elif kind == TransactionStmtKind.TRANS_STMT_SAVEPOINT:
        out.append((SAVEPOINT, stmt.savepoint_name))
    elif kind == TransactionStmtKind.TRANS_STMT_RELEASE:
        out.append((RELEASE, stmt.savepoint_name))
    elif kind == TransactionStmtKind.TRANS_STMT_ROLLBACK_TO:
        out.append((ROLLBACK_TO, stmt.savepoint_name))


def _temp_created(stmt: ast.Node) -> str | None:
    """The name of the temporary relation a statement creates (CREATE TEMP TABLE/VIEW/
    SEQUENCE, CREATE TABLE pg_temp.x, SELECT ... INTO TEMP, CREATE TEMP TABLE ... AS); ""
    for another object created in pg_temp (a function, a type), which no DROP here ends;
    None when it creates none, or one ON COMMIT DROP, which is gone when its transaction
    ends."""
    relation: Any = None
    on_commit: Any = None
    if isinstance(stmt, (ast.CreateStmt, ast.CreateSeqStmt)):
        relation = stmt.sequence if isinstance(stmt, ast.CreateSeqStmt) else stmt.relation
        on_commit = getattr(stmt, "oncommit", None)
    elif isinstance(stmt, ast.ViewStmt):
        relation = stmt.view
    elif isinstance(stmt, ast.CreateTableAsStmt) and stmt.into is not None:
        relation, on_commit = stmt.into.rel, stmt.into.onCommit
    elif isinstance(stmt, ast.SelectStmt) and stmt.intoClause is not None:
        relation, on_commit = stmt.intoClause.rel, stmt.intoClause.onCommit
    if relation is not None:
        if on_commit == OnCommitAction.ONCOMMIT_DROP:
            return None
        if relation.relpersistence == "t" or (relation.schemaname or "").startswith("pg_temp"):
            return str(relation.relname)
        return None
    if type(stmt).__name__.startswith(_CREATING) and _names_pg_temp(stmt):
        return ""
    return None


_CREATING = ("Create", "Define", "CompositeType")


def _names_pg_temp(stmt: Any) -> bool:
    """Whether a creating statement's own name (a qualified name list) is in pg_temp."""
    for slot in getattr(type(stmt), "__slots__", ()):
        value = getattr(stmt, slot, None)
        if isinstance(value, ast.RangeVar) and (value.schemaname or "").startswith("pg_temp"):
            return True
        if (
            isinstance(value, tuple)
            and value
            and isinstance(value[0], ast.String)
            and len(value) > 1
            and str(value[0].sval).startswith("pg_temp")
        ):
            return True
        if isinstance(value, ast.TypeName) and value.names and len(value.names) > 1 \
                and str(value.names[0].sval).startswith("pg_temp"):  # fmt: skip
            return True
    return False


def _calls(node: Any, out: list[Effect], index: int = -1) -> None:
    """Effects of the function calls in a statement: set_config and advisory locks. index:
    the statement's place in its text when its row reaches the client (-1: it does not);
    the lock calls that are its columns are then read from that row (ROW_EFFECTS)."""
    simple = _single_row(node)
    columns: dict[int, int] = {}
    if simple and index >= 0 and node.intoClause is None:
        columns = {id(target.val): at for at, target in enumerate(node.targetList)}
    count = len(columns)
    for call in _walk(node):
        if not isinstance(call, ast.FuncCall):
            continue
        name = call.funcname[-1].sval.lower() if call.funcname else ""
        column = columns.get(id(call), -1)
        if name == "set_config":
            _set_config(call, out)
        elif name in _LOCKS:
            key = _lock_key(call, _LOCKS[name])
            if column >= 0:
                out.append((LOCK_ROW, key, name.startswith("pg_try"), index, column, count))
            else:
                out.append((LOCK, key) if simple and key is not None else (LOCK_UNCOUNTED,))
        elif name in _UNLOCKS:
            key = _lock_key(call, _UNLOCKS[name])
            if column >= 0:
                out.append((UNLOCK_ROW, key, _UNLOCKS[name], index, column, count))
            elif simple and key is not None:
                out.append((UNLOCK, key))
        elif name == _UNLOCK_ALL:
            # Elsewhere it may run for no row at all (WHERE false, FROM an empty table):
            # the locks are then kept, pinned, until one is sure to have run.
            if column >= 0:
                out.append((UNLOCK_ALL_ROW, index, column, count))
            elif simple:
                out.append((UNLOCK_ALL,))
        elif name == "setseed":
            out.append((SEED,))


def _single_row(node: Any) -> bool:
    """A SELECT of lock calls only (no FROM, WHERE, LIMIT, WITH, no other expression that
    might return a set): each call in it runs once."""
    if not isinstance(node, ast.SelectStmt) or node.fromClause or node.whereClause \
            or node.valuesLists is not None or node.op != 0 or node.limitCount is not None \
            or node.limitOffset is not None or node.groupClause or node.havingClause \
            or node.withClause is not None:  # fmt: skip
        return False
    for target in node.targetList or ():
        call = getattr(target, "val", None)
        if not isinstance(call, ast.FuncCall) or not call.funcname or \
                str(call.funcname[-1].sval).lower() not in _COUNTED:  # fmt: skip
            return False
    return True


def _lock_key(call: ast.FuncCall, shared: bool) -> str | None:
    """Which lock: the arguments as written (literals or $n), or None for expressions."""
    parts = []
    for arg in call.args or ():
        if not isinstance(arg, (ast.A_Const, ast.ParamRef)):
            return None
        parts.append(RawStream()(arg))
    return ("shared " if shared else "") + ",".join(parts)


def _set_config(call: ast.FuncCall, out: list[Effect]) -> None:
    args = call.args or ()
    values = [_literal(arg) for arg in args]
    if (
        len(values) == 3
        and values[1] is None
        and values[0] is not None
        and values[2] is not None
        and isinstance(param := _unwrapped(args[1]), ast.ParamRef)
    ):
        # asyncpg's set_config('jit', $1, false) after a type introspection: read at Bind
        setting = str(values[0]).lower()
        if setting in _TRANSACTION_ONLY:
            return
        if setting in _ROLE_SETTINGS or setting == "seed":
            out.append((UNTRACKED, "set_config with arguments that are not literals"))
            return
        out.append(
            (
                SET_PARAM,
                setting,
                param.number,
                str(values[2]).lower() in ("true", "t", "on", "1", "yes", "y"),
            )
        )
        return
    if len(values) != 3 or any(v is None for v in values):
        out.append((UNTRACKED, "set_config with arguments that are not literals"))
        return
    name, value, local = (str(v) for v in values)
    name = name.lower()
    is_local = local.lower() in ("true", "t", "on", "1", "yes", "y")
    if name in _TRANSACTION_ONLY:
        return
    if name in _ROLE_SETTINGS:
        if not is_local:
            out.append((ROLE, name, value.lower() not in ("", "none", "default")))
        return
    if name == "seed":
        if not is_local:
            out.append((SEED,))
        return
    sql = f"SELECT set_config({quote_literal(name)}, {quote_literal(value)}, false)"
    out.append((LOCAL if is_local else SET, name, sql))


def _unwrapped(arg: Any) -> Any:
    """An argument without its casts ($1::text is $1)."""
    while isinstance(arg, ast.TypeCast):
        arg = arg.arg
    return arg


def _literal(arg: Any) -> str | bool | None:
    """A constant argument's value as text (booleans as 'true'/'false'), or None."""
    if isinstance(arg, ast.TypeCast):
        arg = arg.arg
    if not isinstance(arg, ast.A_Const) or arg.isnull:
        return None
    value = arg.val
    if isinstance(value, ast.Boolean):
        return "true" if value.boolval else "false"
    if isinstance(value, ast.String):
        return str(value.sval)
    if isinstance(value, ast.Integer):
        return str(value.ival)
    if isinstance(value, ast.Float):
        return str(value.fval)
    return None


def _walk(node: Any) -> Any:
    """Every node under node, depth first, in the order of the text."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        elif isinstance(item, ast.Node):
            yield item
            for slot in reversed(getattr(type(item), "__slots__", ())):
                value = getattr(item, slot, None)
                if isinstance(value, (ast.Node, tuple)):
                    stack.append(value)
