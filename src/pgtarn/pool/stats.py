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
#: (Timings.observe has them written out: change both).
BUCKETS: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class Timings:
    """Durations counted into the BUCKETS (the last count is +Inf) and their sum: one per
    query, transaction or server assignment of a pool.

    The counts are fields, not a list: compiled, adding one to a field is an add of two C
    integers, where a list item past 256 is an int object made anew at each count, three
    times per transaction. observe is bisect_left
    over BUCKETS written out as a tree of comparisons with the bounds as literals (change
    both together); test_stats checks it against bisect_left.
    """

    __slots__ = ("b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11",
                 "b12", "b13", "b14", "b15", "b16", "b17", "b18", "total")  # fmt: skip

    def __init__(self) -> None:
        self.b0 = self.b1 = self.b2 = self.b3 = self.b4 = self.b5 = self.b6 = self.b7 = 0
        self.b8 = self.b9 = self.b10 = self.b11 = self.b12 = self.b13 = self.b14 = 0
        self.b15 = self.b16 = self.b17 = self.b18 = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration (a clock step back counts as the fastest)."""
        self.total += seconds
        if seconds <= 0.005:
            if seconds <= 0.0005:
                if seconds <= 0.0001:
                    self.b0 += 1
                elif seconds <= 0.00025:
                    self.b1 += 1
                else:
                    self.b2 += 1
            elif seconds <= 0.001:
                self.b3 += 1
            elif seconds <= 0.0025:
                self.b4 += 1
            else:
                self.b5 += 1
        elif seconds <= 0.5:
            if seconds <= 0.05:
                if seconds <= 0.01:
                    self.b6 += 1
                elif seconds <= 0.025:
                    self.b7 += 1
                else:
                    self.b8 += 1
            elif seconds <= 0.1:
                self.b9 += 1
            elif seconds <= 0.25:
                self.b10 += 1
            else:
                self.b11 += 1
        elif seconds <= 5.0:
            if seconds <= 1.0:
                self.b12 += 1
            elif seconds <= 2.5:
                self.b13 += 1
            else:
                self.b14 += 1
        elif seconds <= 10.0:
            self.b15 += 1
        elif seconds <= 30.0:
            self.b16 += 1
        elif seconds <= 60.0:
            self.b17 += 1
        else:
            self.b18 += 1

    def counts(self) -> list[int]:
        """The counts per bucket, in the order of BUCKETS, +Inf last."""
        return [self.b0, self.b1, self.b2, self.b3, self.b4, self.b5, self.b6, self.b7,
                self.b8, self.b9, self.b10, self.b11, self.b12, self.b13, self.b14,
                self.b15, self.b16, self.b17, self.b18]  # fmt: skip

    @property
    def count(self) -> int:
        return sum(self.counts())

    def histogram(self) -> Histogram:
        return Histogram(self.counts(), self.total)


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


class PoolStats:
    """What the clients and servers of one pool did since it was made.

    The hot path adds to the fields directly: bytes, and one Timings observation per query,
    transaction and server assignment (a count is the sum of its buckets).
    """

    __slots__ = ("client_logins", "pins", "query", "received", "sent", "wait", "xact")

    def __init__(self) -> None:
        self.received = 0  # bytes from clients
        self.sent = 0  # bytes to clients
        self.client_logins = 0
        self.xact = Timings()
        self.query = Timings()
        #: One observation per server assignment (0 when the client did not wait).
        self.wait = Timings()
        #: Clients pinned to their server by session state, counted per reason as pins begin.
        self.pins: dict[str, int] = {}

    def note_pin(self, reason: str) -> bool:
        """A client of this pool is pinned for reason; True the first time it is seen."""
        count = self.pins.get(reason, 0)
        self.pins[reason] = count + 1
        return count == 0

    @property
    def xact_count(self) -> int:
        return self.xact.count

    @property
    def query_count(self) -> int:
        return self.query.count

    @property
    def server_assignments(self) -> int:
        return self.wait.count

    @property
    def xact_sum(self) -> float:
        return self.xact.total

    @property
    def query_sum(self) -> float:
        return self.query.total

    @property
    def wait_sum(self) -> float:
        return self.wait.total

    @property
    def xact_times(self) -> Histogram:
        return self.xact.histogram()

    @property
    def query_times(self) -> Histogram:
        return self.query.histogram()

    @property
    def wait_times(self) -> Histogram:
        return self.wait.histogram()


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

    def add_pool(
        self, stats: PoolStats, client_parses: int, server_parses: int, binds: int
    ) -> None:
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
