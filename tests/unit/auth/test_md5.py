"""Unit tests for PostgreSQL md5 password hashing."""

from __future__ import annotations

import hashlib

import pytest

from pgtarn.auth.md5 import is_md5_secret, md5_response, md5_secret, md5_verify

SALT = b"\x01\x02\x03\x04"


def _md5hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_md5_secret_known_value() -> None:
    expected = "md5" + _md5hex(b"penciluser")
    assert md5_secret("pencil", "user") == expected
    assert is_md5_secret(expected)
    assert len(expected) == 35


def test_md5_secret_non_ascii_is_utf8() -> None:
    assert md5_secret("pässwörd", "üser") == "md5" + _md5hex("pässwördüser".encode())


def test_md5_response_matches_protocol() -> None:
    inner = _md5hex(b"penciluser")
    expected = b"md5" + _md5hex(inner.encode() + SALT).encode()
    assert md5_response("pencil", "user", SALT) == expected
    assert not md5_response("pencil", "user", SALT).endswith(b"\x00")


def test_md5_response_plaintext_and_prehashed_agree() -> None:
    hashed = md5_secret("pencil", "user")
    assert md5_response(hashed, "user", SALT) == md5_response("pencil", "user", SALT)
    # An upper-case hex hash is the same hash.
    upper = "md5" + hashed[3:].upper()
    assert md5_response(upper, "user", SALT) == md5_response("pencil", "user", SALT)


def test_md5_response_depends_on_salt_and_user() -> None:
    base = md5_response("pencil", "user", SALT)
    assert md5_response("pencil", "user", b"\x00\x00\x00\x00") != base
    assert md5_response("pencil", "other", SALT) != base


def test_md5_verify() -> None:
    response = md5_response("pencil", "user", SALT)
    for secret in ("pencil", md5_secret("pencil", "user")):
        assert md5_verify(secret, "user", SALT, response)
        assert md5_verify(secret, "user", SALT, response + b"\x00")
        assert not md5_verify(secret, "user", SALT, md5_response("wrong", "user", SALT))
        assert not md5_verify(secret, "user", b"\x09\x09\x09\x09", response)
        assert not md5_verify(secret, "user", SALT, b"")
        assert not md5_verify(secret, "user", SALT, b"\xff" * 35)


@pytest.mark.parametrize(
    "text",
    ["", "md5", "md5" + "0" * 31, "md5" + "0" * 33, "md5" + "g" * 32, "MD5" + "0" * 32, "pencil"],
)
def test_not_md5_secrets(text: str) -> None:
    assert not is_md5_secret(text)


def test_plaintext_that_looks_short_of_md5_is_hashed() -> None:
    # "md5" + 31 hex digits is a plaintext password, not a hash.
    secret = "md5" + "a" * 31
    assert md5_response(secret, "user", SALT) == (
        b"md5" + _md5hex(_md5hex(secret.encode() + b"user").encode() + SALT).encode()
    )
