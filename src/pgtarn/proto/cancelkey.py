"""What the 8 bytes of a BackendKeyData key that pgtarn hands out say (PgBouncer's layout).

A key is (pid, secret) as BackendKeyData carries them: bytes 0-3 are the pid, big-endian,
bytes 4-7 the secret. Byte 0's top bit is clear, so that the pid is positive (libpq and
drivers take it for a process id), and its next bit set, so that the pid is above any real
process id (Linux's limit is 2**22): a client's pg_terminate_backend or pg_cancel_backend of
its own backend_pid can never reach another session's backend. The rest is random, except:

- with peering on (peer_id 1..16383), byte 1 is the low 8 bits of peer_id and byte 2 the
  high 6, so that any pgtarn or PgBouncer of the group can tell whose key it is; and the low
  2 bits of byte 7 are a time to live, 3 when handed out and one less at each forward to a
  peer: a key that came back with 0 left is not forwarded again (no loops between peers that
  disagree about whose key it is);
- byte 3 names a worker process of this pgtarn (0..255), when there are workers.
"""

from __future__ import annotations

import os
from typing import Final

# (Final: compiled, a constant is a C value where a module global is a dictionary lookup at
# each use, and a type's attribute a generic lookup; index_of runs several times per login)
_FROM_BYTES: Final = int.from_bytes

#: The highest peer_id: 14 bits, in bytes 1 and 2.
MAX_PEER_ID: Final = 16383
#: The time to live of a key handed out: this many forwards between peers.
TTL: Final = 3
_TTL_MASK: Final = 0x3
_PEER_MASK: Final = 0x00FFFF00  # bytes 1 and 2 of the pid
_WORKER_MASK: Final = 0x000000FF  # byte 3 of the pid
_FOLDED_PID: Final = 0x0FFFFFFF  # the pid's bits below its top 3, which index_of folds in
_ABOVE_PIDS: Final = 0x40000000  # set in every pid handed out: no process has such an id

Key = tuple[int, int]


def make_key(peer_id: int, worker: int | None) -> Key:
    """A new key for a client: random (one read of the system's random source), with
    peer_id's bytes and the full TTL when peer_id > 0 and worker in byte 3 when given."""
    if not 0 <= peer_id <= MAX_PEER_ID:
        raise ValueError(f"peer_id {peer_id} out of range 0..{MAX_PEER_ID}")
    if worker is not None and not 0 <= worker <= 0xFF:
        raise ValueError(f"worker {worker} out of range 0..255")
    # what secrets.token_bytes reads, without its wrappers; one int made of the 8 bytes
    raw = _FROM_BYTES(os.urandom(8), "big")
    pid = (raw >> 32) & 0x3FFFFFFF | _ABOVE_PIDS
    secret = raw & 0xFFFFFFFF
    if peer_id:
        pid = (pid & ~_PEER_MASK) | (peer_id & 0xFF) << 16 | (peer_id >> 8) << 8
        secret = (secret & ~_TTL_MASK) | TTL
    if worker is not None:
        pid = (pid & ~_WORKER_MASK) | worker
    return pid, secret


def index_of(key: Key) -> int:
    """The key as the running pooler indexes its clients: its 63 bits folded into 60 (the
    pid's top 3 bits XORed into the secret's low ones). Such an int takes 32 bytes where one
    of 63 bits takes 48 (two 30-bit digits instead of three; one per client). Two keys fold
    into one index at a chance of 2**-60: the index checks the whole key, and refuses a
    key whose index is taken."""
    pid, secret = key
    return ((pid & _FOLDED_PID) << 32 | secret) ^ (pid >> 28)


def peer_of(key: Key) -> int:
    """The peer_id a key names (meaningful only when the key was made with peering on)."""
    pid = key[0]
    return (pid >> 16 & 0xFF) | (pid >> 8 & 0xFF) << 8


def worker_of(key: Key) -> int:
    """The worker index in byte 3 (random in a key made without workers)."""
    return key[0] & _WORKER_MASK


def ttl_of(key: Key) -> int:
    """How many more forwards between peers the key may make."""
    return key[1] & _TTL_MASK


def forwarded(key: Key) -> Key:
    """The key as sent on to a peer: its TTL one less (ttl_of(key) must be > 0)."""
    ttl = ttl_of(key)
    if ttl == 0:
        raise ValueError("a key with no TTL left is not forwarded")
    return key[0], (key[1] & ~_TTL_MASK) | (ttl - 1)


def as_issued(key: Key) -> Key:
    """The key as it was handed out, whatever TTL it came back with (peering on): how a
    CancelRequest forwarded by a peer finds its client."""
    return key[0], key[1] | TTL
