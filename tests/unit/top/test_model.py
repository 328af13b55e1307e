"""pgtarn top's pure part: rates from two samples, p99 from histogram buckets, sorting,
filtering, the busiest and pinned clients, and the keys."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from pgtarn.top.model import (
    POOL_COLUMNS,
    Controls,
    Sample,
    buckets_from_metrics,
    build_view,
    database_rates,
    quantile,
)


def pool(
    database: str,
    user: str = "app",
    cl_active: int = 0,
    cl_waiting: int = 0,
    maxwait: int = 0,
    maxwait_us: int = 0,
) -> dict[str, object]:
    return {
        "database": database,
        "user": user,
        "cl_active": cl_active,
        "cl_waiting": cl_waiting,
        "sv_active": 0,
        "sv_idle": 1,
        "maxwait": maxwait,
        "maxwait_us": maxwait_us,
        "pool_mode": "transaction",
    }


def stats(database: str, xacts: int, queries: int, xact_us: int) -> dict[str, object]:
    # psycopg gives NUMERIC columns as Decimal
    return {
        "database": database,
        "total_xact_count": Decimal(xacts),
        "total_query_count": Decimal(queries),
        "total_xact_time": Decimal(xact_us),
        "avg_xact_count": Decimal(999),
    }


def client(
    database: str,
    state: str,
    link: str = "",
    request: str = "2024-01-01 10:00:00",
    pinned: str | None = None,
    port: int = 5000,
) -> dict[str, object]:
    row: dict[str, object] = {
        "database": database,
        "user": "app",
        "state": state,
        "addr": "127.0.0.1",
        "port": port,
        "link": link,
        "request_time": request,
        "wait": 0,
        "wait_us": 0,
        "application_name": "",
    }
    if pinned is not None:
        row["pinned"] = pinned
    return row


def sample(
    taken: float,
    stat_rows: list[dict[str, Any]],
    *,
    pools: list[dict[str, Any]] | None = None,
    clients: list[dict[str, Any]] | None = None,
    buckets: dict[str, list[tuple[float, float]]] | None = None,
) -> Sample:
    return Sample(
        taken=taken,
        pools=pools or [],
        stats=stat_rows,
        clients=clients or [],
        xact_buckets=buckets,
    )


def test_rates_are_the_counters_deltas_over_the_time_between_samples() -> None:
    before = sample(10.0, [stats("app", 100, 300, 50_000), stats("other", 5, 5, 0)])
    after = sample(12.0, [stats("app", 140, 380, 90_000), stats("other", 5, 5, 0)])
    rates = {r.database: r for r in database_rates(before, after)}
    assert rates["app"].tps == pytest.approx(20.0)
    assert rates["app"].qps == pytest.approx(40.0)
    # 40 transactions took 40 ms more in all: 1 ms each
    assert rates["app"].avg_xact_ms == pytest.approx(1.0)
    assert rates["other"].tps == 0.0 and rates["other"].avg_xact_ms is None


def test_no_rates_without_a_previous_sample_or_after_a_counter_reset() -> None:
    after = sample(12.0, [stats("app", 140, 380, 90_000)])
    (first,) = database_rates(None, after)
    assert (first.tps, first.qps, first.avg_xact_ms) == (None, None, None)
    restarted = sample(13.0, [stats("app", 3, 3, 100)])
    (reset,) = database_rates(after, restarted)
    assert (reset.tps, reset.qps, reset.avg_xact_ms) == (None, None, None)
    new_db = sample(13.0, [stats("app", 150, 390, 90_000), stats("new", 7, 7, 7)])
    assert {r.database: r.tps for r in database_rates(after, new_db)} == {
        "app": pytest.approx(10.0),
        "new": None,
    }


def test_p99_interpolates_in_the_bucket_of_the_99th_percentile_of_the_window() -> None:
    before = [(0.001, 10.0), (0.01, 10.0), (0.1, 10.0), (float("inf"), 10.0)]
    # 100 new transactions: 90 under 1 ms, 10 between 10 and 100 ms
    after = [(0.001, 100.0), (0.01, 100.0), (0.1, 110.0), (float("inf"), 110.0)]
    # rank 99 of 100: the 9th of the 10 in (0.01, 0.1]
    assert quantile(before, after, 0.99) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert quantile(None, after, 0.5) == pytest.approx(0.001 * 55 / 100)
    assert quantile(after, after, 0.99) is None  # no transaction in the window
    tail = [(0.001, 0.0), (0.01, 0.0), (0.1, 0.0), (float("inf"), 5.0)]
    assert quantile(None, tail, 0.99) == 0.1  # in +Inf: the largest finite bound


def test_p99_per_database_from_the_prometheus_text() -> None:
    text = (
        "# TYPE pgtarn_transaction_duration_seconds histogram\n"
        + "\n".join(
            f'pgtarn_transaction_duration_seconds_bucket{{database="{db}",user="{u}",le="{le}"}}'
            f" {n}"
            for db, u, le, n in (
                ("app", "a", "0.01", 3),
                ("app", "a", "+Inf", 4),
                ("app", "b", "0.01", 1),
                ("app", "b", "+Inf", 1),
                ("x", "a", "0.01", 0),
                ("x", "a", "+Inf", 0),
            )
        )
        + "\n"
    )
    buckets = buckets_from_metrics(text)
    assert buckets["app"] == [(0.01, 4.0), (float("inf"), 5.0)]  # the users summed
    before = sample(1.0, [stats("app", 0, 0, 0)], buckets=None)
    after = sample(2.0, [stats("app", 5, 5, 0)], buckets=buckets)
    (rates,) = database_rates(before, after)
    assert rates.p99_xact_ms == pytest.approx(10.0)  # +Inf: the largest finite bound


def test_pools_sort_by_the_chosen_column_and_filter_by_database() -> None:
    rows = [
        pool("b", cl_active=1),
        pool("a", cl_active=3),
        pool("c", cl_active=2),
        pool("pgbouncer", user="pgbouncer"),
    ]
    now = sample(1.0, [], pools=rows)
    controls = Controls()
    assert [p.database for p in build_view(None, now, controls).pools] == [
        "a",
        "b",
        "c",
        "pgbouncer",
    ]
    controls.press("s", ["a"])  # database -> user
    controls.press("s", ["a"])  # user -> cl_active, numbers largest first
    assert POOL_COLUMNS[controls.sort_index] == "cl_active"
    assert [p.cl_active for p in build_view(None, now, controls).pools] == [3, 2, 1, 0]
    controls.press("r", [])
    assert [p.cl_active for p in build_view(None, now, controls).pools] == [0, 1, 2, 3]
    controls.press("1", [])
    assert POOL_COLUMNS[controls.sort_index] == "database" and not controls.reverse
    for key in "/pgb\r":
        controls.press(key, [])
    assert [p.database for p in build_view(None, now, controls).pools] == ["pgbouncer"]
    for key in "/\r":  # an empty filter shows every database again
        controls.press(key, [])
    assert len(build_view(None, now, controls).pools) == 4


def test_maxwait_counts_its_microseconds() -> None:
    now = sample(1.0, [], pools=[pool("a", maxwait=2, maxwait_us=500_000)])
    assert build_view(None, now, Controls()).pools[0].maxwait == pytest.approx(2.5)


def test_d_cycles_through_the_databases_then_back_to_all() -> None:
    controls = Controls()
    names = ["a", "ab", "b"]
    controls.press("d", names)
    assert controls.matches("a") and not controls.matches("ab")  # exact, not a prefix
    controls.press("d", names)
    assert controls.matches("ab") and not controls.matches("a")
    controls.press("d", names)
    controls.press("d", names)
    assert all(controls.matches(n) for n in names)


def test_prompt_keys_edit_and_escape_cancels() -> None:
    controls = Controls()
    for key in ["/", "a", "x", "\x7f", "b"]:
        controls.press(key, [])
    assert controls.prompt == "ab" and controls.matches("zzz")  # not applied before Enter
    controls.press("\x1b", [])
    assert controls.prompt is None and controls.matches("zzz")
    controls.press("q", [])
    assert controls.quit


def test_q_in_the_prompt_is_a_letter_not_quit() -> None:
    controls = Controls()
    for key in "/q\r":
        controls.press(key, [])
    assert not controls.quit and controls.matches("qa") and not controls.matches("a")


def test_busiest_clients_waiting_first_then_the_oldest_request() -> None:
    rows = [
        client("app", "active", request="2024-01-01 10:00:05", port=1),
        client("app", "idle", port=2),
        client("app", "active", link="0x1", request="2024-01-01 10:00:03", port=3),
        client("app", "waiting", request="2024-01-01 10:00:09", port=4),
        client("other", "active", link="0x2", request="2024-01-01 10:00:01", port=5),
    ]
    view = build_view(None, sample(1.0, [], clients=rows), Controls())
    # busy: linked to a server or waiting for one (an unlinked "active" is idle)
    assert [c["port"] for c in view.busiest] == [4, 5, 3]
    assert view.pinned is None  # PgBouncer: no pinned column
    controls = Controls(filter_text="app", filter_exact=True)
    assert [
        c["port"] for c in build_view(None, sample(1.0, [], clients=rows), controls).busiest
    ] == [4, 3]


def test_pinned_clients_listed_when_the_column_is_there() -> None:
    rows = [
        client("app", "active", link="0x1", pinned="temp_table", port=1),
        client("app", "idle", pinned="", port=2),
        client("other", "idle", pinned="advisory_lock", port=3),
    ]
    view = build_view(None, sample(1.0, [], clients=rows), Controls())
    assert view.pinned is not None and [c["port"] for c in view.pinned] == [1, 3]
    filtered = build_view(None, sample(1.0, [], clients=rows), Controls(filter_text="oth"))
    assert filtered.pinned is not None and [c["port"] for c in filtered.pinned] == [3]
