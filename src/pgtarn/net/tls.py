"""TLS on an open connection: contexts from the settings, and a transport that wraps in place.

PostgreSQL starts TLS inside a plaintext conversation (SSLRequest answered 'S'), and
PostgreSQL 17 clients may also open with a TLS ClientHello at once (direct TLS). Both need
bytes that were already received to feed the handshake, which ``loop.start_tls`` cannot do;
so TLS runs here on ``ssl.MemoryBIO`` pairs: :class:`TlsTransport` takes the place of the
raw transport for the protocol above it (which keeps moving bytes as before), and becomes
the raw transport's protocol below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..auth.endpoint import certificate_hash
from ..config.settings import Config
from ..errors import ConfigError

#: Plaintext handed up per read: one TLS record is at most 16 KiB.
READ_SIZE = 65536

#: PostgreSQL's ALPN protocol name (required for direct TLS, PostgreSQL 17).
ALPN = "postgresql"

#: PgBouncer's cipher keywords, as OpenSSL cipher lists (TLS 1.2 and older).
CIPHER_KEYWORDS = {
    "default": "HIGH:MEDIUM:+3DES:!aNULL",
    "secure": "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL",
    "normal": "HIGH:MEDIUM:!aNULL:!eNULL",
    "fast": "ECDHE+AESGCM:!aNULL:!eNULL",
    "compat": "HIGH:MEDIUM:+3DES:!aNULL",
    "legacy": "ALL:!aNULL:!eNULL",
    "insecure": "ALL:!aNULL:!eNULL",
    "all": "ALL:!aNULL:!eNULL",
}

_VERSIONS = {
    "tlsv1.0": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
_PROTOCOL_KEYWORDS = {
    "secure": ("tlsv1.2", "tlsv1.3"),
    "all": ("tlsv1.0", "tlsv1.1", "tlsv1.2", "tlsv1.3"),
    "legacy": ("tlsv1.0", "tlsv1.1", "tlsv1.2", "tlsv1.3"),
    "default": ("tlsv1.2", "tlsv1.3"),
}


def _protocol_range(setting: str, value: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    names: list[str] = []
    for item in value.replace(":", ",").split(","):
        item = item.strip().lower()
        if not item:
            continue
        if item in _PROTOCOL_KEYWORDS:
            names.extend(_PROTOCOL_KEYWORDS[item])
        elif item in _VERSIONS:
            names.append(item)
        else:
            raise ConfigError(f"{setting}: unknown TLS protocol {item!r}")
    if not names:
        raise ConfigError(f"{setting}: no TLS protocol given")
    versions = sorted(_VERSIONS[n] for n in names)
    return versions[0], versions[-1]


def load_tls13() -> Callable[[ssl.SSLContext, str, str], None]:
    """net/tls13.py's set_tls13_ciphers, imported only when client_tls13_ciphers or
    server_tls13_ciphers is set, so that other poolers do not hold ctypes in memory."""
    from .tls13 import set_tls13_ciphers  # lazy, for the memory (see the docstring)

    return set_tls13_ciphers


def _apply_common(
    context: ssl.SSLContext, prefix: str, protocols: str, ciphers: str, ciphers13: str
) -> None:
    low, high = _protocol_range(f"{prefix}_tls_protocols", protocols)
    try:
        context.minimum_version = low
        context.maximum_version = high
        context.set_ciphers(CIPHER_KEYWORDS.get(ciphers.lower(), ciphers))
    except (ValueError, ssl.SSLError) as exc:
        raise ConfigError(f"{prefix}_tls_ciphers / {prefix}_tls_protocols: {exc}") from None
    if ciphers13 and high >= ssl.TLSVersion.TLSv1_3:  # (empty: OpenSSL's, as PgBouncer)
        load_tls13()(context, f"{prefix}_tls13_ciphers", ciphers13)
    # Renegotiation would let a peer make a write wait for a read; TLS 1.3 has none anyway.
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols([ALPN])


def _load_chain(context: ssl.SSLContext, setting: str, cert_file: str, key_file: str) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{setting}: cannot load {cert_file} / {key_file}: {exc}") from None


def _load_ca(context: ssl.SSLContext, setting: str, ca_file: str) -> None:
    try:
        context.load_verify_locations(ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{setting}: cannot load {ca_file}: {exc}") from None


def client_context(config: Config) -> ssl.SSLContext | None:
    """The context pgtarn offers TLS to clients with; None when client TLS is disabled."""
    mode = config.client_tls_sslmode
    if mode == "disable":
        return None
    if not (config.client_tls_cert_file and config.client_tls_key_file):
        raise ConfigError(
            f"client_tls_sslmode = {mode} needs client_tls_key_file and client_tls_cert_file"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _apply_common(
        context,
        "client",
        config.client_tls_protocols,
        config.client_tls_ciphers,
        config.client_tls13_ciphers,
    )
    _load_chain(
        context, "client_tls_cert_file", config.client_tls_cert_file, config.client_tls_key_file
    )
    if config.client_tls_ecdhcurve.lower() not in ("auto", "none", ""):
        try:
            context.set_ecdh_curve(config.client_tls_ecdhcurve)
        except (ValueError, ssl.SSLError) as exc:
            raise ConfigError(f"client_tls_ecdhcurve: {exc}") from None
    if mode in ("verify-ca", "verify-full"):
        if not config.client_tls_ca_file:
            raise ConfigError(f"client_tls_sslmode = {mode} needs client_tls_ca_file")
        context.verify_mode = ssl.CERT_REQUIRED
        _load_ca(context, "client_tls_ca_file", config.client_tls_ca_file)
    elif config.client_tls_ca_file:
        # A certificate is asked for (auth_type = cert needs one) but not required.
        context.verify_mode = ssl.CERT_OPTIONAL
        _load_ca(context, "client_tls_ca_file", config.client_tls_ca_file)
    return context


def own_certificate_hash(config: Config) -> bytes | None:
    """Channel-binding data of client_tls_cert_file's first certificate (None: none)."""
    if config.client_tls_sslmode == "disable" or not config.client_tls_cert_file:
        return None
    try:
        with open(config.client_tls_cert_file, encoding="ascii", errors="replace") as f:
            pem = f.read()
    except OSError as exc:
        raise ConfigError(f"client_tls_cert_file: {exc}") from None
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        return None
    return certificate_hash(ssl.PEM_cert_to_DER_cert(pem[start : stop + len(end)]))


def server_context(config: Config) -> ssl.SSLContext | None:
    """The context pgtarn connects to PostgreSQL with; None when server TLS is disabled."""
    mode = config.server_tls_sslmode
    if mode == "disable":
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _apply_common(
        context,
        "server",
        config.server_tls_protocols,
        config.server_tls_ciphers,
        config.server_tls13_ciphers,
    )
    if config.server_tls_cert_file or config.server_tls_key_file:
        _load_chain(
            context, "server_tls_cert_file", config.server_tls_cert_file, config.server_tls_key_file
        )
    if mode in ("verify-ca", "verify-full"):
        if config.server_tls_ca_file:
            _load_ca(context, "server_tls_ca_file", config.server_tls_ca_file)
        else:
            context.load_default_certs()
        context.verify_mode = ssl.CERT_REQUIRED
        context.check_hostname = mode == "verify-full"
    else:  # allow, prefer, require: encrypted, not authenticated (libpq without a root cert)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


#: The TLS settings that say what is demanded of a peer: the others (files, protocols,
#: ciphers) may be SET to what cannot be loaded yet, as PgBouncer (the key before its
#: certificate), and the running contexts outlive them; these may not (the access checks
#: read them).
TLS_MODES = frozenset({"client_tls_sslmode", "server_tls_sslmode"})


@dataclass(frozen=True)
class TlsSetup:
    """The TLS contexts made from the settings, and the channel binding of our certificate."""

    client: ssl.SSLContext | None
    server: ssl.SSLContext | None
    binding: bytes | None


def tls_setup(config: Config) -> TlsSetup:
    """Every TLS context of config, its files read now (ConfigError: one cannot be made)."""
    return TlsSetup(client_context(config), server_context(config), own_certificate_hash(config))


def tls_changes(old: Config, new: Config) -> set[str]:
    """The TLS settings (client_tls*, server_tls*) that differ between old and new."""
    return {
        f.name
        for f in fields(new)
        if f.name.startswith(("client_tls", "server_tls"))
        and getattr(old, f.name) != getattr(new, f.name)
    }


class _RawSide(asyncio.Protocol):
    """The raw transport's protocol: everything goes to the TlsTransport above it."""

    __slots__ = ("tls",)

    def __init__(self, tls: TlsTransport) -> None:
        self.tls = tls

    def data_received(self, data: bytes) -> None:
        self.tls.encrypted_received(data)

    def eof_received(self) -> bool:
        return False  # a TLS peer that half-closes is gone: close

    def connection_lost(self, exc: Exception | None) -> None:
        self.tls.raw_lost(exc)

    def pause_writing(self) -> None:
        self.tls.app.pause_writing()

    def resume_writing(self) -> None:
        self.tls.app.resume_writing()


class TlsTransport(asyncio.Transport):
    """The plaintext side of a TLS connection over a raw transport.

    on_ready runs once the handshake is done (the protocol may then send); on_failed with
    the error when it fails (the raw transport is then closed, and the protocol gets
    connection_lost as for any closed connection).
    """

    __slots__ = (
        "_closing",
        "_early",
        "_in",
        "_loop",
        "_out",
        "_paused",
        "_raw",
        "_ssl",
        "app",
        "binding",
        "handshaking",
        "on_failed",
        "on_ready",
    )

    def __init__(
        self,
        raw: asyncio.Transport,
        context: ssl.SSLContext,
        app: asyncio.Protocol,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        on_ready: Callable[[], None],
        on_failed: Callable[[Exception], None],
        received: bytes = b"",
        binding: bytes | None = None,
    ) -> None:
        super().__init__()
        self._raw = raw
        self._loop = asyncio.get_running_loop()
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self.app = app
        self.on_ready = on_ready
        self.on_failed = on_failed
        self.handshaking = True
        #: Channel-binding data of the certificate this side presents (the one in force
        #: when the handshake began, whatever a RELOAD does meanwhile).
        self.binding = binding
        #: Plaintext written before the handshake is done, sent right after it.
        self._early: list[bytes] = []
        self._closing = False
        self._paused = False
        raw.set_protocol(_RawSide(self))
        if received:
            self._in.write(received)

    def start(self) -> None:
        """Begin the handshake (apart from __init__: the callbacks may need this object)."""
        self._handshake()

    # --- from the raw transport -----------------------------------------------------------------

    def encrypted_received(self, data: bytes) -> None:
        self._in.write(data)
        if self.handshaking:
            self._handshake()
        else:
            self._read_plain()

    def raw_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.app.connection_lost(exc)

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, OSError, ValueError) as exc:
            self._flush()  # the alert, so that the peer learns why
            self._closing = True
            self._raw.close()
            self.on_failed(exc)
            return
        self.handshaking = False
        early, self._early = self._early, []
        for data in early:
            self._ssl.write(data)
        self._flush()
        self.on_ready()
        if not self._closing:
            self._read_plain()  # anything sent right behind the handshake

    def _read_plain(self) -> None:
        ssl_object = self._ssl
        app = self.app
        while not self._paused and not self._closing:
            try:
                chunk = ssl_object.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLError, OSError) as exc:
                self._closing = True
                self._raw.abort()
                self.on_failed(exc)
                return
            if not chunk:  # close_notify: the peer is done
                self.close()
                return
            app.data_received(chunk)
        if self._out.pending:
            self._flush()  # post-handshake messages (TLS 1.3 tickets, key updates)

    def _flush(self) -> None:
        if self._out.pending:
            self._raw.write(self._out.read())

    # --- the transport the protocol above uses --------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        if self.handshaking:
            self._early.append(bytes(data))
            return
        try:
            self._ssl.write(data)
        except (ssl.SSLError, OSError) as exc:
            self._closing = True
            self._raw.abort()
            self.on_failed(exc)
            return
        self._raw.write(self._out.read())

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if not self.handshaking:
            with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                self._ssl.unwrap()  # close_notify; the peer's is not waited for
            self._flush()
        self._raw.close()

    def abort(self) -> None:
        self._closing = True
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._closing or self._raw.is_closing()

    def pause_reading(self) -> None:
        self._paused = True
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        self._raw.resume_reading()
        if not self.handshaking:
            # Plaintext may wait in the TLS buffers with nothing more coming from the peer;
            # later, not now: the caller may be in the middle of its own work.
            self._loop.call_soon(self._read_plain)

    def is_reading(self) -> bool:
        return not self._paused

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return False

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.app

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.app = protocol  # type: ignore[assignment]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        if name == "peercert":
            return self._ssl.getpeercert()
        if name == "cipher":
            return self._ssl.cipher()
        return self._raw.get_extra_info(name, default)

    @property
    def ssl_object(self) -> ssl.SSLObject:
        return self._ssl


def peer_certificate_hash(transport: TlsTransport) -> bytes:
    """Channel-binding data of the server's certificate; b"" when it has none usable."""
    der = transport.ssl_object.getpeercert(binary_form=True)
    return (certificate_hash(der) if der else None) or b""


def describe(transport: asyncio.BaseTransport | None) -> str:
    """SHOW CLIENTS / SERVERS' tls column: protocol/cipher, or "" without TLS."""
    if not isinstance(transport, TlsTransport) or transport.handshaking:
        return ""
    cipher = transport.ssl_object.cipher()
    if cipher is None:
        return ""
    return f"{cipher[1]}/{cipher[0]}"


def has_certificate(transport: asyncio.BaseTransport | None) -> bool:
    """Whether a TLS peer presented a certificate that was verified."""
    if not isinstance(transport, TlsTransport) or transport.handshaking:
        return False
    return bool(transport.ssl_object.getpeercert())


def certificate_name(transport: asyncio.BaseTransport | None) -> str | None:
    """The CommonName of the verified certificate a TLS peer presented, if any."""
    if not isinstance(transport, TlsTransport) or transport.handshaking:
        return None
    certificate: dict[str, Any] = dict(transport.ssl_object.getpeercert() or {})
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
