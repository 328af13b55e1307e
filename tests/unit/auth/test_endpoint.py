"""Unit tests for tls-server-end-point: the certificate hash that SCRAM-SHA-256-PLUS binds."""

from __future__ import annotations

import datetime
import hashlib
from typing import TYPE_CHECKING

import pytest

from pgtarn.auth.endpoint import certificate_hash

if TYPE_CHECKING:  # (cryptography is imported by the test that needs it, or it is skipped)
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes

    SigningHash = hashes.SHA256 | hashes.SHA384 | hashes.SHA512


def _certificate(key: CertificateIssuerPrivateKeyTypes, digest: SigningHash | None) -> bytes:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now)
        .sign(key, digest)
    )
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.DER)


def test_certificate_hash_follows_the_signature_algorithm() -> None:
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    for key, digest, expected in (
        (ec_key, hashes.SHA256(), "sha256"),
        (ec_key, hashes.SHA384(), "sha384"),
        (rsa_key, hashes.SHA512(), "sha512"),
        (rsa_key, hashes.SHA256(), "sha256"),
    ):
        der = _certificate(key, digest)
        assert certificate_hash(der) == hashlib.new(expected, der).digest(), (digest, expected)
    # sha1WithRSAEncryption (OpenSSL 3 no longer signs with it): RFC 5929 makes it SHA-256
    der = _certificate(rsa_key, hashes.SHA512())
    cut = der.rindex(bytes.fromhex("2a864886f70d01010d"))
    sha1 = der[:cut] + bytes.fromhex("2a864886f70d010105") + der[cut + 9 :]
    assert certificate_hash(sha1) == hashlib.sha256(sha1).digest()
    assert certificate_hash(_certificate(ed25519.Ed25519PrivateKey.generate(), None)) is None
    for broken in (b"", b"\x30", b"\x30\x82\xff\xff", b"\x04\x00", b"\x30\x03\x30\x01\x00"):
        assert certificate_hash(broken) is None
