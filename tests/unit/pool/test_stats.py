"""pool/stats.py: the histogram bucket that counts a time, as the hot path counts it."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given
from hypothesis import strategies as st

from pgtarn.pool.stats import BUCKETS, PoolStats, Timings


def bucket_of(seconds: float) -> int:
    """The bucket that Timings.observe counts seconds in."""
    timings = Timings()
    timings.observe(seconds)
    counts = timings.counts()
    assert sum(counts) == 1 and len(counts) == len(BUCKETS) + 1
    return counts.index(1)


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


def test_counts_add_up_and_the_sum_is_kept() -> None:
    timings = Timings()
    for seconds in (0.00005, 0.00005, 0.003, 45.0, 100.0):
        timings.observe(seconds)
    assert timings.count == 5
    assert abs(timings.total - 145.0031) < 1e-9
    histogram = timings.histogram()
    assert histogram.counts == timings.counts()
    assert dict(histogram.cumulative())[0.0001] == 2
    assert dict(histogram.cumulative())[60.0] == 4


def test_pool_stats_count_from_the_timings() -> None:
    stats = PoolStats()
    stats.query.observe(0.002)
    stats.query.observe(0.002)
    stats.xact.observe(0.004)
    stats.wait.observe(0.0)
    assert (stats.query_count, stats.xact_count, stats.server_assignments) == (2, 1, 1)
    assert abs(stats.query_sum - 0.004) < 1e-12 and stats.xact_sum == 0.004
    assert stats.query_times.counts[4] == 2
