"""Property-based fuzzing of both login sides: scripted, mutated and malicious peers."""

from __future__ import annotations

import base64
import struct
import time
from dataclasses import dataclass
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.auth import scram
from pgtarn.auth.md5 import md5_response, md5_secret
from pgtarn.auth.scram import ScramServer, make_verifier
from pgtarn.errors import AuthFailed, LoginRefused, PgtarnError, ProtocolViolation
from pgtarn.proto import build
from pgtarn.proto.client_login import (
    Authenticated,
    ClientLogin,
    Event,
    Failed,
    LoginState,
    StartupReceived,
    TlsRequested,
)
from pgtarn.proto.client_side import ClientAuth
from pgtarn.proto.framing import MessageScanner, split_messages
from pgtarn.proto.messages import (
    parse_sasl_initial_response,
)
from pgtarn.proto.server_login import ServerAuth

from .fuzzing import FEW, FUZZ, Message, chunked, cuts, message_types, names

# --- ServerAuth against a scripted PostgreSQL ----------------------------------------------

ITERATIONS = 2  # the scripted server's SCRAM iteration count: fast
OK_TAIL: list[Message] = [
    (ord("R"), struct.pack("!I", 0)),
    (ord("S"), b"server_version\x0016.0\x00"),
    (ord("N"), b"SNOTICE\x00Mhello\x00\x00"),
    (ord("S"), b"TimeZone\x00UTC\x00"),
    (ord("K"), struct.pack("!II", 4242, 77)),
    (ord("Z"), b"I"),
]
METHODS = ["trust", "cleartext", "md5", "scram", "passthrough"]


def auth(code: int, payload: bytes = b"") -> Message:
    return ord("R"), struct.pack("!I", code) + payload


class FakePostgres:
    """PostgreSQL's side of a login, answering each reply pgtarn sends as PostgreSQL would."""

    def __init__(self, method: str, password: str = "pw", user: str = "u") -> None:
        self.method = method
        self.password = password
        self.user = user
        self.verifier = make_verifier(password, b"salty", ITERATIONS)
        self.scram = ScramServer(self.verifier)
        self.salt = b"\x01\x02\x03\x04"
        self.server_final = b""  # the genuine SCRAM server-final, once made
        self.sasl_messages = 0

    def login(self) -> ServerAuth:
        if self.method == "passthrough":
            # the keys a client's SCRAM login hands over: ClientKey and the stored ServerKey
            salted = scram._salted_password(self.password, b"salty", ITERATIONS)
            client_key = scram._hmac(salted, b"Client Key")
            return ServerAuth(self.user, None, (client_key, self.verifier.server_key))
        return ServerAuth(self.user, self.password)

    def opening(self) -> list[Message]:
        if self.method == "trust":
            return list(OK_TAIL)
        if self.method == "cleartext":
            return [auth(3)]
        if self.method == "md5":
            return [auth(5, self.salt)]
        return [auth(10, b"SCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00")]

    def answer(self, reply: bytes) -> list[Message]:
        refused = [
            (ord("E"), build.error_response("28P01", "password authentication failed", "FATAL")[5:])
        ]
        ((msg_type, body),) = split_messages(reply)
        assert msg_type == ord("p")
        if self.method == "cleartext":
            return list(OK_TAIL) if body == self.password.encode() + b"\x00" else refused
        if self.method == "md5":
            expected = md5_response(self.password, self.user, self.salt) + b"\x00"
            return list(OK_TAIL) if body == expected else refused
        try:
            self.sasl_messages += 1
            if self.sasl_messages == 1:
                mechanism, data = parse_sasl_initial_response(body)
                assert mechanism == "SCRAM-SHA-256"
                return [auth(11, self.scram.handle_client_first(data))]
            self.server_final = self.scram.handle_client_final(body)
        except PgtarnError:
            return refused
        return [auth(12, self.server_final), *OK_TAIL]


EXTRA_MESSAGES: list[Message] = [
    *(auth(code) for code in range(13)),
    auth(2**32 - 1),
    auth(5, b"ab"),
    auth(10, b""),
    auth(10, b"\x00"),
    auth(10, b"X\x00\x00"),
    auth(11, b"r=abc,s=AAAA,i=1"),
    auth(12, b"v=AAAA"),
    auth(12, b"e=other-error"),
    (ord("E"), b""),
    (ord("E"), b"\x00"),
    (ord("E"), b"SFATAL\x00Mno sqlstate\x00\x00"),
    (ord("E"), b"C"),
    (ord("E"), b"C28P01"),
    (ord("E"), b"M\xff\xfe\x00\x00"),
    (ord("S"), b""),
    (ord("S"), b"a\x00"),
    (ord("S"), b"\xff\x00\x00"),
    (ord("K"), b"1234567"),
    (ord("Z"), b""),
    (ord("Z"), b"I"),
    (ord("v"), b""),
    (ord("N"), b""),
    (ord("D"), b""),
    (ord("R"), b""),
    (ord("R"), b"\x00\x00\x00"),
]


@dataclass(frozen=True)
class Mutation:
    """A change to one server message: dropped, doubled, retyped, garbled, or preceded."""

    kind: str
    pos: int
    junk: bytes
    new_type: int
    extra: Message

    def apply(self, msg: Message) -> list[Message]:
        t, body = msg
        p = self.pos % (len(body) + 1)
        if self.kind == "drop":
            return []
        if self.kind == "double":
            return [msg, msg]
        if self.kind == "retype":
            return [(self.new_type, body)]
        if self.kind == "truncate":
            return [(t, body[:p])]
        if self.kind == "flip":
            return [(t, body[:p] + self.junk[:1] + body[p + 1 :])]
        if self.kind == "insert":
            return [(t, body[:p] + self.junk + body[p:])]
        if self.kind == "replace":
            return [(t, self.junk)]
        if self.kind == "precede":
            return [self.extra, msg]
        return [msg]


mutations = st.builds(
    Mutation,
    kind=st.sampled_from(
        ["keep", "drop", "double", "retype", "truncate", "flip", "insert", "replace", "precede"]
    ),
    pos=st.integers(0, 400),
    junk=st.binary(min_size=1, max_size=8),
    new_type=message_types,
    extra=st.sampled_from(EXTRA_MESSAGES),
)


def is_request(msg: Message, code: int) -> bool:
    """msg is an Authentication message with this request code."""
    return msg[0] == ord("R") and msg[1][:4] == struct.pack("!I", code)


def signs_correctly(fake: FakePostgres, msg: Message) -> bool:
    """msg is an AuthenticationSASLFinal carrying the true server signature."""
    t, body = msg
    if t != ord("R") or body[:4] != struct.pack("!I", 12) or not fake.server_final:
        return False
    try:
        got = base64.b64decode(body[6:], validate=True)
    except ValueError:
        return False
    return body[4:6] == b"v=" and got == base64.b64decode(fake.server_final[2:])


def run_login(
    fake: FakePostgres, at: int, change: Mutation
) -> tuple[ServerAuth, list[Message], PgtarnError | None]:
    """Play the script, changing its message number `at`; the messages fed and any error."""
    login = fake.login()
    queue = fake.opening()
    fed: list[Message] = []
    index = 0
    while queue and not login.done:
        msg = queue.pop(0)
        for t, body in change.apply(msg) if index == at else [msg]:
            fed.append((t, body))
            try:
                reply = login.feed(t, body)
            except PgtarnError as error:
                return login, fed, error
            if login.done:
                break
            if reply:
                queue.extend(fake.answer(reply))
        index += 1
    return login, fed, None


@settings(max_examples=500, deadline=None, database=None)  # cheap, and many paths to cover
@given(method=st.sampled_from(METHODS), at=st.integers(0, 8), change=mutations)
def test_server_login_on_mutated_scripts(method: str, at: int, change: Mutation) -> None:
    fake = FakePostgres(method)
    login, fed, error = run_login(fake, at, change)  # anything but PgtarnError escapes here
    if error is not None:
        assert not login.done
        return
    if change.kind == "keep":
        assert login.done
    if login.done:
        # never logged in without the server's AuthenticationOk ...
        assert any(is_request(m, 0) for m in fed), fed
        if any(is_request(m, 10) for m in fed):
            # ... nor, once SCRAM began, before the server proved it knows the secret
            assert any(signs_correctly(fake, m) for m in fed), fed
        if change.kind == "keep":
            assert login.params == {"server_version": "16.0", "TimeZone": "UTC"}
            assert login.backend_key == (4242, 77)


ROGUE_MESSAGES: list[Message] = [
    auth(0),
    auth(12, b"v=" + base64.b64encode(b"\x00" * 32)),
    auth(12, b"v=AAAA"),
    auth(12, b"e=invalid-proof"),
    auth(11, b"r=x,s=AAAA,i=1"),
    auth(10, b"SCRAM-SHA-256\x00\x00"),
    (ord("S"), b"server_version\x0016.0\x00"),
    (ord("K"), struct.pack("!II", 1, 2)),
    (ord("Z"), b"I"),
    (ord("N"), b"\x00"),
    (ord("v"), b"\x00\x00\x00\x00\x00\x00\x00\x00"),
]


@FUZZ
@given(
    method=st.sampled_from(["scram", "passthrough"]),
    nonce_tail=st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=","),
        min_size=1,
        max_size=20,
    ),
    script=st.lists(st.sampled_from(ROGUE_MESSAGES), max_size=8),
)
def test_a_server_that_does_not_know_the_secret_never_completes_a_scram_login(
    method: str, nonce_tail: str, script: list[Message]
) -> None:
    fake = FakePostgres(method)
    login = fake.login()
    ((_, first),) = split_messages(login.feed(*auth(10, b"SCRAM-SHA-256\x00\x00")))
    client_nonce = parse_sasl_initial_response(first)[1].split(b"r=")[1].decode()
    server_first = f"r={client_nonce}{nonce_tail},s=AAAA,i=1".encode()
    try:
        login.feed(*auth(11, server_first))
        for msg in script:
            login.feed(*msg)
            assert not login.done, "a server without the secret completed a SCRAM login"
    except PgtarnError:
        assert not login.done


@FUZZ
@given(method=st.sampled_from(["scram", "passthrough"]), data=st.data())
def test_server_final_is_accepted_only_with_the_true_signature(
    method: str, data: st.DataObject
) -> None:
    fake = FakePostgres(method)
    login = fake.login()
    ((_, first),) = split_messages(login.feed(*fake.opening()[0]))
    ((_, final),) = split_messages(login.feed(*fake.answer(build.password_message(first))[0]))
    fake.answer(build.password_message(final))  # the scripted server signs: fake.server_final
    true_signature = base64.b64decode(fake.server_final[2:])
    flip = data.draw(st.integers(0, 8 * len(true_signature) - 1))
    flipped = bytearray(true_signature)
    flipped[flip // 8] ^= 1 << (flip % 8)
    payload = data.draw(
        st.sampled_from(
            [
                fake.server_final,
                fake.server_final + b",x=extension",
                b"v=" + base64.b64encode(bytes(flipped)),
                b"v=" + base64.b64encode(true_signature[:-1]),
                b"v=" + base64.b64encode(true_signature + b"\x00"),
                fake.server_final[:-1],
                b"e=invalid-proof",
                b"e=",
                b"v=",
                b"v",
                b"",
                b"x=" + fake.server_final[2:],
                b"v=" + fake.server_final[2:].lower(),
                b"e=x," + fake.server_final,
                fake.server_final + b"\xff",
                b"\xff" * 9000,
            ]
        )
    )
    try:
        login.feed(ord("R"), struct.pack("!I", 12) + payload)
    except (AuthFailed, ProtocolViolation):
        assert not signs_correctly(fake, auth(12, payload))
        with pytest.raises(PgtarnError):  # nor can the server carry on as if it had passed
            login.feed(*auth(0))
        return
    assert signs_correctly(fake, auth(12, payload.split(b",")[0]))
    login.feed(*auth(0))
    login.feed(ord("Z"), b"I")
    assert login.done


def iteration_texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-(2**40), 2**70).map(str),
        st.sampled_from(
            [
                "0",
                "-1",
                "4096",
                "0004096",
                str(10**9),
                str(2**31),
                str(2**32),
                str(scram.MAX_CLIENT_ITERATIONS),
                str(scram.MAX_CLIENT_ITERATIONS + 1),
                "",
                "+5",
                " 5",
                "5 ",
                "1e9",
                "٣",
                "0x10",
                "9" * 400,
            ]
        ),
    )


nonce_suffixes = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=","),
    min_size=1,
    max_size=30,
)


@st.composite
def server_firsts(draw: st.DrawFn, client_nonce: str) -> tuple[bytes, bool, str]:
    """A server-first-message, whether a client must accept it, and its iteration text."""
    ok = True
    nonce_kind = draw(st.sampled_from(["ok", "ok", "foreign", "bare", "huge", "unprintable"]))
    suffix = draw(nonce_suffixes)
    if nonce_kind == "ok":
        nonce = client_nonce + suffix
    elif nonce_kind == "foreign":  # does not start with the client's nonce
        nonce = draw(nonce_suffixes.filter(lambda s: not s.startswith(client_nonce)))
        ok = False
    elif nonce_kind == "bare":  # the server added nothing
        nonce, ok = client_nonce, False
    elif nonce_kind == "huge":  # a malicious server's huge nonce (a PgBouncer stack overflow)
        nonce, ok = client_nonce + suffix * (100_000 // len(suffix) + 1), False
    else:
        nonce, ok = client_nonce + suffix + draw(st.sampled_from(["\x7f", " ", "é", "\x00"])), False
    salt_kind = draw(st.sampled_from(["ok", "ok", "empty", "bad", "padding", "unicode"]))
    salt = {
        "ok": base64.b64encode(draw(st.binary(min_size=1, max_size=24))).decode(),
        "empty": "",
        "bad": "*not/base64*",
        "padding": "QQ",
        "unicode": "ÀÁÂÃ",
    }[salt_kind]
    ok = ok and salt_kind == "ok"
    iterations = draw(iteration_texts())
    valid_count = (
        iterations.isascii()
        and iterations.isdigit()
        and len(iterations) <= 10
        and 1 <= int(iterations) <= scram.MAX_CLIENT_ITERATIONS
    )
    ok = ok and valid_count
    attrs = [f"r={nonce}", f"s={salt}", f"i={iterations}"]
    layout = draw(st.sampled_from(["ok", "ok", "ext", "mandatory", "swapped", "missing"]))
    if layout == "ext":
        attrs.append("x=extension")
    elif layout == "mandatory":
        attrs.insert(0, "m=must-understand")
        ok = False
    elif layout == "swapped":
        attrs[0], attrs[1] = attrs[1], attrs[0]
        ok = False
    elif layout == "missing":
        del attrs[draw(st.integers(0, 2))]
        ok = False
    return ",".join(attrs).encode(), ok, iterations


@FUZZ
@given(data=st.data(), method=st.sampled_from(["scram", "passthrough"]))
def test_server_first_is_checked_before_any_key_derivation(
    data: st.DataObject, method: str
) -> None:
    fake = FakePostgres(method)
    login = fake.login()
    ((_, first),) = split_messages(login.feed(*auth(10, b"SCRAM-SHA-256\x00\x00")))
    client_nonce = parse_sasl_initial_response(first)[1].split(b"r=")[1].decode()
    server_first, ok, iterations = data.draw(server_firsts(client_nonce))
    derived: list[int] = []

    def fake_derivation(password: str, salt: bytes, count: int) -> bytes:
        derived.append(count)  # never run PBKDF2 for real here: a valid count may be huge
        return b"\x00" * 32

    started = time.monotonic()
    with mock.patch.object(scram, "_salted_password", fake_derivation):
        if ok:
            reply = split_messages(login.feed(*auth(11, server_first)))
            assert reply[0][0] == ord("p") and b",p=" in reply[0][1]
        else:
            with pytest.raises(ProtocolViolation):
                login.feed(*auth(11, server_first))
    assert time.monotonic() - started < 1.0
    assert all(1 <= count <= scram.MAX_CLIENT_ITERATIONS for count in derived)
    assert derived == ([int(iterations)] if ok and method == "scram" else [])
    assert not login.done


def test_a_malicious_iteration_count_is_refused_without_computing_it() -> None:
    login = ServerAuth("u", "pw")
    ((_, first),) = split_messages(login.feed(*auth(10, b"SCRAM-SHA-256\x00\x00")))
    client_nonce = parse_sasl_initial_response(first)[1].split(b"r=")[1].decode()
    started = time.monotonic()
    with pytest.raises(ProtocolViolation, match="iteration count"):
        login.feed(*auth(11, f"r={client_nonce}x,s=AAAA,i={10**9}".encode()))
    assert time.monotonic() - started < 0.5


@st.composite
def error_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """An ErrorResponse body (often without SQLSTATE) and the SQLSTATE it carries, if any."""
    field_codes = draw(st.lists(st.sampled_from(b"SVCMDHPWsctdnFLR\xff"), max_size=6))
    fields = [
        (c, draw(st.binary(max_size=12).map(lambda b: b.replace(b"\x00", b""))))
        for c in field_codes
    ]
    body = b"".join(bytes((c,)) + v + b"\x00" for c, v in fields)
    sqlstates = [v for c, v in fields if c == ord("C")]
    expected = sqlstates[-1].decode(errors="replace") if sqlstates else None
    ending = draw(st.sampled_from(["nul", "none", "cut"]))
    if ending == "nul":
        body += b"\x00"
    elif ending == "cut" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
        expected = "?"  # some prefix: only the kind of error is known
    return body, expected


@FUZZ
@given(err=error_bodies(), method=st.sampled_from(METHODS), after=st.integers(0, 2))
def test_error_response_without_sqlstate_or_fields_is_a_clean_login_failure(
    err: tuple[bytes, str | None], method: str, after: int
) -> None:
    body, expected = err
    fake = FakePostgres(method)
    login = fake.login()
    script = fake.opening()
    for msg in script[: min(after, len(script) - 1)]:
        login.feed(*msg)
    with pytest.raises(PgtarnError) as info:
        login.feed(ord("E"), body)
    error = info.value
    assert isinstance(error.sqlstate, str) and error.sqlstate
    assert error.severity == "FATAL"
    # PostgreSQL's refusal in its own words; a broken one (no SQLSTATE) in PgBouncer's
    assert isinstance(error, LoginRefused) or error.message.startswith("server login failed: ")
    if expected is None:
        assert error.sqlstate == "08P01"
    elif expected != "?":
        assert error.sqlstate == (expected or "08P01")
    assert not login.done


@FUZZ
@given(
    code=st.one_of(st.integers(0, 20), st.integers(0, 2**32 - 1)),
    payload=st.one_of(
        st.binary(max_size=60),
        st.sampled_from(
            [b"", b"\x00", b"SCRAM-SHA-256\x00\x00", b"SCRAM-SHA-256", b"r=,s=,i=", b"v="]
        ),
    ),
    method=st.sampled_from(METHODS),
    after_sasl=st.booleans(),
)
def test_authentication_requests_of_every_code(
    code: int, payload: bytes, method: str, after_sasl: bool
) -> None:
    login = FakePostgres(method).login()
    if after_sasl and method in ("scram", "passthrough"):
        login.feed(*auth(10, b"SCRAM-SHA-256\x00\x00"))
    try:
        reply = login.feed(*auth(code, payload))
    except PgtarnError as error:
        if code not in (0, 3, 5, 10, 11, 12):
            assert error.sqlstate == "28000" and "unsupported authentication" in error.message
        assert not login.done
        return
    assert code in (0, 3, 5, 10, 11, 12)
    assert all(t == ord("p") for t, _ in split_messages(reply))
    assert not login.done


@FEW
@given(body=st.binary(max_size=60), msg_type=message_types, method=st.sampled_from(METHODS))
def test_server_login_only_raises_pgtarn_errors_on_random_messages(
    body: bytes, msg_type: int, method: str
) -> None:
    login = FakePostgres(method).login()
    try:
        login.feed(msg_type, body)
    except PgtarnError:
        assert not login.done


# --- pgtarn logging in to pgtarn: ServerAuth against ClientAuth, over chunked streams -------


def deliver(stream: bytes, points: list[int]) -> list[Message]:
    scanner = MessageScanner(frozenset(range(256)), 10_000)
    out: list[Message] = []
    for chunk in chunked(stream, points):
        out += [(t, b) for t, b, _ in scanner.feed(chunk)]
    assert scanner.at_boundary
    return out


@FEW
@given(
    auth_type=st.sampled_from(["trust", "any", "plain", "md5", "scram-sha-256"]),
    secret_kind=st.sampled_from(["plain", "md5", "scram"]),
    password=st.text(
        st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
        min_size=1,
        max_size=12,
    ),
    user=names,
    points=cuts,
)
def test_server_login_and_client_auth_agree_over_any_chunking(
    auth_type: str, secret_kind: str, password: str, user: str, points: list[int]
) -> None:
    if auth_type == "scram-sha-256" and secret_kind == "md5":
        return  # an md5 secret cannot do SCRAM: refused like a wrong password (tested elsewhere)
    secret = {
        "plain": password,
        "md5": md5_secret(password, user),
        "scram": make_verifier(password, iterations=ITERATIONS).to_string(),
    }[secret_kind]
    client_auth = ClientAuth(auth_type, user, secret, scram_iterations=ITERATIONS)
    login = ServerAuth(user, password)
    to_pgtarn = client_auth.start()
    for _ in range(5):
        if client_auth.done:
            break
        reply = b"".join(login.feed(t, b) for t, b in deliver(to_pgtarn, points))
        assert reply
        to_pgtarn = b"".join(client_auth.feed(b) for t, b in deliver(reply, points))
    assert client_auth.done
    tail = to_pgtarn + build.parameter_status("a", "b") + build.backend_key_data(1, 2)
    for t, b in deliver(tail + build.ready_for_query(), points):
        assert login.feed(t, b) == b""
    assert login.done and login.params == {"a": "b"} and login.backend_key == (1, 2)
    if client_auth.scram_keys is not None:  # passthrough: the keys log in again by themselves
        again = ServerAuth(user, None, client_auth.scram_keys)
        other = ClientAuth("scram-sha-256", user, secret, scram_iterations=ITERATIONS)
        to_pgtarn = other.start()
        while not other.done:
            reply = b"".join(again.feed(t, b) for t, b in deliver(to_pgtarn, points))
            to_pgtarn = b"".join(other.feed(b) for t, b in deliver(reply, points))
        for t, b in deliver(to_pgtarn + build.ready_for_query(), points):
            again.feed(t, b)
        assert again.done


# --- ClientLogin: a client sending anything, in any chunks ------------------------------


def drive(login: ClientLogin, chunks: list[bytes], method: str) -> list[Event]:
    """Feed the chunks, answering as the I/O side would (TLS refused, method, a known user)."""
    events: list[Event] = []
    for chunk in chunks:
        pending = login.receive_data(chunk)
        while pending:
            event = pending.pop(0)
            events.append(event)
            if isinstance(event, TlsRequested):
                pending += login.refuse_tls()
            elif isinstance(event, StartupReceived):
                refused = login.check_startup(("TimeZone",), ())
                pending += [refused] if refused else login.begin_auth(method, "pw", ITERATIONS)
    return events


STARTUP_PIECES = [
    build.SSL_REQUEST,
    struct.pack("!II", 8, 80877104),
    build.startup_message({"user": "u"}),
    build.startup_message({"user": "u", "TimeZone": "UTC"}),
    build.startup_message({}),
    build.cancel_request(1, 2),
    build.password_message(b"pw\x00"),
    build.TERMINATE,
    build.query("SELECT 1"),
    b"\x16\x03\x01",
    b"\x00\x00\x00\x08",
    b"\xff" * 6,
]


@FUZZ
@given(
    pieces=st.lists(st.one_of(st.sampled_from(STARTUP_PIECES), st.binary(max_size=30)), max_size=6),
    method=st.sampled_from(["trust", "plain", "md5", "scram-sha-256"]),
    points=cuts,
)
def test_client_login_answers_anything_with_events_only(
    pieces: list[bytes], method: str, points: list[int]
) -> None:
    login = ClientLogin()
    stream = b"".join(pieces)
    events = drive(login, chunked(stream, points), method)  # raises nothing
    failures = [e for e in events if isinstance(e, Failed)]
    assert len(failures) <= 1
    if failures:
        assert events[-1] is failures[0]  # nothing after the error
        assert login.state is LoginState.DONE
        assert failures[0].response[:1] == b"E"
    if any(isinstance(e, Authenticated) for e in events):
        # never without the password, when one was asked for (nothing here answers md5 or
        # SCRAM rightly)
        assert method == "trust" or (
            method == "plain" and build.password_message(b"pw\x00") in stream
        )


# --- regressions found by the properties above ---------------------------------------------


def test_regression_ready_for_query_cannot_skip_authentication() -> None:
    # ReadyForQuery used to end a login at any point: right after the SCRAM server-first (so
    # the server never had to prove it knows the secret), or with no AuthenticationOk at all.
    fake = FakePostgres("scram")
    login = fake.login()
    ((_, first),) = split_messages(login.feed(*fake.opening()[0]))
    login.feed(*fake.answer(build.password_message(first))[0])
    with pytest.raises(ProtocolViolation, match="before AuthenticationOk"):
        login.feed(ord("Z"), b"I")
    assert not login.done
    login = ServerAuth("u", "pw")
    login.feed(ord("S"), b"server_version\x0016.0\x00")
    with pytest.raises(ProtocolViolation, match="before AuthenticationOk"):
        login.feed(ord("Z"), b"I")
    # an exchange started after an AuthenticationOk must be finished too
    login = ServerAuth("u", "pw")
    login.feed(*auth(0))
    login.feed(*auth(10, b"SCRAM-SHA-256\x00\x00"))
    with pytest.raises(ProtocolViolation):
        login.feed(ord("Z"), b"I")
