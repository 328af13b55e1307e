"""Unit tests for the sans-IO SCRAM-SHA-256 client and server."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn import native
from pgtarn.auth.scram import (
    _KEY_PADS,
    _NATIVE_KEYS,
    ScramClient,
    ScramServer,
    ScramVerifier,
    _keyed_hmac,
    choose_mechanism,
    forget_salted_passwords,
    make_verifier,
    parse_sasl_mechanisms,
    parse_verifier,
    saslprep,
)
from pgtarn.errors import AuthFailed, ProtocolViolation

# RFC 7677 section 3 test vector.
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

RFC_VERIFIER = make_verifier("pencil", salt=RFC_SALT, iterations=4096)
ESCAPES = (AuthFailed, ProtocolViolation)
FUZZ = settings(max_examples=300, deadline=None, database=None)
#: The server's tests run twice: through native/_scram.c where the build has it (else the
#: same pure path again), and through the pure path.
BOTH_PATHS = pytest.mark.parametrize("native_path", [True, False], ids=["native", "pure"])


def _mutate(msg: bytes, pos: int, junk: bytes, cut: bool) -> bytes:
    pos %= len(msg) + 1
    return msg[:pos] + junk + msg[pos + (len(junk) if cut else 0) :]


_PIECES = [
    *(b"n", b"y", b"p=x", b",", b"n=", b"r=", b"c=", b"p=", b"m=", b"s=", b"i=", b"v=", b"e="),
    *(b"biws", b"eSws", b"=", b"\xff", b"\x00", b"A==", b"4096", RFC_CLIENT_NONCE.encode()),
    *(RFC_SERVER_NONCE.encode(), b"dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="),
]
_JUNK_ARGS = (st.binary(max_size=3), st.booleans())
_MESSAGES = [RFC_CLIENT_FIRST, RFC_SERVER_FIRST, RFC_CLIENT_FINAL, RFC_SERVER_FINAL]
# Random bytes, random runs of SCRAM-ish tokens, and valid messages with a spot damaged.
JUNK = st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from(_PIECES), max_size=16).map(b"".join),
    st.builds(_mutate, st.sampled_from(_MESSAGES), st.integers(0, 200), *_JUNK_ARGS),
)


def rfc_client() -> ScramClient:
    return ScramClient("pencil", username="user", nonce=RFC_CLIENT_NONCE)


def rfc_server(native_path: bool = True) -> ScramServer:
    return ScramServer(RFC_VERIFIER, nonce=RFC_SERVER_NONCE, native=native_path)


def login(server: ScramServer, client: ScramClient) -> None:
    server_first = server.handle_client_first(client.client_first())
    server_final = server.handle_client_final(client.handle_server_first(server_first))
    client.handle_server_final(server_final)


def test_rfc7677_client_side() -> None:
    client = rfc_client()
    assert client.client_first() == RFC_CLIENT_FIRST
    assert client.handle_server_first(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.handle_server_final(RFC_SERVER_FINAL)
    assert client.done


@BOTH_PATHS
def test_rfc7677_server_side(native_path: bool) -> None:
    server = rfc_server(native_path)
    assert server.mechanisms() == ["SCRAM-SHA-256"]
    assert server.handle_client_first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.handle_client_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.done
    assert server.verifier is RFC_VERIFIER
    assert hashlib.sha256(server.client_key).digest() == RFC_VERIFIER.stored_key


def test_rfc7677_passthrough_client_reproduces_vector() -> None:
    server = rfc_server()
    server.handle_client_first(RFC_CLIENT_FIRST)
    server.handle_client_final(RFC_CLIENT_FINAL)
    client = ScramClient(client_key=server.client_key, server_key=RFC_VERIFIER.server_key,
                         username="user", nonce=RFC_CLIENT_NONCE)  # fmt: skip
    client.client_first()
    assert client.handle_server_first(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.handle_server_final(RFC_SERVER_FINAL)


@FUZZ
@given(key=st.binary(max_size=200), msg=st.binary(max_size=300))
def test_keyed_hmac_is_hmac_sha256(key: bytes, msg: bytes) -> None:
    # keys up to and past SHA-256's 64-byte block; each pad state is copied, never consumed
    assert _keyed_hmac(key, msg) == hmac.digest(key, msg, "sha256")
    assert _keyed_hmac(key, msg + b"x") == hmac.digest(key, msg + b"x", "sha256")


def test_reload_forgets_key_pads() -> None:
    key = bytes(range(32))
    _keyed_hmac(key, b"m")
    assert _KEY_PADS
    forget_salted_passwords()
    assert not _KEY_PADS


@BOTH_PATHS
def test_server_accepts_any_username(native_path: bool) -> None:
    for name in ("", "someone", "=2Cweird=3D", "ünïcode"):
        server = ScramServer(RFC_VERIFIER, native=native_path)
        client = ScramClient("pencil", username=name)
        login(server, client)
        assert server.done and client.done


@BOTH_PATHS
def test_round_trip_plaintext_secret(native_path: bool) -> None:
    server = ScramServer("s3cret pw", native=native_path)
    client = ScramClient("s3cret pw")
    login(server, client)
    assert client.done and server.done
    assert server.verifier.iterations == 4096


@BOTH_PATHS
@pytest.mark.parametrize("cbind", [b"eSws", b"biws"])
def test_y_flag_needs_matching_channel_binding_echo(cbind: bytes, native_path: bool) -> None:
    # A "y,," header must be echoed as c=eSws (base64 of "y,,"); proof built by hand.
    server = ScramServer(RFC_VERIFIER, nonce="abc", native=native_path)
    first = server.handle_client_first(b"y,,n=,r=xyz")
    client_key = hmac.digest(
        hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096), b"Client Key", "sha256"
    )
    without_proof = b"c=" + cbind + b",r=xyzabc"
    auth = b"n=,r=xyz," + first + b"," + without_proof
    sig = hmac.digest(hashlib.sha256(client_key).digest(), auth, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))
    final = without_proof + b",p=" + base64.b64encode(proof)
    if cbind == b"eSws":
        assert server.handle_client_final(final).startswith(b"v=")
    else:
        with pytest.raises(ProtocolViolation):
            server.handle_client_final(final)


@BOTH_PATHS
def test_round_trip_passthrough(native_path: bool) -> None:
    verifier = make_verifier("hunter2")
    first = ScramServer(verifier, native=native_path)
    login(first, ScramClient("hunter2"))
    # The pooler now logs in to "PostgreSQL" (another server holding the verifier).
    backend = ScramServer(verifier)
    client = ScramClient(client_key=first.client_key, server_key=verifier.server_key)
    login(backend, client)
    assert backend.done and client.done


@BOTH_PATHS
def test_wrong_password_fails(native_path: bool) -> None:
    server = ScramServer(make_verifier("right"), native=native_path)
    client = ScramClient("wrong")
    server_first = server.handle_client_first(client.client_first())
    with pytest.raises(AuthFailed) as info:
        server.handle_client_final(client.handle_server_first(server_first))
    assert info.value.sqlstate == "28P01"
    assert not server.done
    with pytest.raises(RuntimeError):
        _ = server.client_key


@pytest.mark.parametrize("final", [b"v=" + base64.b64encode(bytes(32)), b"e=invalid-proof"])
def test_client_rejects_wrong_signature_or_server_error(final: bytes) -> None:
    client = rfc_client()
    client.client_first()
    client.handle_server_first(RFC_SERVER_FIRST)
    with pytest.raises(AuthFailed, match=r"signature is wrong|invalid-proof"):
        client.handle_server_final(final)
    assert not client.done


def test_passthrough_client_with_wrong_server_key_rejects_server() -> None:
    server = rfc_server()
    server.handle_client_first(RFC_CLIENT_FIRST)
    server.handle_client_final(RFC_CLIENT_FINAL)
    client = ScramClient(client_key=server.client_key, server_key=b"\x01" * 32, nonce="abc")
    backend = ScramServer(RFC_VERIFIER)
    with pytest.raises(AuthFailed):
        login(backend, client)


def test_out_of_order_messages() -> None:
    with pytest.raises(ProtocolViolation):
        rfc_server().handle_client_final(RFC_CLIENT_FINAL)
    with pytest.raises(ProtocolViolation):
        rfc_client().handle_server_first(RFC_SERVER_FIRST)
    client = rfc_client()
    client.client_first()
    with pytest.raises(ProtocolViolation):
        client.handle_server_final(RFC_SERVER_FINAL)
    server = rfc_server()
    server.handle_client_first(RFC_CLIENT_FIRST)
    with pytest.raises(ProtocolViolation):
        server.handle_client_first(RFC_CLIENT_FIRST)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"password": "pw", "client_key": b"x" * 32, "server_key": b"y" * 32},
        {"client_key": b"x" * 32},
        {"client_key": b"x" * 31, "server_key": b"y" * 32},
        {"password": "pw", "nonce": "a,b"},
    ],
)
def test_client_constructor_checks_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ScramClient(**kwargs)


def test_client_first_defaults() -> None:
    msg = ScramClient("pw").client_first()
    assert msg.startswith(b"n,,n=,r=")
    assert len(msg) == len(b"n,,n=,r=") + 24  # base64 of 18 random bytes
    assert ScramClient("pw", username="a=b,c").client_first().startswith(b"n,,n=a=3Db=2Cc,r=")


def test_make_verifier_matches_postgres_derivation() -> None:
    salt = bytes(range(16))
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    b64 = [base64.b64encode(v).decode() for v in (salt, stored_key, server_key)]
    expected = f"SCRAM-SHA-256$4096:{b64[0]}${b64[1]}:{b64[2]}"
    verifier = make_verifier("pencil", salt=salt)
    assert verifier.to_string() == expected
    assert parse_verifier(expected) == verifier


def test_make_verifier_random_salt() -> None:
    a, b = make_verifier("pw", iterations=1), make_verifier("pw", iterations=1)
    assert len(a.salt) == 16 and a.salt != b.salt
    with pytest.raises(ValueError):
        make_verifier("pw", iterations=0)


def test_verifier_text_round_trips() -> None:
    text = RFC_VERIFIER.to_string()
    assert text.startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$")
    parsed = parse_verifier(text)
    assert isinstance(parsed, ScramVerifier)
    assert parsed.to_string() == text


K = "A" * 43 + "="  # base64 of a 32-byte key


@pytest.mark.parametrize(
    "text",
    [
        *("", "pencil", "md5" + "0" * 32, f"SCRAM-SHA-1$4096:c2FsdA==${K}:{K}"),
        *(f"SCRAM-SHA-256${i}:c2FsdA==${K}:{K}" for i in ("0", "-1", "x", "", "99999999999")),
        *(f"SCRAM-SHA-256$4096:c2Fsd!==${K}:{K}", f"SCRAM-SHA-256$4096:${K}:{K}"),
        *(f"SCRAM-SHA-256$4096:c2FsdA==${'A' * 40}==:{K}", f"SCRAM-SHA-256$4096:c2FsdA==${K}"),
        *(f"SCRAM-SHA-256$4096:c2FsdA==${K}:{K}$x", f"SCRAM-SHA-256$4096:c2FsdA==:x${K}:{K}"),
    ],
)
def test_parse_verifier_rejects(text: str) -> None:
    assert parse_verifier(text) is None
    assert parse_verifier(f"SCRAM-SHA-256$4096:c2FsdA==${K}:{K}") is not None


def test_saslprep() -> None:
    assert saslprep("pencil") == b"pencil"
    assert saslprep("a\x01b") == b"a\x01b"  # ASCII is never touched, as in PostgreSQL
    assert saslprep("I\u00adX") == b"IX"  # soft hyphen is mapped to nothing (B.1)
    assert saslprep("a\u00a0b") == b"a b"  # non-ASCII space becomes a space
    assert saslprep("\u2168") == b"IX"  # NFKC
    assert saslprep("\u00aa") == b"a"
    # Prohibited output (C.2.2 control) falls back to the raw UTF-8 bytes.
    assert saslprep("\u0080x") == "\u0080x".encode()
    # Bidi rule: RandALCat mixed with LCat is refused, so the raw bytes are used.
    assert saslprep("\u0627a") == "\u0627a".encode()
    assert saslprep("\ufe8d\u0628") == "\u0627\u0628".encode()  # all RandALCat: fine, NFKC


@BOTH_PATHS
def test_non_ascii_password_round_trip(native_path: bool) -> None:
    # SASLprep (NFKC) makes U+2168 ROMAN NUMERAL NINE the same password as "IX"; the umlaut stays
    verifier = make_verifier("p\u00e4ss\u2168", iterations=16)
    server, client = ScramServer(verifier, native=native_path), ScramClient("p\u00e4ssIX")
    login(server, client)
    assert server.done and client.done
    with pytest.raises(AuthFailed, match="proof mismatch"):
        login(ScramServer(verifier, native=native_path), ScramClient("passIX"))


def test_choose_mechanism_without_tls() -> None:
    assert choose_mechanism(["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]) == "SCRAM-SHA-256"
    assert choose_mechanism(["SCRAM-SHA-256"]) == "SCRAM-SHA-256"
    with pytest.raises(AuthFailed):
        choose_mechanism(["SCRAM-SHA-256-PLUS"])
    with pytest.raises(AuthFailed):
        choose_mechanism([])


def test_parse_sasl_mechanisms() -> None:
    payload = b"SCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00"
    assert parse_sasl_mechanisms(payload) == ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]
    assert parse_sasl_mechanisms(b"\x00") == []
    for bad in (b"", b"SCRAM-SHA-256", b"SCRAM-SHA-256\x00", b"A\x00\x00B\x00", b"\xff\x00\x00"):
        with pytest.raises(ProtocolViolation):
            parse_sasl_mechanisms(bad)


@BOTH_PATHS
@pytest.mark.parametrize(
    "msg",
    [
        *(b"", b"n", b"n,", b"x,,n=,r=abc", b"n,a=admin,n=,r=abc", b"n,,r=abc", b"n,,n=,r="),
        *(b"n,,n=,r=ab\x01c", b"n,,n=,r=ab c", b"n,,m=ext,n=,r=abc", b"n,,r=abc,n=", b"n,,n=,"),
        *(b"n,,n=,r=\xff\xfe", b"n,,n=,r=" + b"a" * 9000, b"n,,n=,r=abc,=x", b"n,,n=,r=abc,1=x"),
    ],
)
def test_client_first_malformed(msg: bytes, native_path: bool) -> None:
    with pytest.raises(ProtocolViolation):
        ScramServer(RFC_VERIFIER, native=native_path).handle_client_first(msg)


@BOTH_PATHS
def test_channel_binding_data_without_plus_is_malformed(native_path: bool) -> None:
    with pytest.raises(ProtocolViolation, match="channel binding asked for with SCRAM-SHA-256"):
        ScramServer(RFC_VERIFIER, native=native_path).handle_client_first(
            b"p=tls-server-end-point,,n=,r=abc"
        )


BINDING = hashlib.sha256(b"our certificate").digest()


def bound_exchange(client: ScramClient, server: ScramServer, mechanism: str) -> None:
    server.select(mechanism)
    final = client.handle_server_first(server.handle_client_first(client.client_first()))
    client.handle_server_final(server.handle_client_final(final))


@BOTH_PATHS
def test_plus_exchange_binds_both_sides_to_the_same_channel(native_path: bool) -> None:
    server = ScramServer(
        make_verifier("pw", iterations=16), channel_binding=BINDING, native=native_path
    )
    assert server.mechanisms() == ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]
    client = ScramClient("pw", channel_binding=BINDING)
    assert client.client_first().startswith(b"p=tls-server-end-point,,")
    bound_exchange(client, server, "SCRAM-SHA-256-PLUS")
    assert client.done and server.done and server.channel_bound


@BOTH_PATHS
def test_plus_proof_from_another_channel_is_refused(native_path: bool) -> None:
    # a man in the middle terminates the client's TLS: the client binds to its certificate
    server = ScramServer(
        make_verifier("pw", iterations=16), channel_binding=BINDING, native=native_path
    )
    client = ScramClient("pw", channel_binding=hashlib.sha256(b"the middle man's").digest())
    with pytest.raises(ProtocolViolation, match="channel binding check failed"):
        bound_exchange(client, server, "SCRAM-SHA-256-PLUS")
    assert not server.done


@BOTH_PATHS
def test_a_client_told_there_is_no_plus_is_caught_when_there_is(native_path: bool) -> None:
    offered = ScramServer(
        make_verifier("pw", iterations=16), channel_binding=BINDING, native=native_path
    )
    with pytest.raises(ProtocolViolation, match="negotiation error"):
        bound_exchange(ScramClient("pw", can_bind=True), offered, "SCRAM-SHA-256")
    not_offered = ScramServer(
        make_verifier("pw", iterations=16), native=native_path
    )  # no TLS: "y" is fine
    bound_exchange(ScramClient("pw", can_bind=True), not_offered, "SCRAM-SHA-256")
    assert not_offered.done and not not_offered.channel_bound


@BOTH_PATHS
@pytest.mark.parametrize(
    "first", [b"n,,n=,r=abc", b"y,,n=,r=abc", b"p=tls-unique,,n=,r=abc", b"p=,,n=,r=abc"]
)
def test_plus_needs_tls_server_end_point(first: bytes, native_path: bool) -> None:
    server = ScramServer(RFC_VERIFIER, channel_binding=BINDING, native=native_path)
    server.select("SCRAM-SHA-256-PLUS")
    with pytest.raises(ProtocolViolation):
        server.handle_client_first(first)


def test_plus_is_not_offered_without_tls() -> None:
    server = ScramServer(RFC_VERIFIER)
    assert server.mechanisms() == ["SCRAM-SHA-256"]
    with pytest.raises(AuthFailed, match="unsupported SASL mechanism") as info:
        server.select("SCRAM-SHA-256-PLUS")
    assert info.value.sqlstate == "28000"


@pytest.mark.parametrize(
    ("offered", "can_bind", "require", "chosen"),
    [
        (["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"], True, False, "SCRAM-SHA-256-PLUS"),
        (["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"], False, False, "SCRAM-SHA-256"),
        (["SCRAM-SHA-256"], True, False, "SCRAM-SHA-256"),
        (["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"], True, True, "SCRAM-SHA-256-PLUS"),
        (["SCRAM-SHA-256"], True, True, None),
        (["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"], False, True, None),
    ],
)
def test_choose_mechanism(
    offered: list[str], can_bind: bool, require: bool, chosen: str | None
) -> None:
    if chosen is not None:
        assert choose_mechanism(offered, can_bind, require) == chosen
        return
    with pytest.raises(AuthFailed, match="channel binding is required") as info:
        choose_mechanism(offered, can_bind, require)
    assert info.value.sqlstate == "08006"


_CLIENT_FINAL_DAMAGE = [
    *((b"c=biws", b"c=eSws"), (b"c=biws", b"c=bi!s"), (b"c=biws,", b""), (b",r=", b",x=")),
    *((b"r=rOpr", b"r=xOpr"), (b"p=dHzb", b"p=*Hzb")),
]


@BOTH_PATHS
@pytest.mark.parametrize(
    "msg",
    [
        *(b"", b"c=biws,r=x", b"c=biws,p=" + RFC_CLIENT_FINAL.split(b"p=")[1]),
        *(RFC_CLIENT_FINAL.replace(*swap) for swap in _CLIENT_FINAL_DAMAGE),
        *(RFC_CLIENT_FINAL[:-4], RFC_CLIENT_FINAL + b",x=1", RFC_CLIENT_FINAL + b"A" * 9000),
    ],
)
def test_client_final_malformed(msg: bytes, native_path: bool) -> None:
    server = rfc_server(native_path)
    server.handle_client_first(RFC_CLIENT_FIRST)
    with pytest.raises(ProtocolViolation):
        server.handle_client_final(msg)
    assert not server.done


@BOTH_PATHS
@pytest.mark.parametrize(
    ("swap", "message"),
    [
        ((b"c=biws", b"c=eSws"), "SCRAM channel binding check failed"),
        ((b"c=biws", b"c=bi!s"), "invalid base64 in channel binding"),
        ((b"r=rOpr", b"r=xOpr"), "nonce does not match"),
        ((b"c=biws", b"x=biws"), 'lacks attribute "c"'),
    ],
)
def test_client_final_errors_name_what_is_wrong(
    swap: tuple[bytes, bytes], message: str, native_path: bool
) -> None:
    # (a message other than the one expected is checked attribute by attribute)
    server = rfc_server(native_path)
    server.handle_client_first(RFC_CLIENT_FIRST)
    with pytest.raises(ProtocolViolation, match=message):
        server.handle_client_final(RFC_CLIENT_FINAL.replace(*swap))


def _first_outcome(native_path: bool, data: bytes, binding: bytes | None, plus: bool) -> object:
    """What a server answers to a client-first-message, and what it keeps for the final one;
    or its error."""
    server = ScramServer(
        RFC_VERIFIER, nonce=RFC_SERVER_NONCE, channel_binding=binding, native=native_path
    )
    if plus:
        server.select("SCRAM-SHA-256-PLUS")
    try:
        reply = server.handle_client_first(data)
    except (AuthFailed, ProtocolViolation) as exc:
        return type(exc), str(exc)
    kept = (server._nonce, server._auth_prefix, server._expected_final, server._cbind_input)
    return reply, kept, _final_outcome_of(server, RFC_CLIENT_FINAL)


def _usual_first(flag: str, name: str, nonce: str) -> bytes:
    return f"{flag},,n={name},r={nonce}".encode("utf-8", "surrogatepass")


#: Client-first-messages of the usual form, and near it: any name, nonces of any characters.
FIRSTS = st.one_of(
    st.builds(_usual_first, st.sampled_from(["n", "y", "p=tls-server-end-point", "x"]),
              st.text(max_size=12), st.text(min_size=0, max_size=30)),
    st.builds(_usual_first, st.sampled_from(["n", "y"]), st.text(st.characters(max_codepoint=0x7F)),
              st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7F), max_size=30)),
    JUNK,
)  # fmt: skip


@FUZZ
@given(
    data=FIRSTS,
    binding=st.sampled_from([None, BINDING, BINDING[:20], b"\x00," * 40]),
    plus=st.booleans(),
)
def test_the_native_path_reads_a_client_first_message_as_the_pure_one(
    data: bytes, binding: bytes | None, plus: bool
) -> None:
    # without TLS (no binding), with it (-PLUS offered), and -PLUS chosen
    plus = plus and binding is not None
    native_outcome = _first_outcome(True, data, binding, plus)
    assert native_outcome == _first_outcome(False, data, binding, plus)


def _final_outcome(native_path: bool, data: bytes) -> object:
    """What a server answers to a client-final-message: its reply and ClientKey, or its error."""
    server = rfc_server(native_path)
    server.handle_client_first(RFC_CLIENT_FIRST)
    return _final_outcome_of(server, data)


def _final_outcome_of(server: ScramServer, data: bytes) -> object:
    try:
        return server.handle_client_final(data), server.client_key, server.done
    except (AuthFailed, ProtocolViolation) as exc:
        return type(exc), str(exc), exc.sqlstate, server.done


_RFC_WITHOUT_PROOF = RFC_CLIENT_FINAL[: RFC_CLIENT_FINAL.rindex(b",p=")]
#: The RFC's proof with other low bits in its last character (which base64 drops), and
#: forms of a proof around the usual 43 characters and "=".
_PROOF_FORMS = [
    *(RFC_CLIENT_FINAL[:-2] + last + b"=" for last in (b"Q", b"R", b"S", b"T", b"U", b"*")),
    *(RFC_CLIENT_FINAL[:-1], RFC_CLIENT_FINAL[:-1] + b"==", RFC_CLIENT_FINAL + b"="),
    *(RFC_CLIENT_FINAL[:-2] + b"==", RFC_CLIENT_FINAL.replace(b",p=", b",p= ")),
    *(RFC_CLIENT_FINAL + b"\n", RFC_CLIENT_FINAL[:-2] + b"\xc3\xa4=", b"," + RFC_CLIENT_FINAL),
    _RFC_WITHOUT_PROOF + b",x=1,p=" + RFC_CLIENT_FINAL.rsplit(b"p=", 1)[1],
]
#: Proofs that decode, right or wrong, and damaged forms of the right one.
FINALS = st.one_of(
    st.builds(
        lambda proof: _RFC_WITHOUT_PROOF + b",p=" + base64.b64encode(proof),
        st.binary(min_size=30, max_size=34),
    ),
    st.sampled_from(_PROOF_FORMS),
    JUNK,
)


@FUZZ
@given(data=FINALS)
def test_the_native_path_answers_as_the_pure_one(data: bytes) -> None:
    # the same reply, or the same error, for any message (the C code answers only the usual
    # form and leaves every other to the pure path)
    assert _final_outcome(True, data) == _final_outcome(False, data)


@pytest.mark.parametrize("data", _PROOF_FORMS)
def test_proof_forms_answer_alike_on_both_paths(data: bytes) -> None:
    assert _final_outcome(True, data) == _final_outcome(False, data)


def test_a_login_takes_the_native_path_where_the_build_has_it() -> None:
    forget_salted_passwords()
    login(rfc_server(), rfc_client())
    assert bool(_NATIVE_KEYS) == (native.server_final is not None)
    forget_salted_passwords()  # RELOAD forgets what the C code was given of a verifier
    assert not _NATIVE_KEYS
    login(rfc_server(native_path=False), rfc_client())
    assert not _NATIVE_KEYS


def passthrough_client() -> ScramClient:
    client = ScramClient(
        client_key=b"k" * 32, server_key=b"s" * 32, username="user", nonce=RFC_CLIENT_NONCE
    )
    client.client_first()
    return client


@pytest.mark.parametrize(
    "iterations",
    [b"0", b"-1", b"10000000000", b"1000000000000", b"abc", b"", b"+5", b" 5", b"5_0", b"10000001"],
)
def test_malicious_iteration_count(iterations: bytes) -> None:
    msg = RFC_SERVER_FIRST.replace(b"i=4096", b"i=" + iterations)
    for client in (passthrough_client(), rfc_client()):
        client.client_first()
        with pytest.raises(ProtocolViolation):
            client.handle_server_first(msg)


@pytest.mark.parametrize(
    "msg",
    [
        *(b"", b"m=ext," + RFC_SERVER_FIRST, RFC_SERVER_FIRST + b"\xff"),
        *(RFC_SERVER_FIRST + b"," + b"x" * 9000, b"s=AAAA,r=rOprNGfwEbeRWgbNEkqOx,i=4096"),
        *(b"r=%s,s=AAAA,i=4096" % n for n in (b"x", RFC_CLIENT_NONCE.encode(), b"rOprNGfw")),
        RFC_SERVER_FIRST.replace(b"$k0", b"\x7fk0"),
        RFC_SERVER_FIRST.replace(b"s=W22Z", b"s=*22Z"),
        *(RFC_SERVER_FIRST.replace(b"W22ZaJ0SNY7soEsUEjb6gQ==", b""), RFC_SERVER_FIRST[:-7]),
    ],
)
def test_server_first_malformed(msg: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        passthrough_client().handle_server_first(msg)


def test_server_first_extensions_ignored() -> None:
    client = rfc_client()
    client.client_first()
    assert client.handle_server_first(RFC_SERVER_FIRST + b",x=ext") != b""


@pytest.mark.parametrize(
    "msg", [b"", b"v", b"v=!!", b"x=abc", b"v=" + base64.b64encode(b"short"), b"=abc"]
)
def test_server_final_malformed(msg: bytes) -> None:
    client = rfc_client()
    client.client_first()
    client.handle_server_first(RFC_SERVER_FIRST)
    with pytest.raises(ESCAPES):
        client.handle_server_final(msg)
    assert not client.done


def _after_client_first(data: bytes) -> object:
    server = rfc_server()
    server.handle_client_first(RFC_CLIENT_FIRST)
    return server.handle_client_final(data)


def _after_server_first(data: bytes) -> None:
    client = passthrough_client()
    client.handle_server_first(RFC_SERVER_FIRST)
    client.handle_server_final(data)


FUZZ_TARGETS = {
    "handle_client_first": lambda data: ScramServer(RFC_VERIFIER).handle_client_first(data),
    "handle_client_final": _after_client_first,
    "handle_client_final, pure": lambda data: _final_outcome(False, data),
    "handle_server_first": lambda data: passthrough_client().handle_server_first(data),
    "handle_server_final": _after_server_first,
    "parse_sasl_mechanisms": parse_sasl_mechanisms,
}


@pytest.mark.parametrize("target", list(FUZZ_TARGETS))
@given(data=JUNK)
@FUZZ
def test_fuzz_only_pgtarn_errors_escape(target: str, data: bytes) -> None:
    with contextlib.suppress(AuthFailed, ProtocolViolation):
        FUZZ_TARGETS[target](data)


def test_a_server_nonce_is_18_random_bytes_in_base64() -> None:
    # native/_scram.c's where the build has it, else os.urandom's
    nonces = {ScramServer(RFC_VERIFIER)._server_nonce for _ in range(200)}
    assert len(nonces) == 200
    for nonce in nonces:
        assert len(nonce) == 24 and len(base64.b64decode(nonce, validate=True)) == 18
    if native.server_nonce is not None:
        made = {native.server_nonce() for _ in range(200)}
        assert len(made) == 200 and all(n is not None and len(n) == 24 for n in made)
        # every base64 character turns up: the bytes are not from a narrow range
        assert set("".join(n for n in made if n)) == set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        )


def test_a_nonce_is_printable_ascii_without_comma() -> None:
    # RFC 5802 printable: 0x21-0x7E but ','; the server's own nonce is checked the same way
    for code in range(0x180):
        nonce = "ab" + chr(code) + "cd"
        if 0x21 <= code <= 0x7E and code != 0x2C:
            ScramServer(RFC_VERIFIER, nonce=nonce)
        else:
            with pytest.raises(ValueError, match="printable"):
                ScramServer(RFC_VERIFIER, nonce=nonce)
    with pytest.raises(ValueError, match="printable"):
        ScramServer(RFC_VERIFIER, nonce="")
