"""ClientAuth: the challenge each auth_type sends and how answers are checked."""

from __future__ import annotations

import struct

import pytest

from pgtarn.auth.md5 import md5_response, md5_secret
from pgtarn.auth.scram import ScramClient, make_verifier
from pgtarn.errors import AuthFailed, PgtarnError
from pgtarn.proto import build
from pgtarn.proto.client_side import ClientAuth
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
    assert info.value.message == 'password authentication failed for user "u"'


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


@pytest.mark.parametrize(
    "secret", ["pw", md5_secret("pw", "u"), make_verifier("pw").to_string()]
)
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


def test_trust_and_any() -> None:
    auth = ClientAuth("trust", "u", "x")
    assert auth.start() == build.AUTH_OK and auth.done
    with pytest.raises(PgtarnError) as info:
        ClientAuth("trust", "nobody", None)
    assert info.value.sqlstate == "28000"
    assert ClientAuth("any", "nobody", None).start() == build.AUTH_OK
