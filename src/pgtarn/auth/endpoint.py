"""tls-server-end-point channel binding data (RFC 5929): the hash of a TLS certificate."""

from __future__ import annotations

import hashlib


def _oid(dotted: str) -> bytes:
    """The DER content bytes of an object identifier."""
    numbers = [int(n) for n in dotted.split(".")]
    out = bytearray([40 * numbers[0] + numbers[1]])
    for number in numbers[2:]:
        chunk = [number & 0x7F]
        number >>= 7
        while number:
            chunk.append(0x80 | (number & 0x7F))
            number >>= 7
        out += bytes(reversed(chunk))
    return bytes(out)


# Signature algorithm -> the hash for the binding: the signature's own, except that MD5 and
# SHA-1 become SHA-256 (RFC 5929 section 4.1). Others (RSASSA-PSS, Ed25519) have no
# binding, as in PostgreSQL.
_CERT_HASHES = {
    _oid(dotted): name
    for dotted, name in (
        ("1.2.840.113549.1.1.4", "sha256"),
        ("1.2.840.113549.1.1.5", "sha256"),
        ("1.2.840.113549.1.1.11", "sha256"),
        ("1.2.840.113549.1.1.12", "sha384"),
        ("1.2.840.113549.1.1.13", "sha512"),
        ("1.2.840.113549.1.1.14", "sha224"),
        ("1.2.840.10045.4.1", "sha256"),
        ("1.2.840.10045.4.3.1", "sha224"),
        ("1.2.840.10045.4.3.2", "sha256"),
        ("1.2.840.10045.4.3.3", "sha384"),
        ("1.2.840.10045.4.3.4", "sha512"),
        ("1.2.840.10040.4.3", "sha256"),
        ("2.16.840.1.101.3.4.3.2", "sha256"),
    )
}


def _der_item(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER item at pos."""
    if pos + 2 > len(data):
        raise ValueError("truncated DER")
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        size = length & 0x7F
        if not 0 < size <= 4 or pos + size > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos : pos + size], "big")
        pos += size
    if pos + length > len(data):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def certificate_hash(der: bytes) -> bytes | None:
    """tls-server-end-point channel-binding data for a DER certificate (None: no binding)."""
    try:
        tag, start, _ = _der_item(der, 0)  # Certificate
        if tag != 0x30:
            return None
        tag, _, tbs_end = _der_item(der, start)  # tbsCertificate
        tag, alg_start, _ = _der_item(der, tbs_end)  # signatureAlgorithm
        oid_tag, oid_start, oid_end = _der_item(der, alg_start)
    except ValueError:
        return None
    if tag != 0x30 or oid_tag != 0x06:
        return None
    name = _CERT_HASHES.get(der[oid_start:oid_end])
    return hashlib.new(name, der).digest() if name is not None else None
