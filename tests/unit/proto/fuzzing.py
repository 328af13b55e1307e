"""Hypothesis strategies and stream helpers shared by the protocol fuzz tests."""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st

from pgtarn.proto import build

FUZZ = settings(max_examples=150, deadline=None, database=None)
FEW = settings(max_examples=60, deadline=None, database=None)

Message = tuple[int, bytes]

TYPES = list(b"RSKZENvpQPBDCHXdcf123ITn")
message_types = st.sampled_from(TYPES)
messages = st.lists(st.tuples(message_types, st.binary(max_size=120)), max_size=20)
cuts = st.lists(st.integers(min_value=0, max_value=4000), max_size=12)


def chunked(data: bytes, points: list[int]) -> list[bytes]:
    """data cut at the given points (taken modulo its length), in order, none lost."""
    marks = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(marks)] or [b""]


def encode(msgs: list[Message]) -> bytes:
    return b"".join(build.message(bytes((t,)), body) for t, body in msgs)


def bad_lengths(max_size: int) -> st.SearchStrategy[int]:
    """Length words a peer must not send: < 4, above the maximum, high bit set, 2**32 - 1."""
    return st.one_of(
        st.integers(0, 3),
        st.integers(max_size + 1, 2**32 - 1),
        st.sampled_from([max_size + 1, 2**31, 2**31 + 3, 2**32 - 4, 2**32 - 1]),
    )


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """data with a few spots flipped, cut out, or with junk (often a length word) inserted."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(out)))
        kind = draw(st.sampled_from(["flip", "cut", "insert", "length", "truncate"]))
        if kind == "flip" and pos < len(out):
            out[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del out[pos : pos + draw(st.integers(1, 8))]
        elif kind == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=6))
        elif kind == "length":
            out[pos : pos + 4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
        else:
            del out[pos:]
    return bytes(out)


#: Non-empty strings without NUL: user, parameter and database names.
names = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), min_size=1, max_size=12
)
