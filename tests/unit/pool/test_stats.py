"""pool/stats.py: the histogram bucket of a time, as the hot path computes it."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given
from hypothesis import strategies as st

from pgtarn.pool.stats import BUCKETS, bucket_of


def test_each_bound_counts_in_its_own_bucket() -> None:
    for index, bound in enumerate(BUCKETS):
        assert bucket_of(bound) == index
        assert bucket_of(bound * 1.000001) == index + 1


def test_the_ends() -> None:
    assert bucket_of(0.0) == 0
    assert bucket_of(-1.0) == 0  # a clock step back counts as the fastest
    assert bucket_of(BUCKETS[-1] + 1) == len(BUCKETS)  # the +Inf bucket
    assert bucket_of(float("inf")) == len(BUCKETS)


@given(st.floats(min_value=-1.0, max_value=1e6, allow_nan=False))
def test_same_as_bisect_left(seconds: float) -> None:
    assert bucket_of(seconds) == bisect_left(BUCKETS, seconds)
