"""A throwaway certificate authority and the certificates the TLS tests need."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SigningHash = hashes.SHA224 | hashes.SHA256 | hashes.SHA384 | hashes.SHA512
"""The digests a certificate may be signed with (what x509's sign accepts, SHA-3 left out)."""

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    """Everything the TLS tests use; paths are PEM files.

    ca: the trusted test CA. server: for localhost / 127.0.0.1 / ::1 (PostgreSQL's and
    pgtarn's). wrong_host: trusted, but for another host name. clients: a certificate per
    role name (CN). stranger: a client certificate for "app" from an untrusted CA.
    """

    ca: str
    server: Issued
    wrong_host: Issued
    clients: dict[str, Issued]
    stranger: Issued
    other_ca: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: PrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class _Authority:
    def __init__(self, common_name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.name = _name(common_name)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        directory: Path,
        stem: str,
        common_name: str,
        *,
        server: bool,
        hosts: tuple[str, ...] = (),
        key: PrivateKey | None = None,
        digest: SigningHash | None = None,
    ) -> Issued:
        key = key or ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, digest or hashes.SHA256())
        issued = Issued(str(directory / f"{stem}.crt"), str(directory / f"{stem}.key"))
        _write_cert(cert, Path(issued.cert))
        _write_key(key, Path(issued.key))
        return issued


def make_pki(directory: Path, client_names: tuple[str, ...]) -> Pki:
    """Make the CA and certificates in directory (readable by its owner only)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _Authority("pgtarn test CA")
    other = _Authority("someone else's CA")
    ca_file, other_file = directory / "ca.crt", directory / "other-ca.crt"
    _write_cert(ca.cert, ca_file)
    _write_cert(other.cert, other_file)
    local = ("localhost", "127.0.0.1", "::1")
    return Pki(
        ca=str(ca_file),
        server=ca.issue(directory, "server", "localhost", server=True, hosts=local),
        wrong_host=ca.issue(
            directory, "wrong-host", "db.example", server=True, hosts=("db.example",)
        ),
        clients={
            name: ca.issue(directory, f"client-{name}", name, server=False) for name in client_names
        },
        stranger=other.issue(directory, "stranger", "app", server=False),
        other_ca=str(other_file),
    )


def make_rsa_certificate(directory: Path, stem: str, digest: SigningHash) -> Issued:
    """A self-signed-CA RSA server certificate signed with digest (channel binding hashes)."""
    authority = _Authority(f"{stem} CA")
    return authority.issue(
        directory,
        stem,
        "localhost",
        server=True,
        hosts=("127.0.0.1",),
        key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        digest=digest,
    )
