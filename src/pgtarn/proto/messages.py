"""Decode the few messages pgtarn acts on; everything else stays bytes."""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct
from typing import Final

from .. import native
from ..errors import ProtocolViolation
from .build import PROTOCOL_3_0

_I = Struct("!I")
_II = Struct("!II")

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102


#: nul_at looks at this many bytes one by one before it calls bytes.find.
_SHORT: Final = 32


def nul_at(body: bytes, pos: int) -> int:
    """Where the first NUL at or after pos is; -1 if there is none.

    The names a message starts with (portals, statements) are short: compiled, a loop over
    their bytes takes about 12 ns where bytes.find, a method call that parses its arguments,
    takes 80. Longer strings (query texts) are left to find."""
    stop = min(len(body), pos + _SHORT)
    end = pos
    while end < stop:
        if body[end] == 0:
            return end
        end += 1
    return body.find(b"\x00", end)


def read_cstring(body: bytes, pos: int) -> tuple[bytes, int]:
    """The bytes of a NUL-terminated string at pos and the position after it."""
    end = nul_at(body, pos)
    if end < 0:
        raise ProtocolViolation("missing string terminator")
    return body[pos:end], end + 1


def read_cstr(body: bytes, pos: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at pos and the position after it."""
    raw, end = read_cstring(body, pos)
    try:
        return raw.decode(), end
    except UnicodeDecodeError as exc:
        raise ProtocolViolation("invalid UTF-8 in message") from exc


@dataclass(init=False)
class StartupPacket:
    """The first packet of a connection: a protocol version or a special request code.

    Its own __init__ and Final fields in place of frozen=True: compiled, that is a C
    constructor (proto/client_login.py's events say why)."""

    code: Final[int]
    params: Final[dict[str, str]]
    cancel_key: Final[tuple[int, int] | None]

    def __init__(
        self, code: int, params: dict[str, str], cancel_key: tuple[int, int] | None = None
    ) -> None:
        self.code = code
        self.params = params
        self.cancel_key = cancel_key

    @property
    def major(self) -> int:
        return self.code >> 16

    @property
    def minor(self) -> int:
        return self.code & 0xFFFF


#: native/_startup.c's reading of a protocol 3.0 StartupMessage, when built (else None).
STARTUP_PARAMS: Final = native.startup_params


def parse_startup(body: bytes) -> StartupPacket:
    """Parse a startup packet body (after the length word)."""
    if STARTUP_PARAMS is not None:
        # the usual StartupMessage, in C; None for any other, which read_startup reads
        params = STARTUP_PARAMS(body, _STARTUP_TEXTS, _STARTUP_STRINGS_MAX)
        if params is not None:
            return StartupPacket(PROTOCOL_3_0, params)
    return read_startup(body)


def read_startup(body: bytes) -> StartupPacket:
    """parse_startup in Python: the pure build's, and any message the C code leaves."""
    if len(body) < 4:
        raise ProtocolViolation("startup packet too short")
    code = _I.unpack_from(body, 0)[0]
    if code == CANCEL_REQUEST:
        if len(body) < 12:
            raise ProtocolViolation("cancel request too short")
        pid, key = _II.unpack_from(body, 4)
        return StartupPacket(code, {}, (pid, key))
    if code in (SSL_REQUEST, GSSENC_REQUEST):
        return StartupPacket(code, {})
    # name\0value\0 pairs, then an empty name; one split, not a scan per string. The last
    # element of the split is what follows the last NUL (no terminator).
    tail = body[4:]
    # (bytes() of bytes is a generic call when compiled: a copy only of another buffer)
    strings = (tail if isinstance(tail, bytes) else bytes(tail)).split(b"\x00")
    last = len(strings) - 1
    params: dict[str, str] = {}
    i = 0
    while True:
        if i == last:  # nothing terminated is left
            raise ProtocolViolation(
                "missing string terminator" if strings[i] else "startup packet not terminated"
            )
        if not strings[i]:
            break  # the empty name that ends the list
        if i + 1 == last:  # the name has no value with a terminator
            _decode(strings[i])
            raise ProtocolViolation("missing string terminator")
        # one copy each: thousands of clients with the same user, database,
        # application_name... (a client keeps some of them for as long as it stays)
        params[_one_text(strings[i])] = _one_text(strings[i + 1])
        i += 2
    return StartupPacket(code, params)


#: The strings of recent startup packets by their bytes, each the one copy of its text: a
#: dictionary, not sys.intern (a generic call when compiled, about 550 instructions, against
#: 150), keyed by the bytes so that a known one is not decoded again. Bounded: cleared when
#: full, so that made-up values cannot make it grow.
_STARTUP_STRINGS: Final[dict[bytes, str]] = {}
_STARTUP_STRINGS_MAX: Final = 4096
#: The same for native/_startup.c, which decodes where the string lies: the text is its key.
_STARTUP_TEXTS: Final[dict[str, str]] = {}


def _one_text(raw: bytes) -> str:
    """raw decoded (UTF-8), the one copy of that text."""
    known = _STARTUP_STRINGS.get(raw)
    if known is None:
        text = _decode(raw)
        if len(_STARTUP_STRINGS) >= _STARTUP_STRINGS_MAX:
            _STARTUP_STRINGS.clear()
        known = _STARTUP_STRINGS[raw] = text
    return known


def _decode(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolViolation("invalid UTF-8 in message") from exc


def parse_fields(body: bytes) -> dict[str, str]:
    """ErrorResponse / NoticeResponse fields keyed by their one-letter code (of the head of
    one too long to hold, its first bytes, the field cut is there with what the head holds)."""
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(body) and body[pos] != 0:
        code = chr(body[pos])
        end = body.find(b"\x00", pos + 1)
        if end < 0:
            fields[code] = body[pos + 1 :].decode(errors="replace")
            break
        fields[code] = body[pos + 1 : end].decode(errors="replace")
        pos = end + 1
    return fields


def parse_data_row(body: bytes) -> list[bytes | None]:
    """The column values of a DataRow (None for NULL)."""
    values, pos = _counted_values(body, 0, "DataRow")
    if pos != len(body):
        raise ProtocolViolation("malformed DataRow")
    return values


def parse_data_row_head(body: bytes) -> tuple[int, list[bytes | None]]:
    """The column count of a DataRow and the values its body holds whole: all of them, or,
    for the head of a row too long to hold (its first bytes), those before the cut."""
    values, pos = _counted_values(body, 0, "DataRow", head=True)
    count = int.from_bytes(body[:2], "big")
    if len(values) == count and pos != len(body):
        raise ProtocolViolation("malformed DataRow")
    return count, values


def parse_bind_parameters(body: bytes) -> list[bytes | None]:
    """The parameter values of a Bind (None for NULL), in the form its format codes say."""
    portal_end = body.find(b"\x00")
    name_end = body.find(b"\x00", portal_end + 1) if portal_end >= 0 else -1
    pos = name_end + 1
    if name_end < 0 or pos + 2 > len(body):
        raise ProtocolViolation("malformed Bind")
    pos += 2 + 2 * int.from_bytes(body[pos : pos + 2], "big")  # the format codes
    return _counted_values(body, pos, "Bind")[0]


def _counted_values(
    body: bytes, pos: int, what: str, *, head: bool = False
) -> tuple[list[bytes | None], int]:
    """A count (Int16) and that many length-prefixed values (-1: NULL) from pos, as DataRow
    and Bind carry them; and where they end. head: body is the first bytes of a longer
    message, so the values end where it is cut instead of being malformed there."""
    if pos + 2 > len(body):
        raise ProtocolViolation(f"malformed {what}")
    count = int.from_bytes(body[pos : pos + 2], "big")
    values: list[bytes | None] = []
    pos += 2
    for _ in range(count):
        if pos + 4 > len(body):
            if head:
                break
            raise ProtocolViolation(f"malformed {what}")
        length = int.from_bytes(body[pos : pos + 4], "big", signed=True)
        pos += 4
        if length < 0:
            values.append(None)
            continue
        if pos + length > len(body):
            if head:
                break
            raise ProtocolViolation(f"{what} value runs past the message")
        values.append(body[pos : pos + length])
        pos += length
    return values, pos


def parse_parameter_status(body: bytes) -> tuple[str, str]:
    name, pos = read_cstr(body, 0)
    value, _ = read_cstr(body, pos)
    return name, value


def parse_backend_key_data(body: bytes) -> tuple[int, int]:
    if len(body) < 8:
        raise ProtocolViolation("BackendKeyData too short")
    pid, key = _II.unpack_from(body, 0)
    return pid, key


def parse_authentication(body: bytes) -> tuple[int, bytes]:
    if len(body) < 4:
        raise ProtocolViolation("Authentication message too short")
    return _I.unpack_from(body, 0)[0], body[4:]


def parse_sasl_initial_response(body: bytes) -> tuple[str, bytes]:
    """SASLInitialResponse: mechanism name and the client-first message."""
    mechanism, pos = read_cstr(body, 0)
    if len(body) < pos + 4:
        raise ProtocolViolation("SASLInitialResponse too short")
    length = _I.unpack_from(body, pos)[0]
    data = body[pos + 4 :]
    if length != 0xFFFFFFFF and length != len(data):
        raise ProtocolViolation("SASLInitialResponse length mismatch")
    return mechanism, data


def parse_password(body: bytes) -> bytes:
    """PasswordMessage payload without its terminating NUL."""
    return body[:-1] if body.endswith(b"\x00") else body
