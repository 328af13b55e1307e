"""SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL speaks it, for both ends, sans-IO.

Long: both ends of the exchange read and write the same messages with the same checks and
keys; split by end, each half would be read against the other.
"""

from __future__ import annotations

import binascii
import enum
import hashlib
import hmac
import os
import re
import secrets
import stringprep
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from pgtarn import native
from pgtarn.errors import AuthFailed, ProtocolViolation

__all__ = [
    "MECHANISM",
    "MECHANISM_PLUS",
    "ScramClient",
    "ScramServer",
    "ScramVerifier",
    "choose_mechanism",
    "client_key_for",
    "forget_salted_passwords",
    "make_verifier",
    "parse_sasl_mechanisms",
    "parse_verifier",
    "saslprep",
    "stored_key_for",
]

MECHANISM: Final = "SCRAM-SHA-256"
MECHANISM_PLUS: Final = "SCRAM-SHA-256-PLUS"
#: The one channel-binding type PostgreSQL implements.
CBIND_TYPE: Final = "tls-server-end-point"
DEFAULT_ITERATIONS: Final = 4096
MAX_CLIENT_ITERATIONS = 10_000_000  # a malicious server must not make us spin for ever
MAX_MESSAGE: Final = 8192
_NONCE_BYTES: Final = 18
_SALT_BYTES = 16
_KEY_LEN: Final = 32
_INT32_MAX = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,10}")


# The C functions a login calls, as constants: compiled, a module's attribute is a generic
# lookup at each use (about 250 instructions), a Final one a C value.
_SHA256: Final = hashlib.sha256
_B2A_BASE64: Final = binascii.b2a_base64
_A2B_BASE64: Final = binascii.a2b_base64
_COMPARE_DIGEST: Final = hmac.compare_digest
_URANDOM: Final = os.urandom
_FROM_BYTES: Final = int.from_bytes

#: native/_scram.c's server nonce, reading of the usual client-first-message and check of a
#: client-final-message, when this build has it (else None).
_SERVER_NONCE: Final = native.server_nonce
_SERVER_FIRST: Final = native.server_first
_SERVER_FINAL: Final = native.server_final
_HMAC_KEYS: Final = native.hmac_keys
#: The GS2 headers of the usual client-first-messages (no authzid), for native/_scram.c.
_GS2_N: Final = "n,,"
_GS2_Y: Final = "y,,"
_GS2_PLUS: Final = f"p={CBIND_TYPE},,"


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.digest(key, msg, "sha256")


#: HMAC's key pads (RFC 2104): each key byte XOR 0x36 (inner) or 0x5C (outer).
_INNER_PAD = bytes(x ^ 0x36 for x in range(256))
_OUTER_PAD = bytes(x ^ 0x5C for x in range(256))
_BLOCK: Final = 64  # SHA-256's block size


#: At most this many entries in each of the module's caches (the oldest goes first).
_CACHED: Final = 1024


def _bounded_put(cache: dict[Any, Any], key: object, value: object) -> None:
    """cache[key] = value, the oldest entry dropped when the cache is full.

    The caches a login reads are dictionaries, not functools.lru_cache: compiled, a lookup
    is a C call of about 150 instructions where the lru_cache wrapper's is about 1,000."""
    if len(cache) >= _CACHED:
        del cache[next(iter(cache))]
    cache[key] = value


# A stored verifier's StoredKey and ServerKey key two HMACs at every login of its user: the
# hash states after their padded keys are made once and copied. hmac.digest builds the MAC
# from the key each time (about 1.6 us against 0.7). Bounded; RELOAD clears it.
_KEY_PADS: Final[dict[bytes, tuple[Any, Any]]] = {}


def _key_pads(key: bytes) -> tuple[Any, Any]:
    pads = _KEY_PADS.get(key)
    if pads is None:
        padded = (_h(key) if len(key) > _BLOCK else key).ljust(_BLOCK, b"\0")
        pads = (
            hashlib.sha256(padded.translate(_INNER_PAD)),
            hashlib.sha256(padded.translate(_OUTER_PAD)),
        )
        _bounded_put(_KEY_PADS, key, pads)
    return pads


#: What native/_scram.c needs of a verifier (its keys' pad states), by StoredKey, with the
#: ServerKey they were made with. Bounded; RELOAD clears it.
_NATIVE_KEYS: Final[dict[bytes, tuple[bytes, bytes]]] = {}


def _native_keys(v: ScramVerifier) -> bytes:
    known = _NATIVE_KEYS.get(v.stored_key)
    if known is None or known[0] != v.server_key:
        assert _HMAC_KEYS is not None
        known = (v.server_key, _HMAC_KEYS(v.stored_key, v.server_key))
        _bounded_put(_NATIVE_KEYS, v.stored_key, known)
    return known[1]


def _keyed_hmac(key: bytes, msg: bytes) -> bytes:
    """HMAC-SHA-256 of msg with a key used again and again (a stored verifier's)."""
    inner_pad, outer_pad = _key_pads(key)
    inner = inner_pad.copy()
    inner.update(msg)
    outer = outer_pad.copy()
    outer.update(inner.digest())
    digest: bytes = outer.digest()
    return digest


def _h(data: bytes) -> bytes:
    digest: bytes = _SHA256(data).digest()
    return digest


def _xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise ValueError("_xor of strings of different lengths")
    # one big-integer XOR: a bytes() of a generator costs a Python step per byte
    return (_FROM_BYTES(a, "big") ^ _FROM_BYTES(b, "big")).to_bytes(len(a), "big")


def _b64(data: bytes) -> str:
    # binascii, not base64: base64's functions are Python wrappers around these calls
    return _B2A_BASE64(data, newline=False).decode("ascii")


def _b64decode(value: str, what: str) -> bytes:
    try:
        return _A2B_BASE64(value, strict_mode=True)  # b64decode(validate=True)
    except ValueError:  # binascii.Error, UnicodeEncodeError
        raise ProtocolViolation(f"malformed SCRAM message: invalid base64 in {what}") from None


def _is_printable(nonce: str) -> bool:
    """RFC 5802 `printable`: ASCII 0x21-0x7E except ','; must not be empty."""
    # two C calls and two searches (in ASCII only the space is printable below 0x21 and
    # nothing above 0x7E): compiled, a loop over the code points cost about 100
    # instructions per character
    return (
        bool(nonce)
        and nonce.isascii()
        and nonce.isprintable()
        and " " not in nonce
        and "," not in nonce
    )


def _new_nonce() -> str:
    if _SERVER_NONCE is not None:
        nonce = _SERVER_NONCE()  # getrandom(2) and base64 in C
        if nonce is not None:
            return nonce
    return _b64(_URANDOM(_NONCE_BYTES))  # what secrets.token_bytes reads, without its wrappers


_sp = stringprep
_PROHIBITED: tuple[Callable[[str], bool], ...] = (
    *(_sp.in_table_c12, _sp.in_table_c21, _sp.in_table_c22, _sp.in_table_c3, _sp.in_table_c4),
    *(_sp.in_table_c5, _sp.in_table_c6, _sp.in_table_c7, _sp.in_table_c8, _sp.in_table_c9),
    _sp.in_table_a1,  # unassigned code points: PostgreSQL refuses them too
)


def saslprep(password: str) -> bytes:
    """The password bytes PostgreSQL feeds to PBKDF2 for SCRAM.

    Mirrors PostgreSQL's pg_saslprep(): pure ASCII is used unchanged; otherwise
    RFC 4013 SASLprep is applied (map non-ASCII spaces to ' ', drop B.1, NFKC,
    refuse C.1.2-C.9 and unassigned code points, RFC 3454 bidi rule) with the
    stdlib `stringprep` tables (Unicode 3.2, as PostgreSQL). If SASLprep refuses
    the password, its raw UTF-8 bytes are used, as PostgreSQL does. Characters
    decoded with "surrogateescape" are turned back into their original bytes.
    """
    raw = password.encode("utf-8", "surrogateescape")
    if password.isascii():
        return raw
    mapped = "".join(" " if _sp.in_table_c12(c) else c for c in password if not _sp.in_table_b1(c))
    norm = unicodedata.normalize("NFKC", mapped)
    if any(table(c) for c in norm for table in _PROHIBITED):
        return raw
    if any(_sp.in_table_d1(c) for c in norm) and (
        any(_sp.in_table_d2(c) for c in norm)
        or not (_sp.in_table_d1(norm[0]) and _sp.in_table_d1(norm[-1]))
    ):
        return raw
    return norm.encode("utf-8")


# -- stored verifiers ---------------------------------------------------------------------


@dataclass(frozen=True)
class ScramVerifier:
    """A stored SCRAM-SHA-256 secret: what the server keeps instead of the password."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def to_string(self) -> str:
        """PostgreSQL's text form: SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>."""
        return (
            f"{MECHANISM}${self.iterations}:{_b64(self.salt)}"
            f"${_b64(self.stored_key)}:{_b64(self.server_key)}"
        )


# Cached: a client's login parses its user's stored secret each time, and a verifier is
# immutable. Bounded; the texts are auth_file or auth_query secrets, already held in memory.
_PARSED: Final[dict[str, ScramVerifier | None]] = {}


def parse_verifier(s: str) -> ScramVerifier | None:
    """Parse PostgreSQL's SCRAM verifier text; None when `s` is not one."""
    if s in _PARSED:
        return _PARSED[s]
    verifier = _parse_verifier(s)
    _bounded_put(_PARSED, s, verifier)
    return verifier


def _parse_verifier(s: str) -> ScramVerifier | None:
    parts = s.split("$")
    if len(parts) != 3 or parts[0] != MECHANISM:
        return None
    iter_salt, keys = parts[1].split(":"), parts[2].split(":")
    if len(iter_salt) != 2 or len(keys) != 2 or not _DIGITS.fullmatch(iter_salt[0]):
        return None
    iterations = int(iter_salt[0])
    if not 1 <= iterations <= _INT32_MAX:
        return None
    try:
        salt, stored, server = (_b64decode(v, "verifier") for v in (iter_salt[1], *keys))
    except ProtocolViolation:
        return None
    if not salt or len(stored) != _KEY_LEN or len(server) != _KEY_LEN:
        return None
    return ScramVerifier(iterations, salt, stored, server)


@lru_cache(maxsize=256)
def _salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    # Cached for logins towards PostgreSQL only: it sends the same salt for a role at every
    # login, so a pool opening servers pays PBKDF2 (blocking the event loop) once per role,
    # not once per server. Never for passwords a client typed: those must not linger here.
    return hashlib.pbkdf2_hmac("sha256", saslprep(password), salt, iterations)


def forget_salted_passwords() -> None:
    """Drop the cached derivations (RELOAD: the passwords they came from may be gone)."""
    _salted_password.cache_clear()
    _KEY_PADS.clear()
    _NATIVE_KEYS.clear()
    _SALT_AND_ITERATIONS.clear()


def client_key_for(password: str, salt: bytes, iterations: int) -> bytes:
    """The ClientKey a password yields with a salt (PBKDF2 each time: nothing is kept)."""
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password), salt, iterations)
    return _hmac(salted, b"Client Key")


def stored_key_for(client_key: bytes) -> bytes:
    """The StoredKey a verifier keeps for a ClientKey."""
    return _h(client_key)


def make_verifier(
    password: str, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
) -> ScramVerifier:
    """Derive the verifier PostgreSQL would store for `password` (random 16-byte salt)."""
    if iterations < 1:
        raise ValueError("iterations must be at least 1")
    if salt is None:
        salt = secrets.token_bytes(_SALT_BYTES)
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return ScramVerifier(iterations, bytes(salt), _h(client_key), _hmac(salted, b"Server Key"))


# -- message parsing ----------------------------------------------------------------------


def _decode(data: bytes, what: str) -> str:
    # (bytes() of bytes is a generic call when compiled: a copy only of a bytearray or view)
    raw = data if isinstance(data, bytes) else bytes(data)
    if len(raw) > MAX_MESSAGE:
        raise ProtocolViolation(f"malformed SCRAM message: {what} is too long")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolViolation(f"malformed SCRAM message: {what} is not UTF-8") from None


def _attrs(text: str, what: str) -> list[tuple[str, str]]:
    """Split "a=v,b=w" into pairs; each attribute name is one ASCII letter."""
    out = []
    for item in text.split(","):
        # an ASCII letter, either case (code | 0x20: its lower case), then "="
        if len(item) < 2 or item[1] != "=" or not 0x61 <= (ord(item[0]) | 0x20) <= 0x7A:
            raise ProtocolViolation(f"malformed SCRAM message: bad attribute in {what}")
        out.append((item[0], item[2:]))
    return out


def _expect(attrs: list[tuple[str, str]], pos: int, name: str, what: str) -> str:
    if pos >= len(attrs) or attrs[pos][0] != name:
        raise ProtocolViolation(f'malformed SCRAM message: {what} lacks attribute "{name}"')
    return attrs[pos][1]


def _refuse_mandatory_extension(attrs: list[tuple[str, str]]) -> None:
    if attrs and attrs[0][0] == "m":
        raise ProtocolViolation("SCRAM message requires an unsupported extension")


#: The server-first-message's end (",s=<salt>,i=<iterations>") by salt: the same for every
#: login of a user. Bounded; RELOAD clears it.
_SALT_AND_ITERATIONS: Final[dict[bytes, tuple[int, str]]] = {}
#: The base64 of a channel-binding input ("n,,", "y,,", or -PLUS's with the certificate's
#: hash): a few distinct ones. Bounded.
_CHANNEL_B64: Final[dict[bytes, str]] = {}


def _salt_and_iterations(v: ScramVerifier) -> str:
    known = _SALT_AND_ITERATIONS.get(v.salt)
    if known is None or known[0] != v.iterations:
        known = (v.iterations, f",s={_b64(v.salt)},i={v.iterations}")
        _bounded_put(_SALT_AND_ITERATIONS, v.salt, known)
    return known[1]


def _channel_b64(cbind_input: bytes) -> str:
    known = _CHANNEL_B64.get(cbind_input)
    if known is None:
        known = _b64(cbind_input)
        _bounded_put(_CHANNEL_B64, cbind_input, known)
    return known


def _escape_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class _State(enum.Enum):
    START = enum.auto()
    FIRST_DONE = enum.auto()
    DONE = enum.auto()
    FAILED = enum.auto()


class _Exchange:
    """The state shared by both halves: which message comes next."""

    _state = _State.START

    @property
    def done(self) -> bool:
        """Whether the exchange completed and the peer proved itself."""
        return self._state is _State.DONE

    def _step(self, expected: _State) -> None:
        """Refuse an out-of-order message; stay FAILED until the message is accepted."""
        ok = self._state is expected
        self._state = _State.FAILED
        if not ok:
            raise ProtocolViolation("unexpected SCRAM message")


# -- server side (authenticating clients) -------------------------------------------------


class ScramServer(_Exchange):
    """The server half of one SCRAM-SHA-256 exchange with a connecting client."""

    def __init__(
        self,
        secret: ScramVerifier | str,
        *,
        nonce: str | None = None,
        channel_binding: bytes | None = None,
        native: bool = True,
    ) -> None:
        """`secret` is a verifier or a plaintext password; `nonce` fixes the server nonce.

        channel_binding: the tls-server-end-point data of this TLS connection (the hash of
        our certificate); then SCRAM-SHA-256-PLUS is offered too. native: False runs the
        pure path even where native/_scram.c is built (the tests run both).
        """
        if nonce is not None and not _is_printable(nonce):
            raise ValueError("server nonce must be printable ASCII without ','")
        self._verifier = secret if isinstance(secret, ScramVerifier) else make_verifier(secret)
        self._server_nonce = nonce if nonce is not None else _new_nonce()
        self._channel_binding = channel_binding
        self._mechanism = MECHANISM
        self._cbind_input = b""
        self._nonce = ""
        self._auth_prefix = ""
        self._expected_final = ""
        self._client_key: bytes | None = None
        self._native = native and _SERVER_FINAL is not None

    def mechanisms(self) -> list[str]:
        """Mechanisms to list in AuthenticationSASL, the channel-bound one first."""
        if self._channel_binding is not None:
            return [MECHANISM_PLUS, MECHANISM]
        return [MECHANISM]

    def select(self, mechanism: str) -> None:
        """The mechanism the client chose in SASLInitialResponse."""
        if mechanism not in self.mechanisms():
            raise AuthFailed(f"unsupported SASL mechanism {mechanism!r}", sqlstate="28000")
        self._mechanism = mechanism

    @property
    def channel_bound(self) -> bool:
        """Whether the exchange is bound to the TLS channel (SCRAM-SHA-256-PLUS)."""
        return self._mechanism == MECHANISM_PLUS

    @property
    def verifier(self) -> ScramVerifier:
        """The verifier the client is checked against."""
        return self._verifier

    @property
    def client_key(self) -> bytes:
        """ClientKey recovered from the proof; only after a successful exchange."""
        if self._client_key is None:
            raise RuntimeError("SCRAM exchange has not completed successfully")
        return self._client_key

    def handle_client_first(self, data: bytes) -> bytes:
        """Take the client-first-message, return the server-first-message."""
        self._step(_State.START)
        if self._native and _SERVER_FIRST is not None:
            # the usual message, in C: the GS2 header it starts with, by its flag (""
            # for any other flag); None for any other message, which the code below reads
            # and names
            binding = self._channel_binding
            if self._mechanism == MECHANISM_PLUS:
                header = _GS2_PLUS
            elif data[:1] == b"n":
                header, binding = _GS2_N, b""
            elif data[:1] == b"y" and binding is None:  # (bound, "y" is a downgrade: below)
                header, binding = _GS2_Y, b""
            else:
                header = ""
            if header and binding is not None:
                tail = _salt_and_iterations(self._verifier)
                done = _SERVER_FIRST(data, header, binding, self._server_nonce, tail)
                if done is not None:
                    nonce, self._auth_prefix, self._expected_final, reply, cbind_input = done
                    self._nonce, self._cbind_input = nonce, cbind_input
                    self._state = _State.FIRST_DONE
                    return reply
        text = _decode(data, "client-first-message")
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ProtocolViolation("malformed SCRAM message: missing GS2 header")
        cbind, authzid, bare = parts
        if self._mechanism == MECHANISM_PLUS:
            if cbind != f"p={CBIND_TYPE}":
                raise ProtocolViolation(
                    "SCRAM-SHA-256-PLUS needs channel-binding type " + CBIND_TYPE
                    if cbind.startswith("p=")
                    else "malformed SCRAM message: SCRAM-SHA-256-PLUS without channel binding"
                )
            assert self._channel_binding is not None
            self._cbind_input = f"{cbind},,".encode() + self._channel_binding
        elif cbind.startswith("p="):
            raise ProtocolViolation(
                "malformed SCRAM message: channel binding asked for with SCRAM-SHA-256"
            )
        elif cbind == "y" and self._channel_binding is not None:
            # The client can bind but believes we cannot, though we offered -PLUS: someone
            # in between removed it from the list (a downgrade).
            raise ProtocolViolation(
                "SCRAM channel binding negotiation error: the client supports channel "
                "binding but thinks the server does not, yet this server does"
            )
        elif cbind not in ("n", "y"):
            raise ProtocolViolation("malformed SCRAM message: bad channel-binding flag")
        else:
            self._cbind_input = f"{cbind},,".encode()
        if authzid:
            raise ProtocolViolation("SCRAM authorization identity is not supported")
        comma = bare.find(",")
        simple = comma > 0 and bare[:2] == "n=" and bare[comma + 1 : comma + 3] == "r="
        if simple and bare.find(",", comma + 1) < 0:
            # "n=<name>,r=<nonce>", as every client sends it: no split into attributes
            client_nonce = bare[comma + 3 :]
        else:
            attrs = _attrs(bare, "client-first-message")
            _refuse_mandatory_extension(attrs)
            _expect(attrs, 0, "n", "client-first-message")  # PostgreSQL ignores the username
            client_nonce = _expect(attrs, 1, "r", "client-first-message")
        if not _is_printable(client_nonce):
            raise ProtocolViolation("malformed SCRAM message: client nonce is not printable")
        self._nonce = client_nonce + self._server_nonce
        server_first = "r=" + self._nonce + _salt_and_iterations(self._verifier)
        self._auth_prefix = f"{bare},{server_first},"
        # the client-final-message without its proof, as a client that follows the
        # exchange sends it (no extensions): handle_client_final's one comparison
        self._expected_final = "c=" + _channel_b64(self._cbind_input) + ",r=" + self._nonce
        self._state = _State.FIRST_DONE
        return server_first.encode("ascii")

    def _check_final_attributes(self, without_proof: str) -> None:
        """The channel binding and the nonce of a client-final-message (its proof cut off)
        that is not the one expected: each checked, and what is wrong told."""
        attrs = _attrs(without_proof, "client-final-message")
        cbind = _b64decode(_expect(attrs, 0, "c", "client-final-message"), "channel binding")
        if not _COMPARE_DIGEST(cbind, self._cbind_input):
            # for -PLUS: the client's TLS channel is not ours (a man in the middle)
            raise ProtocolViolation("SCRAM channel binding check failed")
        if _expect(attrs, 1, "r", "client-final-message") != self._nonce:
            raise ProtocolViolation("malformed SCRAM message: nonce does not match")

    def handle_client_final(self, data: bytes) -> bytes:
        """Check the client-final-message's proof, return the server-final-message."""
        self._step(_State.FIRST_DONE)
        done = None
        if self._native and _SERVER_FINAL is not None:
            # the usual message, in C; None for any other, which _final reads and names
            keys = _native_keys(self._verifier)
            done = _SERVER_FINAL(data, self._expected_final, self._auth_prefix, keys)
        client_key, final = self._final(data) if done is None else done
        if not final:
            raise AuthFailed("password authentication failed (SCRAM proof mismatch)")
        self._client_key = client_key
        self._state = _State.DONE
        return final

    def _final(self, data: bytes) -> tuple[bytes, bytes]:
        """ClientKey and the server-final-message of a client-final-message, the message
        b"" when the proof is wrong; an error for a malformed message. What native/_scram.c
        computes for the usual one."""
        text = _decode(data, "client-final-message")
        cut = text.rfind(",p=")
        if cut < 0:
            raise ProtocolViolation("malformed SCRAM message: client proof is missing")
        without_proof = text[:cut]
        if without_proof != self._expected_final:  # else its attributes are as expected
            self._check_final_attributes(without_proof)
        proof = _b64decode(text[cut + 3 :], "client proof")
        if len(proof) != _KEY_LEN:
            raise ProtocolViolation("malformed SCRAM message: client proof has the wrong size")
        auth_message = (self._auth_prefix + without_proof).encode("utf-8")
        v = self._verifier
        client_key = _xor(proof, _keyed_hmac(v.stored_key, auth_message))
        if not _COMPARE_DIGEST(_h(client_key), v.stored_key):
            return client_key, b""
        return client_key, b"v=" + _b64(_keyed_hmac(v.server_key, auth_message)).encode("ascii")


# -- client side (logging in to PostgreSQL) -----------------------------------------------


class ScramClient(_Exchange):
    """The client half of a SCRAM-SHA-256 exchange with a PostgreSQL server.

    Give either the plaintext `password`, or for passthrough the `client_key`
    recovered by a ScramServer plus the `server_key` of the stored verifier.
    """

    def __init__(
        self,
        password: str | None = None,
        *,
        client_key: bytes | None = None,
        server_key: bytes | None = None,
        username: str = "",
        nonce: str | None = None,
        channel_binding: bytes | None = None,
        can_bind: bool = False,
    ) -> None:
        """channel_binding: the tls-server-end-point data, for SCRAM-SHA-256-PLUS. can_bind:
        on TLS, but the server did not offer -PLUS (the GS2 flag "y" tells it so)."""
        if password is not None and (client_key, server_key) != (None, None):
            raise ValueError("give either a password or client_key/server_key, not both")
        keys = (client_key or b"", server_key or b"")
        if password is None and {len(keys[0]), len(keys[1])} != {_KEY_LEN}:
            raise ValueError("passthrough needs a 32-byte client_key and server_key")
        if nonce is not None and not _is_printable(nonce):
            raise ValueError("client nonce must be printable ASCII without ','")
        self._password = password
        self._client_key = client_key
        self._server_key = server_key
        self._nonce = nonce if nonce is not None else _new_nonce()
        self._bare = f"n={_escape_saslname(username)},r={self._nonce}"
        if channel_binding is not None:
            header = f"p={CBIND_TYPE},,"
            self._cbind_input = header.encode() + channel_binding
        else:
            header = "y,," if can_bind else "n,,"
            self._cbind_input = header.encode()
        self._gs2_header = header
        self._first_sent = False
        self._auth_message = b""

    def client_first(self) -> bytes:
        """The client-first-message for SASLInitialResponse."""
        self._first_sent = True
        return f"{self._gs2_header}{self._bare}".encode()

    def handle_server_first(self, data: bytes) -> bytes:
        """Take the server-first-message, return the client-final-message."""
        if not self._first_sent:
            raise ProtocolViolation("unexpected SCRAM message")
        self._step(_State.START)
        text = _decode(data, "server-first-message")
        attrs = _attrs(text, "server-first-message")
        _refuse_mandatory_extension(attrs)
        nonce = _expect(attrs, 0, "r", "server-first-message")
        salt = _b64decode(_expect(attrs, 1, "s", "server-first-message"), "salt")
        iter_text = _expect(attrs, 2, "i", "server-first-message")
        if not _is_printable(nonce) or not nonce.startswith(self._nonce):
            raise ProtocolViolation("malformed SCRAM message: server nonce does not match")
        if len(nonce) == len(self._nonce):
            raise ProtocolViolation("malformed SCRAM message: server nonce is empty")
        if not salt:
            raise ProtocolViolation("malformed SCRAM message: empty salt")
        if not _DIGITS.fullmatch(iter_text) or not (1 <= int(iter_text) <= MAX_CLIENT_ITERATIONS):
            raise ProtocolViolation("malformed SCRAM message: invalid iteration count")
        if self._password is not None:
            salted = _salted_password(self._password, salt, int(iter_text))
            client_key = _hmac(salted, b"Client Key")
            self._server_key = _hmac(salted, b"Server Key")
        else:
            assert self._client_key is not None
            client_key = self._client_key
        without_proof = f"c={_b64(self._cbind_input)},r={nonce}"
        self._auth_message = f"{self._bare},{text},{without_proof}".encode()
        proof = _xor(client_key, _hmac(_h(client_key), self._auth_message))
        self._state = _State.FIRST_DONE
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def handle_server_final(self, data: bytes) -> None:
        """Check the server-final-message; AuthFailed on an error or a bad signature."""
        self._step(_State.FIRST_DONE)
        text = _decode(data, "server-final-message")
        attrs = _attrs(text, "server-final-message")
        if attrs[0][0] == "e":
            raise AuthFailed(f"server rejected SCRAM authentication: {attrs[0][1]}")
        signature = _b64decode(_expect(attrs, 0, "v", "server-final-message"), "signature")
        assert self._server_key is not None
        expected = _hmac(self._server_key, self._auth_message)
        if not hmac.compare_digest(signature, expected):
            raise AuthFailed("SCRAM server signature is wrong: the server is not trusted")
        self._state = _State.DONE


# -- mechanism negotiation ----------------------------------------------------------------


def parse_sasl_mechanisms(payload: bytes) -> list[str]:
    """Decode an AuthenticationSASL body: NUL-terminated names, then an empty one."""
    raw = bytes(payload)
    if raw == b"\x00":
        return []
    names = raw[:-2].split(b"\x00")
    if not raw.endswith(b"\x00\x00") or b"" in names:
        raise ProtocolViolation("malformed AuthenticationSASL message")
    try:
        return [name.decode("utf-8") for name in names]
    except UnicodeDecodeError:
        raise ProtocolViolation("malformed AuthenticationSASL message: not UTF-8") from None


def choose_mechanism(offered: list[str], can_bind: bool = False, require: bool = False) -> str:
    """Pick among the server's offer: SCRAM-SHA-256-PLUS when the connection can be bound
    (TLS) and it is offered, else SCRAM-SHA-256 unless binding is required."""
    if can_bind and MECHANISM_PLUS in offered:
        return MECHANISM_PLUS
    if require:
        raise AuthFailed(
            "channel binding is required, but the server did not offer "
            "SCRAM-SHA-256-PLUS" + ("" if can_bind else " (no TLS)"),
            sqlstate="08006",
        )
    if MECHANISM in offered:
        return MECHANISM
    raise AuthFailed(
        "server offered no supported SASL mechanism: " + ", ".join(offered or ["none"])
    )
