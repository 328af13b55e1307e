"""Property-based fuzzing of client authentication: SCRAM, md5 and plain answers to ClientAuth."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.auth import scram
from pgtarn.auth.md5 import md5_response, md5_secret
from pgtarn.auth.scram import ScramClient, make_verifier
from pgtarn.errors import AuthFailed, PgtarnError, ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.client_side import ClientAuth
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_password

FUZZ = settings(max_examples=150, deadline=None, database=None)
ITERATIONS = 3  # fast SCRAM verifiers
USER = "alice"

ascii_passwords = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=16
)
passwords = st.one_of(
    ascii_passwords,
    st.text(
        st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
        min_size=1,
        max_size=12,
    ),
)
printable = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=","),
    min_size=1,
    max_size=30,
)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """data with a spot flipped, cut out, junk (often SCRAM syntax) inserted, or truncated."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(out)))
        kind = draw(st.sampled_from(["flip", "cut", "insert", "token", "truncate", "grow"]))
        if kind == "flip" and pos < len(out):
            out[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del out[pos : pos + draw(st.integers(1, 6))]
        elif kind == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "token":
            out[pos:pos] = draw(
                st.sampled_from(
                    [
                        b",",
                        b"=",
                        b"n,,",
                        b"y,,",
                        b"p=tls-unique,",
                        b"a=x",
                        b"m=ext,",
                        b",x=y",
                        b"r=",
                        b"c=biws",
                        b",p=",
                        b"\xff",
                        b"\x00",
                        b"==",
                        b"eSws",
                    ]
                )
            )
        elif kind == "truncate":
            del out[pos:]
        else:
            out[pos:pos] = b"A" * 9000  # oversized: past SCRAM's message limit
    return bytes(out)


def sasl_initial(client_first: bytes, mechanism: str = "SCRAM-SHA-256") -> bytes:
    return build.sasl_initial_response(mechanism, client_first)[5:]


def request(reply: bytes) -> tuple[int, bytes]:
    """The (code, payload) of the first Authentication message in reply."""
    msg_type, body = split_messages(reply)[0]
    assert msg_type == ord("R")
    return struct.unpack_from("!I", body)[0], body[4:]


def secret_for(kind: str, password: str) -> str:
    if kind == "scram":
        return make_verifier(password, iterations=ITERATIONS).to_string()
    if kind == "md5":
        return md5_secret(password, USER)
    return password


def assert_failed_for_good(auth: ClientAuth, retry: bytes) -> None:
    """After an error: not done, no keys, and even a good message is refused from now on."""
    assert not auth.done and auth.scram_keys is None and auth.failed
    with pytest.raises(PgtarnError):
        auth.feed(retry)
    assert not auth.done and auth.scram_keys is None


# --- SCRAM with the project's own client, messages mutated ---------------------------------


@FUZZ
@given(
    password=passwords,
    secret_kind=st.sampled_from(["plain", "scram"]),
    auth_type=st.sampled_from(["scram-sha-256", "md5"]),
    data=st.data(),
    damage=st.sampled_from(["none", "first", "final", "both"]),
)
def test_scram_login_with_damaged_messages_never_succeeds_with_other_bytes(
    password: str, secret_kind: str, auth_type: str, data: st.DataObject, damage: str
) -> None:
    if auth_type == "md5" and secret_kind != "scram":
        auth_type = "scram-sha-256"  # md5 only switches to SCRAM for a stored verifier
    secret = secret_for(secret_kind, password)
    auth = ClientAuth(auth_type, USER, secret, scram_iterations=ITERATIONS)
    assert request(auth.start())[0] == 10
    client = ScramClient(password)
    first = client.client_first()
    sent_first = data.draw(mutated(first)) if damage in ("first", "both") else first
    try:
        code, server_first = request(auth.feed(sasl_initial(sent_first)))
    except PgtarnError:
        assert_failed_for_good(auth, sasl_initial(first))
        return
    assert code == 11
    try:
        final = client.handle_server_first(server_first)
    except ProtocolViolation:
        assert sent_first != first  # only a damaged client-first can confuse the client
        return
    sent_final = data.draw(mutated(final)) if damage in ("final", "both") else final
    try:
        reply = auth.feed(sent_final)
    except PgtarnError:
        assert_failed_for_good(auth, final)
        assert (sent_first, sent_final) != (first, final), "a correct login was refused"
        return
    # Success: with the very messages the client made (the proof may differ only in base64
    # bits that do not count).
    assert auth.done and not auth.failed
    assert sent_first == first
    cut = final.rindex(b",p=")
    assert sent_final[: cut + 3] == final[: cut + 3]
    assert base64.b64decode(sent_final[cut + 3 :]) == base64.b64decode(final[cut + 3 :])
    (_, server_final), (_, ok) = split_messages(reply)
    assert struct.unpack_from("!I", server_final)[0] == 12 and ok == struct.pack("!I", 0)
    client.handle_server_final(server_final[4:])
    assert client.done
    if secret_kind == "scram":  # passthrough keys: what a ScramClient needs to log in alone
        verifier = scram.parse_verifier(secret)
        assert verifier is not None
        salted = hashlib.pbkdf2_hmac("sha256", scram.saslprep(password), verifier.salt, ITERATIONS)
        assert auth.scram_keys == (
            hmac.digest(salted, b"Client Key", "sha256"),
            hmac.digest(salted, b"Server Key", "sha256"),
        )
    else:
        assert auth.scram_keys is None


# --- SCRAM with a hand-made client: each field of both client messages varied --------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@st.composite
def client_firsts(draw: st.DrawFn) -> tuple[str, str, str, str]:
    """(client-first-message, GS2 header, client nonce, expected outcome)."""
    outcome = "ok"
    flag = draw(
        st.sampled_from(["n", "n", "y", "p=tls-server-end-point", "p=", "", "N", "yy", "x"])
    )
    if flag not in ("n", "y"):
        # "p=": channel binding data with plain SCRAM-SHA-256 (no TLS here): as PostgreSQL,
        # a malformed message
        outcome = "violation"
    authzid = draw(st.sampled_from(["", "", "a=someone", "a="]))
    if authzid and outcome == "ok":
        outcome = "violation"
    nonce_kind = draw(st.sampled_from(["ok", "ok", "empty", "comma", "unprintable", "long"]))
    nonce = draw(printable)
    if nonce_kind == "empty":
        nonce = ""
    elif nonce_kind == "unprintable":
        nonce += draw(st.sampled_from([" ", "\x7f", "é", "\t"]))
    elif nonce_kind == "long":
        nonce = nonce * (9000 // len(nonce) + 1)  # past SCRAM's message limit
    elif nonce_kind == "comma":
        nonce += ",junk"  # becomes a bad attribute
    if nonce_kind != "ok" and outcome == "ok":
        outcome = "violation"
    user = draw(st.sampled_from(["", "alice", "=2C=3D", "ignored"]))
    attrs = [f"n={user}", f"r={nonce}"]
    layout = draw(
        st.sampled_from(["ok", "ok", "ext", "mandatory", "swapped", "no-n", "no-r", "bad-attr"])
    )
    if layout == "ext":
        attrs.append("x=extension")
    elif layout == "mandatory":
        attrs.insert(0, "m=must-understand")
    elif layout == "swapped":
        attrs.reverse()
    elif layout == "no-n":
        del attrs[0]
    elif layout == "no-r":
        del attrs[1]
    elif layout == "bad-attr":
        attrs.append(draw(st.sampled_from(["1=x", "xx", "=", "", "x"])))
    if layout != "ok" and layout != "ext" and outcome == "ok":
        outcome = "violation"
    text = f"{flag},{authzid}," + ",".join(attrs)
    if len(text) > scram.MAX_MESSAGE:  # the size is checked before anything else
        outcome = "violation"
    return text, f"{flag},{authzid},", nonce, outcome


@FUZZ
@given(first=client_firsts(), password=ascii_passwords)
def test_client_first_messages_are_accepted_exactly_when_well_formed(
    first: tuple[str, str, str, str], password: str
) -> None:
    text, _gs2, nonce, outcome = first
    auth = ClientAuth("scram-sha-256", USER, password, scram_iterations=ITERATIONS)
    auth.start()
    if outcome == "ok":
        code, server_first = request(auth.feed(sasl_initial(text.encode())))
        assert code == 11
        assert server_first.startswith(b"r=" + nonce.encode()) and b",s=" in server_first
        assert server_first.endswith(b",i=%d" % ITERATIONS)
        return
    with pytest.raises(PgtarnError) as info:
        auth.feed(sasl_initial(text.encode()))
    assert isinstance(info.value, ProtocolViolation)
    assert_failed_for_good(auth, sasl_initial(b"n,,n=,r=abc"))


@st.composite
def client_finals(draw: st.DrawFn) -> tuple[str, str, str, str]:
    """Choices for a client-final-message: (cbind, nonce, extension, proof) kinds."""
    return (
        draw(st.sampled_from(["ok", "ok", "ok", "other-flag", "raw", "bad-b64", "authzid"])),
        draw(st.sampled_from(["ok", "ok", "ok", "client-only", "longer", "shorter", "missing"])),
        draw(st.sampled_from(["none", "none", "ext", "bad-ext"])),
        draw(
            st.sampled_from(
                [
                    "ok",
                    "ok",
                    "ok",
                    "wrong",
                    "short",
                    "long",
                    "bad-b64",
                    "missing",
                    "empty",
                    "twice",
                    "odd-bits",
                    "wrong-password",
                ]
            )
        ),
    )


def odd_bits(digit: str) -> str:
    """The last base64 digit of 32 bytes with its 2 unused bits set: the same bytes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    return alphabet[alphabet.index(digit) | 3]


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


@FUZZ
@given(
    flag=st.sampled_from(["n", "y"]),
    client_nonce=printable,
    password=ascii_passwords,
    secret_kind=st.sampled_from(["plain", "scram"]),
    final=client_finals(),
)
def test_client_final_messages_get_the_outcome_their_fields_call_for(
    flag: str,
    client_nonce: str,
    password: str,
    secret_kind: str,
    final: tuple[str, str, str, str],
) -> None:
    cbind_kind, nonce_kind, ext_kind, proof_kind = final
    auth = ClientAuth(
        "scram-sha-256", USER, secret_for(secret_kind, password), scram_iterations=ITERATIONS
    )
    auth.start()
    gs2 = f"{flag},,"
    bare = f"n=,r={client_nonce}"
    _, server_first_raw = request(auth.feed(sasl_initial((gs2 + bare).encode())))
    server_first = server_first_raw.decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
    assert nonce.startswith(client_nonce) and len(nonce) > len(client_nonce)

    outcome = "ok"
    cbind = {
        "ok": b64(gs2.encode()),
        "other-flag": b64(("y,," if flag == "n" else "n,,").encode()),
        "raw": gs2.replace(",", ""),
        "bad-b64": "!!!!",
        "authzid": b64(b"n,a=x,"),
    }[cbind_kind]
    if cbind_kind != "ok":
        outcome = "violation"
    sent_nonce = {
        "ok": nonce,
        "client-only": client_nonce,
        "longer": nonce + "x",
        "shorter": nonce[:-1],
        "missing": None,
    }[nonce_kind]
    if nonce_kind != "ok":
        outcome = "violation"
    attrs = [f"c={cbind}"] + ([f"r={sent_nonce}"] if sent_nonce is not None else [])
    if ext_kind == "ext":
        attrs.append("x=extension")  # allowed; the proof covers it
    elif ext_kind == "bad-ext":
        attrs.append("1=x")
        outcome = "violation"
    without_proof = ",".join(attrs)
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    key_password = password + "!" if proof_kind == "wrong-password" else password
    salted = salted_password(key_password, salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    proof = bytes(
        a ^ b
        for a, b in zip(client_key, hmac.digest(stored_key, auth_message, "sha256"), strict=True)
    )
    good = b64(proof)
    proof_text = {
        "ok": f",p={good}",
        "wrong": f",p={b64(bytes([proof[0] ^ 1]) + proof[1:])}",
        "short": f",p={b64(proof[:31])}",
        "long": f",p={b64(proof + b'x')}",
        "bad-b64": f",p={good[:-2]}*=",
        "missing": "",
        "empty": ",p=",
        "twice": f",p={good},p={good}",
        "wrong-password": f",p={good}",
        "odd-bits": f",p={good[:-2]}{odd_bits(good[-2])}=",
    }[proof_kind]
    if outcome == "ok" and proof_kind in ("short", "long", "bad-b64", "missing", "empty"):
        outcome = "violation"
    elif outcome == "ok" and proof_kind in ("wrong", "wrong-password", "twice"):
        # "twice": the first p= is an extension the proof does not cover
        outcome = "failed"
    message = (without_proof + proof_text).encode()
    if outcome == "ok":
        (_, server_final), _ok = split_messages(auth.feed(message))
        server_key = hmac.digest(salted, b"Server Key", "sha256")
        signature = hmac.digest(server_key, auth_message, "sha256")
        assert server_final[4:] == b"v=" + b64(signature).encode()
        assert auth.done
        assert (auth.scram_keys is not None) == (secret_kind == "scram")
        return
    with pytest.raises(PgtarnError) as info:
        auth.feed(message)
    expected = AuthFailed if outcome == "failed" else ProtocolViolation
    assert type(info.value) is expected, (outcome, info.value)
    if outcome == "failed":
        assert info.value.sqlstate == "28P01"
        assert info.value.message == "SASL authentication failed"
    assert_failed_for_good(auth, message)


@FUZZ
@given(secret_kind=st.sampled_from(["none", "md5"]), data=st.data(), password=ascii_passwords)
def test_scram_for_an_unknown_user_or_an_md5_secret_always_fails_like_a_wrong_password(
    secret_kind: str, data: st.DataObject, password: str
) -> None:
    secret = None if secret_kind == "none" else md5_secret(password, USER)
    auth = ClientAuth("scram-sha-256", USER, secret, scram_iterations=ITERATIONS)
    auth.start()
    client = ScramClient(password)
    try:
        _, server_first = request(auth.feed(sasl_initial(client.client_first())))
        final = client.handle_server_first(server_first)
        auth.feed(data.draw(st.one_of(st.just(final), mutated(final))))
    except AuthFailed as error:
        assert error.message == "SASL authentication failed"
    except ProtocolViolation:
        pass
    else:
        raise AssertionError("an unknown user or an md5 secret passed SCRAM")
    assert not auth.done and auth.scram_keys is None


@FUZZ
@given(
    body=st.one_of(
        st.binary(max_size=100),
        st.builds(
            lambda m, d: m + b"\x00" + d,
            st.sampled_from(
                [b"SCRAM-SHA-256", b"SCRAM-SHA-256-PLUS", b"", b"scram-sha-256", b"\xff"]
            ),
            st.binary(max_size=40),
        ),
        st.builds(
            lambda n, d: b"SCRAM-SHA-256\x00" + struct.pack("!I", n) + d,
            st.sampled_from([0, 1, 2**31, 2**32 - 1, 11]),
            st.binary(max_size=40),
        ),
    )
)
def test_sasl_initial_response_garbage_is_refused_cleanly(body: bytes) -> None:
    auth = ClientAuth("scram-sha-256", USER, "pw", scram_iterations=ITERATIONS)
    auth.start()
    try:
        code, _ = request(auth.feed(body))
    except PgtarnError:
        assert_failed_for_good(auth, sasl_initial(b"n,,n=,r=abc"))
        return
    assert code == 11
    mechanism, _, rest = body.partition(b"\x00")
    assert mechanism == b"SCRAM-SHA-256"
    length = struct.unpack_from("!I", rest)[0]
    assert length in (len(rest) - 4, 2**32 - 1)


# --- md5 and plain --------------------------------------------------------------------------


@FUZZ
@given(
    password=passwords,
    secret_kind=st.sampled_from(["plain", "md5", "none"]),
    data=st.data(),
    damage=st.booleans(),
)
def test_md5_answers_pass_only_when_they_are_the_right_hash(
    password: str, secret_kind: str, data: st.DataObject, damage: bool
) -> None:
    secret = None if secret_kind == "none" else secret_for(secret_kind, password)
    auth = ClientAuth("md5", USER, secret)
    code, salt = request(auth.start())
    assert code == 5 and len(salt) == 4
    right = md5_response(password, USER, salt) + b"\x00"
    answer = data.draw(mutated(right)) if damage else right
    try:
        assert auth.feed(answer) == build.AUTH_OK
    except AuthFailed as error:
        assert error.sqlstate == "28P01" and not auth.done
        assert secret is None or md5_compared(answer) != md5_compared(right)
        assert_failed_for_good(auth, right)
        return
    assert secret is not None and auth.done
    assert md5_compared(answer) == md5_compared(right)


def md5_compared(payload: bytes) -> bytes:
    """What of an md5 PasswordMessage is compared with the right answer: the string without
    its terminating NUL (parse_password), and without one more NUL (md5_verify tolerates a
    terminator on what it is given); any other NUL is part of the answer."""
    answer = parse_password(payload)
    return answer[:-1] if answer.endswith(b"\x00") else answer


def test_an_md5_answer_with_three_nuls_is_refused() -> None:
    """Found by the property above, whose oracle took it for the right answer."""
    auth = ClientAuth("md5", USER, secret_for("plain", "0"))
    _code, salt = request(auth.start())
    with pytest.raises(AuthFailed):
        auth.feed(md5_response("0", USER, salt) + b"\x00\x00\x00")


@FUZZ
@given(
    password=passwords,
    secret_kind=st.sampled_from(["plain", "md5", "scram", "none"]),
    data=st.data(),
    damage=st.booleans(),
)
def test_plain_answers_pass_only_with_the_password(
    password: str, secret_kind: str, data: st.DataObject, damage: bool
) -> None:
    secret = None if secret_kind == "none" else secret_for(secret_kind, password)
    auth = ClientAuth("plain", USER, secret)
    assert request(auth.start())[0] == 3
    right = password.encode() + b"\x00"
    answer = data.draw(mutated(right)) if damage else right
    try:
        assert auth.feed(answer) == build.AUTH_OK
    except AuthFailed as error:
        assert error.sqlstate == "28P01" and not auth.done
        assert secret is None or answer != right
        assert_failed_for_good(auth, right)
        return
    assert secret is not None and auth.done
    given_password = (answer[:-1] if answer.endswith(b"\x00") else answer).decode()
    if secret_kind == "scram":
        # Spellings SASLprep makes equal are the same password; so are ones differing by
        # trailing NULs, which HMAC (PBKDF2's PRF) pads its key with anyway.
        assert scram.saslprep(given_password).rstrip(b"\x00") == scram.saslprep(password).rstrip(
            b"\x00"
        )
        assert auth.scram_keys is not None
    else:
        assert given_password == password


@pytest.mark.parametrize("auth_type", ["plain", "md5"])
def test_regression_no_second_try_after_a_wrong_password(auth_type: str) -> None:
    # A ClientAuth used to check password after password for as long as it was fed.
    auth = ClientAuth(auth_type, USER, "pw")
    _, salt = request(auth.start())
    right = (b"pw" if auth_type == "plain" else md5_response("pw", USER, salt)) + b"\x00"
    with pytest.raises(AuthFailed):
        auth.feed(b"wrong\x00")
    with pytest.raises(ProtocolViolation, match="after a failed authentication"):
        auth.feed(right)
    assert not auth.done and auth.failed
