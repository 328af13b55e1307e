"""The message type names are PostgreSQL's bytes."""

from __future__ import annotations

import itertools

from pgtarn.proto import msgtypes

#: Every message with a type byte in PostgreSQL's "Message Formats", by direction: the
#: name pgtarn gives it and its byte, written out here rather than read from the module.
FRONTEND = {
    "BIND": "B", "CLOSE": "C", "COPY_DATA": "d", "COPY_DONE": "c", "COPY_FAIL": "f",
    "DESCRIBE": "D", "EXECUTE": "E", "FLUSH": "H", "FUNCTION_CALL": "F", "GSS_RESPONSE": "p",
    "PARSE": "P", "PASSWORD_MESSAGE": "p", "QUERY": "Q", "SASL_INITIAL_RESPONSE": "p",
    "SASL_RESPONSE": "p", "SYNC": "S", "TERMINATE": "X",
}
BACKEND = {
    "AUTHENTICATION": "R", "BACKEND_KEY_DATA": "K", "BIND_COMPLETE": "2", "CLOSE_COMPLETE": "3",
    "COMMAND_COMPLETE": "C", "COPY_DATA": "d", "COPY_DONE": "c", "COPY_BOTH_RESPONSE": "W",
    "COPY_IN_RESPONSE": "G", "COPY_OUT_RESPONSE": "H", "DATA_ROW": "D",
    "EMPTY_QUERY_RESPONSE": "I", "ERROR_RESPONSE": "E", "FUNCTION_CALL_RESPONSE": "V",
    "NEGOTIATE_PROTOCOL_VERSION": "v", "NO_DATA": "n", "NOTICE_RESPONSE": "N",
    "NOTIFICATION_RESPONSE": "A", "PARAMETER_DESCRIPTION": "t", "PARAMETER_STATUS": "S",
    "PARSE_COMPLETE": "1", "PORTAL_SUSPENDED": "s", "READY_FOR_QUERY": "Z",
    "ROW_DESCRIPTION": "T",
}
TYPE_BYTES = {ord(letter) for letter in (*FRONTEND.values(), *BACKEND.values())}


def _named_ints() -> dict[str, int]:
    return {name: value for name, value in vars(msgtypes).items()
            if name.isupper() and isinstance(value, int)}


def _named_sets() -> dict[str, frozenset[int]]:
    return {name: value for name, value in vars(msgtypes).items()
            if name.isupper() and isinstance(value, frozenset)}


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
