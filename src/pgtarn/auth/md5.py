"""PostgreSQL md5 password hashing: stored secrets, client responses and their check."""

from __future__ import annotations

import hashlib
import hmac
import re

__all__ = ["is_md5_secret", "md5_response", "md5_secret", "md5_verify"]

_MD5_SECRET = re.compile(r"md5[0-9a-fA-F]{32}")


def _utf8(text: str) -> bytes:
    # surrogateescape lets a secret read from a non-UTF-8 file keep its raw bytes.
    return text.encode("utf-8", "surrogateescape")


def _md5hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def is_md5_secret(secret: str) -> bool:
    """Whether `secret` is a stored md5 hash: "md5" followed by 32 hex digits."""
    return _MD5_SECRET.fullmatch(secret) is not None


def md5_secret(password: str, user: str) -> str:
    """The secret PostgreSQL stores for `password`: "md5" + md5hex(password + user)."""
    return "md5" + _md5hex(_utf8(password) + _utf8(user))


def md5_response(secret: str, user: str, salt: bytes) -> bytes:
    """The PasswordMessage payload answering AuthenticationMD5Password with `salt`.

    `secret` is a plaintext password or an already hashed "md5..." secret; the
    result is b"md5" + md5hex(md5hex(password + user) + salt), without a NUL.
    """
    inner = secret[3:].lower() if is_md5_secret(secret) else md5_secret(secret, user)[3:]
    return b"md5" + _md5hex(inner.encode("ascii") + bytes(salt)).encode("ascii")


def md5_verify(secret: str, user: str, salt: bytes, response: bytes) -> bool:
    """Check a client's md5 `response` against `secret` in constant time.

    A single trailing NUL (the C string terminator) on `response` is tolerated.
    """
    got = bytes(response)
    if got.endswith(b"\x00"):
        got = got[:-1]
    return hmac.compare_digest(md5_response(secret, user, salt), got)
