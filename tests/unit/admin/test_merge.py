"""The workers' SHOW tables merged into the whole pgtarn's (workers = N)."""

from __future__ import annotations

import pytest

from pgtarn.admin.merge import MERGED, WORKER_COLUMN, merge
from pgtarn.admin.show import SHOW_TABLES
from pgtarn.admin.split import Cell
from pgtarn.admin.tables import (
    POOLS_COLUMNS,
    STATS_AVERAGES_COLUMNS,
    STATS_COLUMNS,
    Table,
    Value,
)
from pgtarn.config.settings import Config
from pgtarn.runtime import Runtime


def _pool(
    database: str,
    user: str,
    active: int,
    waiting: int,
    maxwait: tuple[int, int],
    mode: str = "transaction",
) -> list[Value]:
    return [database, user, active, waiting, 0, 0, active, 0, 0, 2, 0, 0, 1, *maxwait, mode, None]


def test_pools_add_counts_keep_the_longest_wait_and_sort_by_key() -> None:
    w0 = Table(
        POOLS_COLUMNS, [_pool("app", "app", 3, 1, (0, 900_000)), _pool("b", "u", 1, 0, (0, 0))]
    )
    w1 = Table(POOLS_COLUMNS, [_pool("a", "u", 2, 0, (0, 0)), _pool("app", "app", 4, 2, (1, 5))])
    out = merge("pools", [(1, w1), (0, w0)])
    assert [r[:2] for r in out.rows] == [["a", "u"], ["app", "app"], ["b", "u"]]
    app = dict(zip([c for c, _ in out.columns], out.rows[1], strict=True))
    assert (app["cl_active"], app["cl_waiting"], app["sv_active"], app["sv_idle"]) == (7, 3, 7, 4)
    assert (app["maxwait"], app["maxwait_us"]) == (1, 5)
    assert app["pool_mode"] == "transaction"
    assert out.columns == POOLS_COLUMNS


def test_clients_are_listed_with_their_worker_at_the_end() -> None:
    columns = SHOW_TABLES["clients"](Runtime(Config.default(), {})).columns
    row: list[Cell] = ["C"] + [None] * (len(columns) - 1)
    out = merge("clients", [(0, Table(columns, [row, row])), (1, Table(columns, [row]))])
    assert out.columns == [*columns, WORKER_COLUMN]
    assert [r[-1] for r in out.rows] == [0, 0, 1]


def _stats_row(database: str, totals: list[int], avgs: list[int]) -> list[Value]:
    return [database, *totals, *avgs]


def test_stats_add_totals_and_rates_and_weigh_durations_by_their_rate() -> None:
    #            assign xact query recv sent xact_t query_t wait_t cparse sparse bind login
    t0 = [10, 20, 30, 100, 200, 5000, 4000, 300, 1, 2, 3, 4]
    a0 = [2, 4, 6, 10, 20, 1000, 500, 30, 1, 1, 1, 1]
    t1 = [5, 10, 15, 50, 100, 2500, 2000, 150, 0, 0, 0, 1]
    a1 = [1, 1, 2, 5, 10, 4000, 800, 60, 0, 0, 0, 0]
    out = merge(
        "stats",
        [
            (0, Table(STATS_COLUMNS, [_stats_row("app", t0, a0)])),
            (1, Table(STATS_COLUMNS, [_stats_row("app", t1, a1)])),
        ],
    )
    row = dict(zip([c for c, _ in out.columns], out.rows[0], strict=True))
    assert row["total_xact_count"] == 30 and row["total_xact_time"] == 7500
    assert row["avg_xact_count"] == 5 and row["avg_recv"] == 15
    assert row["avg_xact_time"] == (1000 * 4 + 4000 * 1) // 5
    assert row["avg_query_time"] == (500 * 6 + 800 * 2) // 8
    assert row["avg_wait_time"] == (30 * 2 + 60 * 1) // 3


def test_stats_averages_weigh_durations_and_a_silent_worker_counts_for_nothing() -> None:
    busy: list[Cell] = ["app", 2, 4, 6, 10, 20, 1000, 500, 30, 1, 1, 1, 1]
    idle: list[Cell] = ["app", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    out = merge(
        "stats_averages",
        [(0, Table(STATS_AVERAGES_COLUMNS, [busy])), (1, Table(STATS_AVERAGES_COLUMNS, [idle]))],
    )
    assert out.rows == [busy]


def test_totals_add_and_weigh_by_name() -> None:
    columns = SHOW_TABLES["totals"](Runtime(Config.default(), {})).columns
    w0 = Table(columns, [["total_xact_count", 10], ["avg_xact_count", 2], ["avg_xact_time", 100]])
    w1 = Table(columns, [["total_xact_count", 5], ["avg_xact_count", 6], ["avg_xact_time", 500]])
    out = merge("totals", [(0, w0), (1, w1)])
    assert out.rows == [
        ["total_xact_count", 15],
        ["avg_xact_count", 8],
        ["avg_xact_time", (200 + 3000) // 8],
    ]


def test_lists_add_connections_and_take_the_greatest_of_the_rest() -> None:
    columns = SHOW_TABLES["lists"](Runtime(Config.default(), {})).columns
    w0 = Table(columns, [["databases", 2], ["pools", 3], ["used_clients", 4]])
    w1 = Table(columns, [["databases", 2], ["pools", 1], ["used_clients", 5]])
    assert merge("lists", [(0, w0), (1, w1)]).rows == [
        ["databases", 2],
        ["pools", 3],
        ["used_clients", 9],
    ]


def test_databases_add_connections_and_flag_a_pause_in_any_worker() -> None:
    runtime = Runtime(Config.default(), {})
    columns = SHOW_TABLES["databases"](runtime).columns
    names = [c for c, _ in columns]

    def row(pool_size: int, current: int, clients: int, paused: int) -> list[Value]:
        values: dict[str, Value] = {
            "name": "app",
            "pool_size": pool_size,
            "current_connections": current,
            "current_client_connections": clients,
            "paused": paused,
        }
        return [values.get(n) for n in names]

    out = merge(
        "databases",
        [(0, Table(columns, [row(20, 3, 5, 0)])), (1, Table(columns, [row(20, 2, 1, 1)]))],
    )
    merged = dict(zip(names, out.rows[0], strict=True))
    assert (
        merged["pool_size"],
        merged["current_connections"],
        merged["current_client_connections"],
        merged["paused"],
    ) == (20, 5, 6, 1)


def test_state_says_each_workers_value_when_they_differ() -> None:
    columns = SHOW_TABLES["state"](Runtime(Config.default(), {})).columns
    w0 = Table(columns, [["active", "yes"], ["paused", "no"]])
    w1 = Table(columns, [["active", "no"], ["paused", "no"]])
    assert merge("state", [(0, w0), (1, w1)]).rows == [
        ["active", "yes on worker 0, no on worker 1"],
        ["paused", "no"],
    ]


@pytest.mark.parametrize("what", sorted(MERGED))
def test_every_gathered_table_merges_with_its_own_columns(what: str) -> None:
    table = SHOW_TABLES[what](Runtime(Config.default(), {}))
    out = merge(what, [(0, table), (1, table)])
    extra = [WORKER_COLUMN] if what in ("clients", "servers", "sockets", "active_sockets") else []
    assert out.columns == [*table.columns, *extra]


def test_settings_tables_are_not_gathered() -> None:
    assert not {"config", "version", "peers"} & set(MERGED)


def test_show_mem_adds_the_workers_counts_and_bytes() -> None:
    columns = SHOW_TABLES["mem"](Runtime(Config.default(), {})).columns
    w0 = Table(columns, [["clients", 400, 2, 0, 800], ["servers", 300, 1, 0, 300]])
    w1 = Table(columns, [["clients", 400, 3, 0, 1200], ["servers", 300, 0, 0, 0]])
    assert merge("mem", [(1, w1), (0, w0)]).rows == [
        ["clients", 400, 5, 0, 2000],
        ["servers", 300, 1, 0, 300],
    ]
