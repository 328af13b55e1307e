"""Traffic counters of one pool (plain integers on the hot path) and the totals built from them.

Connections add to a pool's ``PoolStats`` as they work: bytes each way, one query per
ReadyForQuery, one transaction per ReadyForQuery with status idle, one server assignment per
link, and the time of each (in seconds, from ``time.monotonic()``) into a fixed set of
histogram buckets. Everything else (per-database sums, averages over ``stats_period``,
SHOW STATS, Prometheus) is computed from these counters when someone asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Final

#: Upper bounds (seconds) of the histogram buckets for transaction, query and wait times
#: (bucket_of has them written out: change both).
BUCKETS: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def bucket_of(seconds: float) -> int:
    """The index of the bucket that counts seconds: bisect_left over BUCKETS (the hot path
    calls it at every ReadyForQuery), written out as a tree of comparisons with the bounds
    as literals: compiled, each step is one comparison of two C doubles, where reading
    BUCKETS makes a float object of each bound. test_stats checks it against bisect_left."""
    if seconds <= 0.005:
        if seconds <= 0.0005:
            if seconds <= 0.0001:
                return 0
            return 1 if seconds <= 0.00025 else 2
        if seconds <= 0.001:
            return 3
        return 4 if seconds <= 0.0025 else 5
    if seconds <= 0.5:
        if seconds <= 0.05:
            if seconds <= 0.01:
                return 6
            return 7 if seconds <= 0.025 else 8
        if seconds <= 0.1:
            return 9
        return 10 if seconds <= 0.25 else 11
    if seconds <= 5.0:
        if seconds <= 1.0:
            return 12
        return 13 if seconds <= 2.5 else 14
    if seconds <= 10.0:
        return 15
    if seconds <= 30.0:
        return 16
    return 17 if seconds <= 60.0 else 18


class Histogram:
    """Counts per bucket (the last one is +Inf) and the sum of the observed values."""

    __slots__ = ("counts", "total")

    def __init__(self, counts: list[int] | None = None, total: float = 0.0) -> None:
        self.counts = counts if counts is not None else [0] * (len(BUCKETS) + 1)
        self.total = total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), +Inf last, as Prometheus wants."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*BUCKETS, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def new_buckets() -> list[int]:
    return [0] * (len(BUCKETS) + 1)


def add_one(counts: list[int], index: int) -> None:
    """counts[index] += 1, written out: compiled, ``+=`` on a list item is the generic number
    protocol, where this is an add of two C integers."""
    counts[index] = counts[index] + 1


class PoolStats:
    """What the clients and servers of one pool did since it was made.

    The hot path adds to the flat attributes directly (``add_one(xact_buckets,
    bucket_of(seconds)); xact_sum += seconds``): a count is the sum of its buckets, so one
    observation is one list increment and one float addition.
    """

    __slots__ = (
        "client_logins",
        "pins",
        "query_buckets",
        "query_sum",
        "received",
        "sent",
        "wait_buckets",
        "wait_sum",
        "xact_buckets",
        "xact_sum",
    )

    def __init__(self) -> None:
        self.received = 0  # bytes from clients
        self.sent = 0  # bytes to clients
        self.client_logins = 0
        self.xact_buckets = new_buckets()
        self.xact_sum = 0.0
        self.query_buckets = new_buckets()
        self.query_sum = 0.0
        #: One observation per server assignment (0 when the client did not wait).
        self.wait_buckets = new_buckets()
        self.wait_sum = 0.0
        #: Clients pinned to their server by session state, counted per reason as pins begin.
        self.pins: dict[str, int] = {}

    def note_pin(self, reason: str) -> bool:
        """A client of this pool is pinned for reason; True the first time it is seen."""
        count = self.pins.get(reason, 0)
        self.pins[reason] = count + 1
        return count == 0

    @property
    def xact_count(self) -> int:
        return sum(self.xact_buckets)

    @property
    def query_count(self) -> int:
        return sum(self.query_buckets)

    @property
    def server_assignments(self) -> int:
        return sum(self.wait_buckets)

    @property
    def xact_times(self) -> Histogram:
        return Histogram(list(self.xact_buckets), self.xact_sum)

    @property
    def query_times(self) -> Histogram:
        return Histogram(list(self.query_buckets), self.query_sum)

    @property
    def wait_times(self) -> Histogram:
        return Histogram(list(self.wait_buckets), self.wait_sum)

    def query_done(self, seconds: float) -> None:
        add_one(self.query_buckets, bucket_of(seconds))
        self.query_sum += seconds

    def xact_done(self, seconds: float) -> None:
        add_one(self.xact_buckets, bucket_of(seconds))
        self.xact_sum += seconds

    def assigned(self, waited: float) -> None:
        """A server was linked to a client that waited this long for it (0: no wait)."""
        add_one(self.wait_buckets, bucket_of(waited))
        self.wait_sum += waited


@dataclass
class Totals:
    """Counters summed over pools, in PgBouncer's units: bytes, counts, microseconds."""

    server_assignment_count: int = 0
    xact_count: int = 0
    query_count: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    xact_time: int = 0
    query_time: int = 0
    wait_time: int = 0
    client_parse_count: int = 0
    server_parse_count: int = 0
    bind_count: int = 0
    client_login_count: int = 0

    def add_pool(self, stats: PoolStats, client_parses: int, server_parses: int,
                 binds: int) -> None:
        self.server_assignment_count += stats.server_assignments
        self.xact_count += stats.xact_count
        self.query_count += stats.query_count
        self.bytes_received += stats.received
        self.bytes_sent += stats.sent
        self.xact_time += round(stats.xact_sum * 1e6)
        self.query_time += round(stats.query_sum * 1e6)
        self.wait_time += round(stats.wait_sum * 1e6)
        self.client_parse_count += client_parses
        self.server_parse_count += server_parses
        self.bind_count += binds
        self.client_login_count += stats.client_logins

    def add(self, other: Totals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def values(self) -> list[int]:
        return [getattr(self, f.name) for f in fields(self)]


def averages(now: Totals, before: Totals, seconds: float) -> Totals:
    """Averages over one stats period, as PgBouncer computes them.

    Counts and bytes are per second; transaction and query times are per transaction and
    per query; wait time is per server assignment.
    """
    delta = Totals(*(a - b for a, b in zip(now.values(), before.values(), strict=True)))
    period = max(seconds, 1e-9)

    def rate(value: int) -> int:
        return int(value / period)

    def per(value: int, count: int) -> int:
        return value // count if count > 0 else 0

    return Totals(
        server_assignment_count=rate(delta.server_assignment_count),
        xact_count=rate(delta.xact_count),
        query_count=rate(delta.query_count),
        bytes_received=rate(delta.bytes_received),
        bytes_sent=rate(delta.bytes_sent),
        xact_time=per(delta.xact_time, delta.xact_count),
        query_time=per(delta.query_time, delta.query_count),
        wait_time=per(delta.wait_time, delta.server_assignment_count),
        client_parse_count=rate(delta.client_parse_count),
        server_parse_count=rate(delta.server_parse_count),
        bind_count=rate(delta.bind_count),
        client_login_count=rate(delta.client_login_count),
    )


def sum_totals(items: Iterable[Totals]) -> Totals:
    total = Totals()
    for item in items:
        total.add(item)
    return total
