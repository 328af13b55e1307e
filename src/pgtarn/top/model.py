"""`pgtarn top`'s model: admin console rows in, what the screen shows out (no I/O).

Rates are computed here from two samples of SHOW STATS' totals (PgBouncer's avg_* columns
are averages over its stats_period, too coarse for a view refreshed every second); p99 comes
from the Prometheus histogram buckets of the same two instants, when the endpoint is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: A row of a SHOW table: column name -> value as the driver gives it (str, int, Decimal, None).
Row = dict[str, Any]

#: Cumulative histogram buckets: (upper bound in seconds, count of observations <= it).
Buckets = list[tuple[float, float]]

#: The pools table's columns, in order; the number keys 1..7 sort by them.
POOL_COLUMNS = ("database", "user", "cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait")
TEXT_COLUMNS = frozenset({"database", "user"})

#: The histogram of transaction durations in pgtarn's Prometheus endpoint (see metrics.py).
XACT_HISTOGRAM = "pgtarn_transaction_duration_seconds"

BUSIEST_LIMIT = 10
ESCAPE = "\x1b"
ENTER = frozenset({"\r", "\n"})
BACKSPACE = frozenset({"\x7f", "\b"})


@dataclass(frozen=True)
class Sample:
    """What one refresh read: SHOW POOLS, SHOW STATS and SHOW CLIENTS, and the transaction
    duration buckets per database (None without a metrics endpoint), at monotonic `taken`."""

    taken: float
    pools: list[Row]
    stats: list[Row]
    clients: list[Row]
    xact_buckets: dict[str, Buckets] | None = None


@dataclass(frozen=True)
class PoolLine:
    database: str
    user: str
    cl_active: int
    cl_waiting: int
    sv_active: int
    sv_idle: int
    maxwait: float


@dataclass(frozen=True)
class DatabaseRates:
    """Per database, between two samples; None where there is nothing to divide by."""

    database: str
    tps: float | None
    qps: float | None
    avg_xact_ms: float | None
    p99_xact_ms: float | None


@dataclass
class Controls:
    """The keys' state: pools sort column and order, database filter, the `/` prompt."""

    sort_index: int = 0
    reverse: bool = False
    filter_text: str = ""
    filter_exact: bool = False
    prompt: str | None = None
    quit: bool = False

    @property
    def sort_column(self) -> str:
        return POOL_COLUMNS[self.sort_index]

    def matches(self, database: str) -> bool:
        if not self.filter_text:
            return True
        if self.filter_exact:
            return database == self.filter_text
        return self.filter_text in database

    def press(self, key: str, databases: Sequence[str]) -> None:
        """One key (or an escape sequence, as one string); `databases` are those `d` cycles."""
        if self.prompt is not None:
            self._edit_prompt(key)
        elif key == "q":
            self.quit = True
        elif key == "s":
            self.sort_index = (self.sort_index + 1) % len(POOL_COLUMNS)
            self.reverse = False
        elif key.isdigit() and 1 <= int(key) <= len(POOL_COLUMNS):
            self.sort_index = int(key) - 1
            self.reverse = False
        elif key == "r":
            self.reverse = not self.reverse
        elif key == "/":
            self.prompt = ""
        elif key == "d":
            self._next_database(sorted(databases))

    def _edit_prompt(self, key: str) -> None:
        assert self.prompt is not None
        if key in ENTER:
            self.filter_text, self.filter_exact = self.prompt, False
            self.prompt = None
        elif key.startswith(ESCAPE):
            self.prompt = None
        elif key in BACKSPACE:
            self.prompt = self.prompt[:-1]
        elif key.isprintable():
            self.prompt += key

    def _next_database(self, names: list[str]) -> None:
        """All -> the first database -> the next ... -> all again."""
        if self.filter_exact and self.filter_text in names:
            index = names.index(self.filter_text) + 1
        else:
            index = 0
        if index < len(names):
            self.filter_text, self.filter_exact = names[index], True
        else:
            self.filter_text, self.filter_exact = "", False


@dataclass(frozen=True)
class View:
    """One frame's content, filtered and sorted."""

    pools: list[PoolLine]
    rates: list[DatabaseRates]
    busiest: list[Row]
    #: None when SHOW CLIENTS has no `pinned` column (PgBouncer): the table is hidden
    pinned: list[Row] | None
    databases: list[str] = field(default_factory=list)


def _number(value: Any) -> float:
    if value is None or value == "":
        return 0.0
    return float(value)


def pool_line(row: Row) -> PoolLine:
    return PoolLine(
        database=str(row["database"]), user=str(row["user"]),
        cl_active=int(_number(row["cl_active"])), cl_waiting=int(_number(row["cl_waiting"])),
        sv_active=int(_number(row["sv_active"])), sv_idle=int(_number(row["sv_idle"])),
        maxwait=_number(row["maxwait"]) + _number(row.get("maxwait_us")) / 1e6,
    )  # fmt: skip


def sorted_pools(lines: list[PoolLine], controls: Controls) -> list[PoolLine]:
    """By the sort column: names A to Z, numbers largest first; `r` turns either round."""
    column = controls.sort_column
    by_name = sorted(lines, key=lambda p: (p.database, p.user))
    descending = column not in TEXT_COLUMNS
    return sorted(by_name, key=lambda p: getattr(p, column), reverse=descending != controls.reverse)


def _counter_delta(before: Row | None, after: Row, column: str) -> float | None:
    """How much a counter grew; None without a previous value or when it went back (a
    restart, RESET of the stats)."""
    if before is None:
        return None
    delta = _number(after.get(column)) - _number(before.get(column))
    return delta if delta >= 0 else None


def quantile(before: Buckets | None, after: Buckets, q: float) -> float | None:
    """The q-quantile (seconds) of the observations between two cumulative bucket lists,
    interpolated linearly inside its bucket (as Prometheus' histogram_quantile does); in the
    +Inf bucket, the largest finite bound. None when the window holds no observation."""
    previous = dict(before or [])
    window = [(bound, count - previous.get(bound, 0.0)) for bound, count in after]
    if not window or window[-1][1] <= 0 or any(c < 0 for _, c in window):
        return None
    rank = q * window[-1][1]
    lower, below = 0.0, 0.0
    for bound, cumulative in window:
        if cumulative >= rank and cumulative > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = bound, cumulative
    return lower


def buckets_from_metrics(text: str) -> dict[str, Buckets]:
    """XACT_HISTOGRAM's cumulative buckets per database (its users summed) from a scrape."""
    per_database: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != XACT_HISTOGRAM + "_bucket":
                continue
            bounds = per_database.setdefault(sample.labels["database"], {})
            bound = float(sample.labels["le"])
            bounds[bound] = bounds.get(bound, 0.0) + sample.value
    return {db: sorted(bounds.items()) for db, bounds in per_database.items()}


def database_rates(before: Sample | None, after: Sample) -> list[DatabaseRates]:
    """Transactions and queries per second, the average and p99 transaction time."""
    previous = {str(r["database"]): r for r in before.stats} if before is not None else {}
    elapsed = after.taken - before.taken if before is not None else 0.0
    rates = []
    for row in after.stats:
        database = str(row["database"])
        old = previous.get(database)
        xacts = _counter_delta(old, row, "total_xact_count")
        queries = _counter_delta(old, row, "total_query_count")
        xact_us = _counter_delta(old, row, "total_xact_time")
        tps = xacts / elapsed if xacts is not None and elapsed > 0 else None
        qps = queries / elapsed if queries is not None and elapsed > 0 else None
        avg = xact_us / xacts / 1000 if xacts and xact_us is not None else None
        rates.append(DatabaseRates(database, tps, qps, avg, _p99_ms(before, after, database)))
    return sorted(rates, key=lambda r: r.database)


def _p99_ms(before: Sample | None, after: Sample, database: str) -> float | None:
    if after.xact_buckets is None or database not in after.xact_buckets:
        return None
    old = before.xact_buckets if before is not None else None
    seconds = quantile((old or {}).get(database), after.xact_buckets[database], 0.99)
    return None if seconds is None else seconds * 1000


def is_busy(row: Row) -> bool:
    """Linked to a server (in a transaction, or a session) or waiting for one."""
    return bool(row.get("link")) or str(row.get("state", "")).startswith("waiting")


def busiest_clients(rows: list[Row], limit: int = BUSIEST_LIMIT) -> list[Row]:
    """The busy clients, those waiting first, then the oldest last request first (the one
    linked or waiting longest), then the longest wait."""
    busy = [r for r in rows if is_busy(r)]
    busy.sort(
        key=lambda r: (
            not str(r.get("state", "")).startswith("waiting"),
            str(r.get("request_time", "")),
            -(_number(r.get("wait")) + _number(r.get("wait_us")) / 1e6),
        )
    )
    return busy[:limit]


def database_names(sample: Sample | None) -> list[str]:
    """The databases of the pools, those `d` cycles through."""
    return [] if sample is None else sorted({str(r["database"]) for r in sample.pools})


def build_view(before: Sample | None, after: Sample, controls: Controls) -> View:
    """The frame for `after` (rates against `before`), as the controls filter and sort it."""
    databases = database_names(after)
    pools = [pool_line(r) for r in after.pools if controls.matches(str(r["database"]))]
    rates = [r for r in database_rates(before, after) if controls.matches(r.database)]
    clients = [r for r in after.clients if controls.matches(str(r.get("database", "")))]
    has_pins = bool(after.clients) and "pinned" in after.clients[0]
    pinned = [r for r in clients if r.get("pinned")] if has_pins else None
    return View(sorted_pools(pools, controls), rates, busiest_clients(clients), pinned, databases)
