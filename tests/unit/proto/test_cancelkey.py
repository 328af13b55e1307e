"""Tests for pgtarn.proto.cancelkey: the layout of the BackendKeyData keys pgtarn hands out."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtarn.config.settings import MAX_PEER_ID
from pgtarn.proto import cancelkey
from pgtarn.proto.cancelkey import (
    as_issued,
    forwarded,
    index_of,
    make_key,
    peer_of,
    ttl_of,
    worker_of,
)

peer_ids = st.integers(1, MAX_PEER_ID)
workers = st.none() | st.integers(0, 255)


def _bytes(key: tuple[int, int]) -> bytes:
    return key[0].to_bytes(4, "big") + key[1].to_bytes(4, "big")


def test_bound_matches_config() -> None:
    assert cancelkey.MAX_PEER_ID == MAX_PEER_ID


@given(peer_ids, workers)
def test_peer_key_layout(peer_id: int, worker: int | None) -> None:
    key = make_key(peer_id, worker)
    raw = _bytes(key)
    assert raw[0] & 0x80 == 0  # a positive pid
    assert raw[1] == peer_id & 0xFF and raw[2] == peer_id >> 8
    assert raw[7] & 0x3 == 3
    assert peer_of(key) == peer_id
    assert ttl_of(key) == 3
    if worker is not None:
        assert raw[3] == worker and worker_of(key) == worker
    assert 0 <= key[1] <= 0xFFFFFFFF


@given(workers)
def test_no_peer_key_is_random_but_pid_positive(worker: int | None) -> None:
    key = make_key(0, worker)
    assert 0 <= key[0] <= 0x7FFFFFFF and 0 <= key[1] <= 0xFFFFFFFF
    if worker is not None:
        assert worker_of(key) == worker


@given(st.integers(0, MAX_PEER_ID), workers)
def test_a_pid_is_never_a_real_process_id(peer_id: int, worker: int | None) -> None:
    """Above Linux's highest process id (2**22, PID_MAX_LIMIT): a client's
    pg_terminate_backend(its backend_pid) can never reach another session's backend."""
    pid = make_key(peer_id, worker)[0]
    assert 2**30 <= pid <= 0x7FFFFFFF


def test_keys_differ_and_use_the_random_bits() -> None:
    keys = {make_key(0, None) for _ in range(200)}
    assert len(keys) == 200
    # without peering, the TTL bits and the peer bytes are random too: both values seen
    assert {key[1] & 0x3 for key in keys} == {0, 1, 2, 3}
    assert len({peer_of(key) for key in keys}) > 100
    # with peering, the other bytes stay random
    peered = {make_key(5, None) for _ in range(200)}
    assert {key[0] >> 30 for key in peered} == {1}  # byte 0: 0x40 and 6 random bits
    assert len({key[0] >> 24 for key in peered}) > 40
    assert len({worker_of(key) for key in peered}) > 50
    assert len({key[1] >> 2 for key in peered}) == 200


def test_forwarded_counts_the_ttl_down() -> None:
    key = make_key(7, 3)
    hops = [key]
    while ttl_of(hops[-1]):
        hops.append(forwarded(hops[-1]))
    assert [ttl_of(k) for k in hops] == [3, 2, 1, 0]
    assert all(peer_of(k) == 7 and worker_of(k) == 3 and k[0] == key[0] for k in hops)
    assert all(k[1] >> 2 == key[1] >> 2 for k in hops)
    with pytest.raises(ValueError):
        forwarded(hops[-1])
    assert all(as_issued(k) == key for k in hops)


@pytest.mark.parametrize(
    ("peer_id", "worker"), [(-1, None), (MAX_PEER_ID + 1, None), (0, 256), (0, -1)]
)
def test_out_of_range(peer_id: int, worker: int | None) -> None:
    with pytest.raises(ValueError):
        make_key(peer_id, worker)


def test_highest_peer_id() -> None:
    key = make_key(MAX_PEER_ID, None)
    assert peer_of(key) == MAX_PEER_ID
    assert _bytes(key)[1:3] == bytes([0xFF, 0x3F])


def test_a_key_folds_into_an_index_of_sixty_bits() -> None:
    """The runtime's index of its clients: a two-digit int, and distinct for keys that differ
    anywhere but in the folded bits (the pid's top 3 against the secret's low 3)."""
    keys = [make_key(peer, worker) for peer in (0, 5) for worker in (None, 3) for _ in range(50)]
    keys += [(0x7FFFFFFF, 0xFFFFFFFF), (0, 0), (1, 0), (0, 1)]
    indices = {index_of(key) for key in keys}
    assert len(indices) == len(set(keys))
    assert all(0 <= index < 2**60 for index in indices)
    assert max(sys.getsizeof(index) for index in indices) <= 32  # (a 63-bit int takes 36)
    assert index_of((5, 76)) == index_of(((1 << 28) | 5, 77))  # the one way two keys meet
