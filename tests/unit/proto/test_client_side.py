"""ClientAuth: the challenge each auth_type sends and how answers are checked."""

from __future__ import annotations

import base64
import hashlib
import struct

import pytest

from pgtarn.auth import scram
from pgtarn.auth.md5 import md5_response, md5_secret
from pgtarn.auth.scram import ScramClient, make_verifier
from pgtarn.errors import AuthFailed, PgtarnError
from pgtarn.proto import build
from pgtarn.proto.client_side import (
    _PLAIN_VERIFIERS,
    _PLAIN_VERIFIERS_MAX,
    ClientAuth,
    _plain_verifier,
    forget_derived_secrets,
)
from pgtarn.proto.framing import split_messages


def request_code(message: bytes) -> int:
    msg_type, body = split_messages(message)[0]
    assert msg_type == ord("R")
    return int(struct.unpack("!I", body[:4])[0])


def scram_login(auth: ClientAuth, password: str) -> bytes:
    client = ScramClient(password)
    assert request_code(auth.start()) == 10
    first = build.sasl_initial_response("SCRAM-SHA-256", client.client_first())
    reply = split_messages(auth.feed(first[5:]))
    server_first = reply[0][1][4:]
    return auth.feed(client.handle_server_first(server_first))


@pytest.mark.parametrize("secret", ["pw", make_verifier("pw").to_string()])
def test_scram_with_plain_or_verifier_secret(secret: str) -> None:
    auth = ClientAuth("scram-sha-256", "u", secret)
    final = split_messages(scram_login(auth, "pw"))
    assert [request_code(build.message(b"R", body)) for _, body in final] == [12, 0]
    assert auth.done
    # passthrough keys only exist when a verifier is stored
    assert (auth.scram_keys is not None) == secret.startswith("SCRAM")


@pytest.mark.parametrize("secret", ["pw", make_verifier("pw").to_string(), None])
def test_scram_wrong_password_or_unknown_user(secret: str | None) -> None:
    auth = ClientAuth("scram-sha-256", "u", secret)
    with pytest.raises(AuthFailed) as info:
        scram_login(auth, "nope" if secret else "pw")
    assert info.value.sqlstate == "28P01"
    assert info.value.message == "SASL authentication failed"


def test_md5_with_plain_and_hashed_secret() -> None:
    for secret in ("pw", md5_secret("pw", "u")):
        auth = ClientAuth("md5", "u", secret)
        start = split_messages(auth.start())[0][1]
        salt = start[4:8]
        assert auth.feed(md5_response("pw", "u", salt) + b"\x00") == build.AUTH_OK
        auth = ClientAuth("md5", "u", secret)
        auth.start()
        with pytest.raises(AuthFailed):
            auth.feed(md5_response("bad", "u", b"0000"))


def test_md5_auth_type_with_scram_secret_uses_scram() -> None:
    auth = ClientAuth("md5", "u", make_verifier("pw").to_string())
    assert request_code(auth.start()) == 10


@pytest.mark.parametrize("secret", ["pw", md5_secret("pw", "u"), make_verifier("pw").to_string()])
def test_plain_against_every_secret_kind(secret: str) -> None:
    auth = ClientAuth("plain", "u", secret)
    assert request_code(auth.start()) == 3
    assert auth.feed(b"pw\x00") == build.AUTH_OK
    auth = ClientAuth("plain", "u", secret)
    auth.start()
    with pytest.raises(AuthFailed):
        auth.feed(b"wrong\x00")


def test_plaintext_password_that_looks_like_md5_prefix() -> None:
    auth = ClientAuth("scram-sha-256", "u", "md5_pass")
    scram_login(auth, "md5_pass")
    assert auth.done


def test_an_empty_secret_matches_no_password_and_trust_lets_it_in() -> None:
    """A role auth_query found with a NULL password ("" in auth_file likewise): as in
    PgBouncer, no password matches it, not even an empty one; trust admits its user."""
    for password in ("", "md5", "u"):
        auth = ClientAuth("md5", "u", "")
        salt = split_messages(auth.start())[0][1][4:8]
        with pytest.raises(AuthFailed):
            auth.feed(md5_response(password, "u", salt) + b"\x00")
        auth = ClientAuth("plain", "u", "")
        auth.start()
        with pytest.raises(AuthFailed):
            auth.feed(password.encode() + b"\x00")
        with pytest.raises(AuthFailed, match="SASL authentication failed"):
            scram_login(ClientAuth("scram-sha-256", "u", ""), password)
    auth = ClientAuth("trust", "u", "")
    assert auth.start() == build.AUTH_OK and auth.done


def test_trust_and_any() -> None:
    auth = ClientAuth("trust", "u", "x")
    assert auth.start() == build.AUTH_OK and auth.done
    with pytest.raises(PgtarnError) as info:
        ClientAuth("trust", "nobody", None)
    assert info.value.sqlstate == "28000"
    assert ClientAuth("any", "nobody", None).start() == build.AUTH_OK


def server_first_salt(auth: ClientAuth) -> str:
    """The salt (s=) a SCRAM login is challenged with."""
    assert request_code(auth.start()) == 10
    first = build.sasl_initial_response("SCRAM-SHA-256", ScramClient("x").client_first())
    server_first = split_messages(auth.feed(first[5:]))[0][1][4:].decode()
    return dict(part.split("=", 1) for part in server_first.split(","))["s"]


def test_unknown_users_are_challenged_without_pbkdf2_and_each_with_a_stable_salt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_pbkdf2(*args: object) -> bytes:
        raise AssertionError("PBKDF2 run for a made-up user")

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", no_pbkdf2)  # (what scram calls)
    salts = {
        name: server_first_salt(ClientAuth("scram-sha-256", name, None))
        for name in ("ghost", "ghost2", "\udcff")
    }
    assert len(set(salts.values())) == 3  # one salt per name, as PostgreSQL keeps per role
    assert server_first_salt(ClientAuth("scram-sha-256", "ghost", None)) == salts["ghost"]
    assert len(base64.b64decode(salts["ghost"])) == 16  # as long as a real verifier's salt


def test_passwords_typed_by_clients_are_never_cached() -> None:
    verifier = make_verifier("pw", iterations=16).to_string()
    before = scram._salted_password.cache_info().currsize
    for attempt in ("pw", "wrong", "also wrong"):
        auth = ClientAuth("plain", "u", verifier)
        auth.start()
        if attempt == "pw":
            assert auth.feed(b"pw\x00") == build.AUTH_OK
            assert auth.scram_keys is not None  # passthrough keys from the one PBKDF2 run
        else:
            with pytest.raises(AuthFailed):
                auth.feed(attempt.encode() + b"\x00")
    assert scram._salted_password.cache_info().currsize == before


def test_reload_forgets_the_verifiers_made_from_plaintext_secrets() -> None:
    salt = server_first_salt(ClientAuth("scram-sha-256", "u", "pw"))
    assert server_first_salt(ClientAuth("scram-sha-256", "u", "pw")) == salt  # made once
    forget_derived_secrets()
    assert server_first_salt(ClientAuth("scram-sha-256", "u", "pw")) != salt


def test_plain_verifiers_are_kept_per_secret_and_bounded() -> None:
    forget_derived_secrets()
    first = _plain_verifier("u", "pw", 1)
    assert _plain_verifier("u", "pw", 1) is first  # derived once
    # a changed password is another verifier (a salt of its own), never the old one
    changed = _plain_verifier("u", "new", 1)
    assert changed is not first and changed.salt != first.salt
    for n in range(_PLAIN_VERIFIERS_MAX):
        _plain_verifier(f"user{n}", "pw", 1)
    assert len(_PLAIN_VERIFIERS) == _PLAIN_VERIFIERS_MAX
    assert ("u", "pw", 1) not in _PLAIN_VERIFIERS  # the oldest went first
    forget_derived_secrets()
    assert not _PLAIN_VERIFIERS
