"""The message type names are PostgreSQL's bytes, and the only place those bytes are written."""

from __future__ import annotations

import ast
import itertools
import tokenize
from pathlib import Path

from pgtarn.proto import msgtypes

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "pgtarn"
MODULE = SRC / "proto" / "msgtypes.py"
#: client/ still writes bare bytes: it is converted by its own change (issue 46, after the
#: client connection is composed of parts), and this allowance goes with it.
NOT_YET = SRC / "client"

#: Every message with a type byte in PostgreSQL's "Message Formats", by direction: the
#: name pgtarn gives it and its byte, written out here rather than read from the module.
FRONTEND = {
    "BIND": "B",
    "CLOSE": "C",
    "COPY_DATA": "d",
    "COPY_DONE": "c",
    "COPY_FAIL": "f",
    "DESCRIBE": "D",
    "EXECUTE": "E",
    "FLUSH": "H",
    "FUNCTION_CALL": "F",
    "GSS_RESPONSE": "p",
    "PARSE": "P",
    "PASSWORD_MESSAGE": "p",
    "QUERY": "Q",
    "SASL_INITIAL_RESPONSE": "p",
    "SASL_RESPONSE": "p",
    "SYNC": "S",
    "TERMINATE": "X",
}
BACKEND = {
    "AUTHENTICATION": "R",
    "BACKEND_KEY_DATA": "K",
    "BIND_COMPLETE": "2",
    "CLOSE_COMPLETE": "3",
    "COMMAND_COMPLETE": "C",
    "COPY_DATA": "d",
    "COPY_DONE": "c",
    "COPY_BOTH_RESPONSE": "W",
    "COPY_IN_RESPONSE": "G",
    "COPY_OUT_RESPONSE": "H",
    "DATA_ROW": "D",
    "EMPTY_QUERY_RESPONSE": "I",
    "ERROR_RESPONSE": "E",
    "FUNCTION_CALL_RESPONSE": "V",
    "NEGOTIATE_PROTOCOL_VERSION": "v",
    "NO_DATA": "n",
    "NOTICE_RESPONSE": "N",
    "NOTIFICATION_RESPONSE": "A",
    "PARAMETER_DESCRIPTION": "t",
    "PARAMETER_STATUS": "S",
    "PARSE_COMPLETE": "1",
    "PORTAL_SUSPENDED": "s",
    "READY_FOR_QUERY": "Z",
    "ROW_DESCRIPTION": "T",
}
TYPE_BYTES = {ord(letter) for letter in (*FRONTEND.values(), *BACKEND.values())}


def _named_ints() -> dict[str, int]:
    return {
        name: value
        for name, value in vars(msgtypes).items()
        if name.isupper() and isinstance(value, int)
    }


def _named_sets() -> dict[str, frozenset[int]]:
    return {
        name: value
        for name, value in vars(msgtypes).items()
        if name.isupper() and isinstance(value, frozenset)
    }


def test_each_name_is_postgresqls_byte() -> None:
    named = _named_ints()
    for name, letter in (*FRONTEND.items(), *BACKEND.items()):
        assert named.get(name) == ord(letter), name


def test_every_name_is_a_documented_message() -> None:
    assert set(_named_ints()) == set(FRONTEND) | set(BACKEND)


def test_sets_hold_named_types_and_each_is_defined_once() -> None:
    sets = _named_sets()
    assert sets["ALL_TYPES"] == frozenset(range(256))
    del sets["ALL_TYPES"]
    for name, types in sets.items():
        assert types and types <= TYPE_BYTES, name
    for (name, types), (other, other_types) in itertools.combinations(sets.items(), 2):
        assert types != other_types, f"{name} and {other} are the same set"


def _sources() -> list[Path]:
    paths = [*SRC.rglob("*.py"), *(ROOT / "bench").glob("*.py")]
    return sorted(p for p in paths if p != MODULE and NOT_YET not in p.parents)


def _bare_types(path: Path) -> list[str]:
    """Hex literals of a message type byte (0x5A) in path's code (comments aside)."""
    with tokenize.open(path) as fh:
        return [
            f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string}"
            for tok in tokenize.generate_tokens(fh.readline)
            if tok.type == tokenize.NUMBER
            and tok.string[:2].lower() == "0x"
            and int(tok.string, 16) in TYPE_BYTES
        ]


def _set_definitions(path: Path) -> list[str]:
    """Sets of message types made in path: frozenset(b"ZSE"), of msgtypes' names, or of all."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("msgtypes")
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("frozenset", "set")
        ):
            members = node.args
        elif isinstance(node, ast.Set):
            members = node.elts
        else:
            continue
        if (
            members and isinstance(members[0], ast.Call) and ast.unparse(members[0]) == "range(256)"
        ):  # every type
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        for member in members:
            letters = member.value if isinstance(member, ast.Constant) else None
            if (isinstance(letters, bytes) and letters and set(letters) <= TYPE_BYTES) or any(
                isinstance(n, ast.Name) and n.id in names for n in ast.walk(member)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_message_types_are_written_only_by_name() -> None:
    """Outside proto/msgtypes.py a message type is its name (ord("Q") where a byte is not a
    message type but happens to be one's letter)."""
    found = [line for path in _sources() for line in _bare_types(path)]
    assert found == []


def test_sets_of_message_types_are_defined_only_in_msgtypes() -> None:
    found = [line for path in _sources() for line in _set_definitions(path)]
    assert found == []
