"""Tests for pgtarn.session.stale: PostgreSQL's stale-statement errors, a Describe's digest,
and whether a batch reads a new description."""

from __future__ import annotations

from pgtarn.session.framer import SYNC_MARK, Part
from pgtarn.session.stale import description_digest, means_stale, reads_description


def _error(code: str, text: str) -> bytes:
    return f"SERROR\x00C{code}\x00M{text}\x00\x00".encode()


def _row_description(*columns: tuple[str, int, int]) -> bytes:
    """(name, table OID, type OID) per column."""
    out = len(columns).to_bytes(2, "big")
    for name, table, oid in columns:
        out += name.encode() + b"\x00" + table.to_bytes(4, "big") + b"\x00\x01"
        out += oid.to_bytes(4, "big") + b"\x00\x04" + b"\xff\xff\xff\xff" + b"\x00\x00"
    return out


def test_the_errors_that_mean_stale_and_only_those() -> None:
    assert means_stale(_error("0A000", "cached plan must not change result type"))
    assert means_stale(_error("XX000", "cache lookup failed for type 16410"))
    assert means_stale(
        _error("42804", 'column "c" is of type macaddr but expression is of type inet')
    )
    assert not means_stale(_error("0A000", "something else not supported"))
    assert not means_stale(_error("23505", "duplicate key value violates unique constraint"))


def test_a_digest_keeps_names_and_types_not_the_table() -> None:
    parameters = b"\x00\x01\x00\x00\x00\x17"
    before = description_digest(parameters, 0x54, _row_description(("a", 100, 23)))
    remade = description_digest(parameters, 0x54, _row_description(("a", 200, 23)))
    retyped = description_digest(parameters, 0x54, _row_description(("a", 100, 700)))
    renamed = description_digest(parameters, 0x54, _row_description(("b", 100, 23)))
    assert before == remade  # the table made again: the client decodes the same
    assert before not in (retyped, renamed)
    assert description_digest(parameters, 0x6E, b"") != before  # NoData


def test_a_row_description_pgtarn_cannot_read_is_compared_whole() -> None:
    broken = b"\x00\x02a\x00\x00"  # two columns announced, one cut short
    assert description_digest(b"", 0x54, broken) == b"|" + broken


def test_a_batch_reads_a_description_after_the_bind_or_from_a_query() -> None:
    bind: Part = (0x42, b"")
    describe: Part = (0x44, b"P\x00")
    execute: Part = (0x45, b"")
    assert reads_description([bind, describe, execute, SYNC_MARK], 0)
    assert not reads_description([bind, execute, SYNC_MARK, describe], 0)
    assert not reads_description([bind, execute, (0x42, b""), describe], 0)
    assert reads_description([(0x51, b"EXECUTE s\x00")], 0)
