"""LoginDriver over fake transports: what it writes, TLS put in place, and its reports."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pgtarn.auth.endpoint import certificate_hash
from pgtarn.auth.scram import MECHANISM_PLUS, ScramServer, make_verifier
from pgtarn.config.inifile import parse_config
from pgtarn.errors import PgtarnError, ProtocolViolation, TlsFailed
from pgtarn.net.tls import TlsTransport
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner, split_messages
from pgtarn.proto.messages import parse_sasl_initial_response, parse_startup
from pgtarn.proto.server_login import LoggedIn, ServerAuth, ServerLogin
from pgtarn.runtime import Runtime
from pgtarn.server.login import LoginDriver, OwnConnection

from .fakes import INI, WELCOME, FakeTransport


class Owner(asyncio.Protocol):
    """A connection that owns a LoginDriver: keeps what it reports."""

    def __init__(self, password: str = "pw", channel_binding: str = "prefer") -> None:
        self.switched: list[asyncio.Transport] = []
        self.results: list[LoggedIn] = []
        self.errors: list[PgtarnError] = []
        self.tls_errors: list[Exception] = []
        login = ServerLogin(ServerAuth("u", password, channel_binding=channel_binding), "db")
        self.driver = LoginDriver(
            login,
            self,
            "localhost",
            switched=self.switched.append,
            logged_in=self.results.append,
            failed=self.errors.append,
            tls_failed=self.tls_errors.append,
        )

    def data_received(self, data: bytes) -> None:
        self.driver.data_received(data)


def client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def test_without_tls_the_startup_message_goes_first_and_replies_follow() -> None:
    owner = Owner()
    transport = FakeTransport()
    owner.driver.start(transport, None, "prefer")
    assert parse_startup(transport.take()[4:]).params == {"user": "u", "database": "db"}
    owner.data_received(build.authentication(3))
    assert split_messages(transport.take()) == [(ord("p"), b"pw\x00")]
    owner.data_received(WELCOME + b"Z")
    (result,) = owner.results
    assert result.backend_key == (7, 8) and result.leftover == b"Z"
    assert owner.errors == [] and owner.switched == []


def test_a_unix_socket_gets_no_ssl_request() -> None:
    owner = Owner()
    transport = FakeTransport(peername="")
    owner.driver.start(transport, client_context(), "require")
    assert parse_startup(transport.take()[4:]).params["user"] == "u"


def test_tls_refused_under_prefer_goes_on_in_plaintext() -> None:
    owner = Owner()
    transport = FakeTransport()
    owner.driver.start(transport, client_context(), "prefer")
    assert transport.take() == build.SSL_REQUEST
    owner.data_received(b"N")
    assert parse_startup(transport.take()[4:]).params["database"] == "db"
    assert owner.switched == [] and owner.errors == []


def test_tls_refused_under_require_is_reported_as_failed() -> None:
    owner = Owner()
    transport = FakeTransport()
    owner.driver.start(transport, client_context(), "require")
    transport.take()
    owner.data_received(b"N")
    (error,) = owner.errors
    assert isinstance(error, TlsFailed) and "server_tls_sslmode = require" in error.message
    assert transport.take() == b""  # no StartupMessage in plaintext
    assert owner.results == []


def test_an_error_response_is_reported_as_failed() -> None:
    owner = Owner()
    transport = FakeTransport()
    owner.driver.start(transport, None, "disable")
    owner.data_received(build.error_response("3D000", 'database "db" does not exist', "FATAL"))
    (error,) = owner.errors
    assert error.sqlstate == "3D000"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TlsPeer:
    """PostgreSQL's end of the TLS connection, in memory."""

    def __init__(self, cert: Path, key: Path) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.ssl = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.shaken = False

    def exchange(self, raw: FakeTransport) -> bytes:
        """Take what pgtarn wrote, answer the handshake; the plaintext pgtarn sent."""
        for _ in range(10):
            data = raw.take()
            if not data:
                break
            self.incoming.write(data)
            if not self.shaken:
                try:
                    self.ssl.do_handshake()
                    self.shaken = True
                except ssl.SSLWantReadError:
                    pass
            self.flush(raw)
        plain = b""
        while self.shaken:
            try:
                plain += self.ssl.read(65536)
            except ssl.SSLWantReadError:
                break
        return plain

    def send(self, raw: FakeTransport, data: bytes) -> None:
        self.ssl.write(data)
        self.flush(raw)

    def flush(self, raw: FakeTransport) -> None:
        answer = self.outgoing.read()
        if answer:
            assert isinstance(raw.protocol, asyncio.Protocol)  # (the TLS layer's raw side)
            raw.protocol.data_received(answer)


def test_tls_accepted_wraps_the_transport_and_binds_scram_to_the_certificate(
    tmp_path: Path,
) -> None:
    cert, key = self_signed(tmp_path)
    binding = certificate_hash(ssl.PEM_cert_to_DER_cert(cert.read_text()))
    assert binding

    async def run() -> None:
        owner = Owner(channel_binding="require")
        raw = FakeTransport()
        owner.driver.start(raw, client_context(), "require")
        assert raw.take() == build.SSL_REQUEST
        owner.data_received(b"S")
        (tls,) = owner.switched
        assert isinstance(tls, TlsTransport) and owner.driver.transport is tls
        peer = TlsPeer(cert, key)
        startup = peer.exchange(raw)  # the handshake, then the StartupMessage through it
        assert parse_startup(startup[4:]).params == {"user": "u", "database": "db"}
        scram = ScramServer(make_verifier("pw"), channel_binding=binding)
        peer.send(raw, build.auth_sasl(scram.mechanisms()))
        [(_, initial)] = split_messages(peer.exchange(raw))
        mechanism, client_first = parse_sasl_initial_response(initial)
        assert mechanism == MECHANISM_PLUS
        scram.select(mechanism)
        peer.send(raw, build.authentication(11, scram.handle_client_first(client_first)))
        [(_, final)] = split_messages(peer.exchange(raw))
        # the server checks the client's proof and its binding data against its own
        server_final = scram.handle_client_final(final)
        peer.send(raw, build.authentication(12, server_final) + WELCOME)
        (result,) = owner.results
        assert result.backend_key == (7, 8) and owner.errors == []

    asyncio.run(run())


def test_a_failed_handshake_is_reported_and_closes_the_connection() -> None:
    async def run() -> None:
        owner = Owner()
        raw = FakeTransport()
        owner.driver.start(raw, client_context(), "require")
        owner.data_received(b"S")
        assert raw.take()  # the ClientHello
        assert isinstance(raw.protocol, asyncio.Protocol)
        raw.protocol.data_received(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        (exc,) = owner.tls_errors
        assert isinstance(exc, ssl.SSLError)
        assert raw.closing and owner.results == [] and owner.errors == []

    asyncio.run(run())


@pytest.mark.parametrize("answer", [b"S\x00\x00\x00\x08", b"X"])
def test_bad_answers_to_the_ssl_request_are_reported_as_failed(answer: bytes) -> None:
    owner = Owner()
    transport = FakeTransport()
    owner.driver.start(transport, client_context(), "prefer")
    owner.data_received(answer)
    assert len(owner.errors) == 1 and owner.switched == []


class Replies(OwnConnection):
    """An OwnConnection that keeps what it is told."""

    def __init__(self) -> None:
        runtime = Runtime(parse_config(INI.format(mode="session", prepared=0)), {})
        super().__init__(
            runtime,
            ServerLogin(ServerAuth("u", "pw"), "db"),
            "localhost",
            MessageScanner(frozenset(b"CZ")),
        )
        self.told: list[object] = []

    def _on_logged_in(self) -> None:
        self.told.append("logged in")

    def _message(self, msg_type: int, body: bytes) -> None:
        if body == b"bad":
            raise ProtocolViolation("bad body")
        self.told.append((msg_type, body))

    def _malformed(self, error: PgtarnError) -> None:
        self.told.append(error.message)

    def _login_failed(self, error: PgtarnError) -> None:
        self.told.append(error)

    def _tls_failed(self, exc: Exception) -> None:
        self.told.append(exc)


def test_an_own_connection_logs_in_then_hands_each_reply_leftover_first_to_message() -> None:
    conn = Replies()
    transport = FakeTransport()
    conn.connection_made(transport)
    assert parse_startup(transport.take()[4:]).params == {"user": "u", "database": "db"}
    assert not conn.ready
    conn.data_received(WELCOME + build.command_complete("SELECT 1"))
    assert conn.ready and conn.login is None
    assert conn.told == ["logged in", (ord("C"), b"SELECT 1\x00")]
    conn.data_received(build.ready_for_query(b"I") + build.message(b"C", b"bad"))
    assert conn.told[2:] == [(ord("Z"), b"I"), "bad body"]
    conn.data_received(b"Z\x00\x00\x00\x00")  # a length below 4: the scanner refuses it
    assert conn.told[4:] == ["invalid message length 0 for message type 'Z'"]


def test_an_own_connection_closed_before_connecting_closes_its_transport_at_once() -> None:
    conn = Replies()
    conn._shut()
    assert conn.closed
    transport = FakeTransport()
    conn.connection_made(transport)
    assert transport.closing and transport.take() == b""


def test_an_own_connection_shut_says_terminate_unless_told_not_to() -> None:
    for terminate, written in ((True, build.TERMINATE), (False, b"")):
        conn = Replies()
        transport = FakeTransport()
        conn.connection_made(transport)
        transport.take()
        conn._shut(terminate)
        assert conn.closed and transport.closing and transport.take() == written
