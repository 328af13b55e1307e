"""Pure encoders for the protocol messages pgtarn sends itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from struct import Struct
from typing import Final

# (Final: compiled, a module constant is then read from C, not looked up in a dict)
_I: Final = Struct("!I")
_HDR: Final = Struct("!cI")
_II: Final = Struct("!II")
_H: Final = Struct("!h")

PROTOCOL_3_0: Final = 196608


def message(msg_type: bytes, body: bytes = b"") -> bytes:
    """A typed message: type byte, length, body."""
    return _HDR.pack(msg_type, len(body) + 4) + body


def cstr(value: str) -> bytes:
    return value.encode() + b"\x00"


# --- server -> client ------------------------------------------------------------------------


def error_response(
    sqlstate: str,
    message_text: str,
    severity: str = "ERROR",
    detail: str | None = None,
    hint: str | None = None,
    *,
    notice: bool = False,
) -> bytes:
    """ErrorResponse (or NoticeResponse): severity, SQLSTATE, message and optional detail/hint."""
    body = b"S" + cstr(severity) + b"V" + cstr(severity) + b"C" + cstr(sqlstate)
    body += b"M" + cstr(message_text)
    if detail:
        body += b"D" + cstr(detail)
    if hint:
        body += b"H" + cstr(hint)
    return message(b"N" if notice else b"E", body + b"\x00")


def ready_for_query(status: bytes = b"I") -> bytes:
    return message(b"Z", status)


#: Authentication's codes as they are sent (0 to 12): a SCRAM login sends two, a
#: Struct.pack each (a generic method call when compiled) where this is a tuple read.
_AUTH_CODES: Final = tuple(_I.pack(code) for code in range(13))


def authentication(code: int, payload: bytes = b"") -> bytes:
    """Authentication* messages: 0 ok, 3 cleartext, 5 md5, 10 SASL, 11 continue, 12 final."""
    packed = _AUTH_CODES[code] if 0 <= code < len(_AUTH_CODES) else _I.pack(code)
    return message(b"R", packed + payload)


AUTH_OK = authentication(0)


def auth_sasl(mechanisms: Sequence[str]) -> bytes:
    return authentication(10, b"".join(cstr(m) for m in mechanisms) + b"\x00")


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(pid: int, key: int) -> bytes:
    return message(b"K", _II.pack(pid, key))


def negotiate_protocol_version(minor: int, unsupported: Iterable[str]) -> bytes:
    """NegotiateProtocolVersion for 3.minor: PostgreSQL sends the whole version number (3 in
    the high 16 bits), which libpq 18 reads as such (a bare minor is a 'downgrade to pre-3.0
    protocol version' to it)."""
    names = list(unsupported)
    return message(
        b"v", _I.pack(3 << 16 | minor) + _I.pack(len(names)) + b"".join(cstr(n) for n in names)
    )


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


def row_description(columns: Sequence[tuple[str, int]]) -> bytes:
    """RowDescription for text-format columns given as (name, type oid)."""
    body = bytearray(_H.pack(len(columns)))
    for name, oid in columns:
        body += cstr(name) + _I.pack(0) + _H.pack(0) + _I.pack(oid) + _H.pack(-1)
        body += _I.pack(0xFFFFFFFF) + _H.pack(0)
    return message(b"T", bytes(body))


def _values(values: Sequence[str | None]) -> bytes:
    """A count, then each value as length + text (length -1: NULL): DataRow's and Bind's."""
    body = bytearray(_H.pack(len(values)))
    for value in values:
        if value is None:
            body += b"\xff\xff\xff\xff"
        else:
            raw = value.encode()
            body += _I.pack(len(raw)) + raw
    return bytes(body)


def data_row(values: Sequence[str | None]) -> bytes:
    return message(b"D", _values(values))


PARSE_COMPLETE: Final = message(b"1")
BIND_COMPLETE: Final = message(b"2")
CLOSE_COMPLETE: Final = message(b"3")
NO_DATA: Final = message(b"n")
#: ParameterDescription of a statement without parameters.
NO_PARAMETERS: Final = message(b"t", b"\x00\x00")


# --- client -> server ------------------------------------------------------------------------


def startup_message(params: Mapping[str, str]) -> bytes:
    body = _I.pack(PROTOCOL_3_0) + b"".join(cstr(k) + cstr(v) for k, v in params.items()) + b"\0"
    return _I.pack(len(body) + 4) + body


#: SSLRequest: length 8, code 1234.5679.
SSL_REQUEST = b"\x00\x00\x00\x08\x04\xd2\x16\x2f"


def cancel_request(pid: int, key: int) -> bytes:
    return _I.pack(16) + _I.pack(80877102) + _II.pack(pid, key)


def query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def password_message(payload: bytes) -> bytes:
    return message(b"p", payload)


def sasl_initial_response(mechanism: str, data: bytes) -> bytes:
    return message(b"p", cstr(mechanism) + _I.pack(len(data)) + data)


def sasl_response(data: bytes) -> bytes:
    return message(b"p", data)


SYNC: Final = message(b"S")


def parse(statement: str, query: str, type_oids: Sequence[int] = ()) -> bytes:
    body = cstr(statement) + cstr(query) + _H.pack(len(type_oids))
    body += b"".join(_I.pack(oid) for oid in type_oids)
    return message(b"P", body)


def bind(portal: str, statement: str, params: Sequence[str | None]) -> bytes:
    """Bind with text parameters and text results."""
    body = cstr(portal) + cstr(statement) + _H.pack(0) + _values(params) + _H.pack(0)
    return message(b"B", body)


def execute(portal: str = "", max_rows: int = 0) -> bytes:
    return message(b"E", cstr(portal) + _I.pack(max_rows))


TERMINATE: Final = message(b"X")


def quote_literal(value: str) -> str:
    """A SQL string literal; E'' form when a backslash is present."""
    escaped = value.replace("'", "''")
    if "\\" in value:
        return "E'" + escaped.replace("\\", "\\\\") + "'"
    return "'" + escaped + "'"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
