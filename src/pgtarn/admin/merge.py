"""The SHOW tables of every worker (workers = N) merged into the one table of the whole pgtarn.

Sans-IO: tables in (each with the index of the worker that made it), one table out. Each
table has its rule, written beside it in MERGED:

- connection lists (CLIENTS, SERVERS, SOCKETS, ACTIVE_SOCKETS): the workers' rows one after
  the other, with a ``worker`` column at the end;
- per-pool and per-database tables: one row per key; counts and totals added; ages (maxwait)
  and flags (paused, disabled) the greatest; settings (pool_size, pool_mode, host...) taken
  from the first worker that has the row; averages recomputed: rates (per second) added,
  durations (per transaction, query, assignment) weighted by their worker's rate;
- SHOW HOSTS (each worker checks the hosts itself): one row per (database, host, port);
  routed added; the ban's time left, the lag and the age of the last check the greatest (the
  worst any worker sees, NULL only when NULL in every worker); role, state, reason and lsn
  taken from the first worker that has the row; rows in first-seen order (by database, each
  host list in its order);
- SHOW MEM: one row per kind, counts and bytes added;
- tables that are the same in every worker (CONFIG, VERSION, PEERS, HELP, DNS_HOSTS,
  DNS_ZONES) are not gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .tables import (
    AVG_STATS_NAMES,
    AVG_TOTALS_NAMES,
    INT4,
    STATS_NAMES,
    TOTALS_NAMES,
    Table,
    Value,
)

#: The column a worker's rows carry in SHOW CLIENTS/SERVERS/SOCKETS.
WORKER_COLUMN = ("worker", INT4)

Worked = tuple[int, Table]  # (worker index, its table)


@dataclass(frozen=True)
class Keyed:
    """A table merged by key: key columns, and how each other column combines (unnamed
    columns are taken from the first worker that has the row)."""

    key: tuple[str, ...]
    added: frozenset[str] = frozenset()
    #: the numerically greatest value (decimal text too), NULL only when NULL in every worker
    greatest: frozenset[str] = frozenset()
    #: duration column -> the rate column it is an average over (weights it)
    weighted: dict[str, str] = field(default_factory=dict)
    #: a (seconds, microseconds) pair taken together as the greatest
    age: tuple[str, str] | None = None
    #: rows ordered by key (as each worker's are), or in first-seen order
    sort: bool = True


def _averages(prefix: str, names: Sequence[str]) -> tuple[frozenset[str], dict[str, str]]:
    """The rates and weighted durations of an averages block (column names in the order of
    Totals.values(), with prefix)."""
    columns = [prefix + n for n in names]
    times = {columns[5]: columns[1], columns[6]: columns[2], columns[7]: columns[0]}
    return frozenset(c for c in columns if c not in times), times


_STATS_RATES, _STATS_TIMES = _averages("avg_", AVG_STATS_NAMES)
_AVG_RATES, _AVG_TIMES = _averages("", AVG_TOTALS_NAMES)

POOLS = Keyed(
    ("database", "user"),
    added=frozenset(
        {
            "cl_active",
            "cl_waiting",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active",
            "sv_active_cancel",
            "sv_being_canceled",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
        }
    ),
    age=("maxwait", "maxwait_us"),
)
STATS = Keyed(
    ("database",),
    added=frozenset(f"total_{n}" for n in STATS_NAMES) | _STATS_RATES,
    weighted=_STATS_TIMES,
)
STATS_TOTALS = Keyed(("database",), added=frozenset(TOTALS_NAMES))
STATS_AVERAGES = Keyed(("database",), added=_AVG_RATES, weighted=_AVG_TIMES)
DATABASES = Keyed(
    ("name",),
    added=frozenset({"current_connections", "current_client_connections"}),
    greatest=frozenset({"paused", "disabled"}),
)
USERS = Keyed(("name",), added=frozenset({"current_connections", "current_client_connections"}))
#: pools, databases and users exist in each worker that has a client for them: the greatest
#: count is the nearest to the whole pgtarn's; connections are added.
LISTS = Keyed(("list",), greatest=frozenset({"items"}), sort=False)
LIST_ADDED = frozenset(
    {
        "free_clients",
        "used_clients",
        "login_clients",
        "free_servers",
        "used_servers",
        "dns_queries",
        "dns_pending",
    }
)
PREPARED = Keyed(("name",), added=frozenset({"clients", "servers"}))
LISTENERS = Keyed(("database", "user", "channel"), added=frozenset({"clients"}))
#: SHOW MEM: counts and bytes added (size, an average, is the first worker's).
MEM = Keyed(("name",), added=frozenset({"used", "free", "memtotal"}), sort=False)
HOSTS = Keyed(
    ("database", "host", "port"),
    added=frozenset({"routed"}),
    greatest=frozenset({"banned_for", "lag_bytes", "lag_seconds", "last_check"}),
    sort=False,
)


def concatenate(tables: Sequence[Worked]) -> Table:
    """Rows of every worker, with its index in a last ``worker`` column."""
    columns = [*tables[0][1].columns, WORKER_COLUMN]
    rows = [[*row, worker] for worker, table in tables for row in table.rows]
    return Table(columns, rows)


def _magnitude(value: Value) -> float:
    """A cell's number for a comparison: decimal text too (NULL and other text: 0)."""
    if isinstance(value, int):
        return float(value)
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def _number(value: Value) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(value or 0)
    except ValueError:
        return 0


def keyed(rule: Keyed, tables: Sequence[Worked]) -> Table:
    """One row per key, its columns combined as rule says; rows in first-seen order."""
    columns = tables[0][1].columns
    names = [c for c, _ in columns]
    at = {name: i for i, name in enumerate(names)}
    key_at = [at[k] for k in rule.key]
    merged: dict[tuple[Value, ...], list[Value]] = {}
    # per weighted column: key -> (sum of duration * weight, sum of weight)
    weights: dict[tuple[tuple[Value, ...], str], tuple[int, int]] = {}
    for _worker, table in tables:
        for row in table.rows:
            key = tuple(row[i] for i in key_at)
            for duration, rate in rule.weighted.items():
                total, weight = weights.get((key, duration), (0, 0))
                w = _number(row[at[rate]])
                weights[(key, duration)] = (total + _number(row[at[duration]]) * w, weight + w)
            have = merged.get(key)
            if have is None:
                merged[key] = list(row)
                continue
            for name in rule.added:
                i = at[name]
                have[i] = _number(have[i]) + _number(row[i])
            for name in rule.greatest:
                i = at[name]
                if row[i] is not None and (
                    have[i] is None or _magnitude(row[i]) > _magnitude(have[i])
                ):
                    have[i] = row[i]
            if rule.age is not None:
                s, us = at[rule.age[0]], at[rule.age[1]]
                if (_number(row[s]), _number(row[us])) > (_number(have[s]), _number(have[us])):
                    have[s], have[us] = row[s], row[us]
    for (key, duration), (total, weight) in weights.items():
        if weight:
            merged[key][at[duration]] = total // weight
    rows = list(merged.values())
    if rule.sort:
        rows.sort(key=lambda r: tuple(str(r[i]) for i in key_at))
    return Table(list(columns), rows)


def lists(tables: Sequence[Worked]) -> Table:
    """SHOW LISTS: connection lists added, the others the greatest (see LISTS)."""
    table = keyed(LISTS, tables)
    for row in table.rows:
        if row[0] in LIST_ADDED:
            row[1] = sum(_number(r[1]) for _w, t in tables for r in t.rows if r[0] == row[0])
    return table


def totals(tables: Sequence[Worked]) -> Table:
    """SHOW TOTALS (name, value rows): total_* added; avg_* rates added, durations weighted
    by their rate, as the per-database averages."""
    values: list[dict[Value, int]] = [
        {row[0]: _number(row[1]) for row in table.rows} for _w, table in tables
    ]
    weighting = {
        "avg_xact_time": "avg_xact_count",
        "avg_query_time": "avg_query_count",
        "avg_wait_time": "avg_server_assignment_count",
    }
    rows: list[list[Value]] = []
    for row in tables[0][1].rows:
        name = row[0]
        rate = weighting.get(str(name))
        if rate is None:
            rows.append([name, sum(v.get(name, 0) for v in values)])
            continue
        weight = sum(v.get(rate, 0) for v in values)
        total = sum(v.get(name, 0) * v.get(rate, 0) for v in values)
        rows.append([name, total // weight if weight else 0])
    return Table(list(tables[0][1].columns), rows)


def state(tables: Sequence[Worked]) -> Table:
    """SHOW STATE: a key's value when every worker has the same, else each worker's."""
    rows: list[list[Value]] = []
    for i, row in enumerate(tables[0][1].rows):
        seen = [(worker, table.rows[i][1]) for worker, table in tables]
        if len({v for _w, v in seen}) == 1:
            rows.append([row[0], row[1]])
        else:
            rows.append([row[0], ", ".join(f"{v} on worker {w}" for w, v in seen)])
    return Table(list(tables[0][1].columns), rows)


def _by(rule: Keyed) -> Callable[[Sequence[Worked]], Table]:
    return lambda tables: keyed(rule, tables)


#: SHOW <what> -> how the workers' tables make one. Tables not here are not gathered.
MERGED: dict[str, Callable[[Sequence[Worked]], Table]] = {
    "clients": concatenate,
    "servers": concatenate,
    "sockets": concatenate,
    "active_sockets": concatenate,
    "pools": _by(POOLS),
    "stats": _by(STATS),
    "stats_totals": _by(STATS_TOTALS),
    "stats_averages": _by(STATS_AVERAGES),
    "totals": totals,
    "databases": _by(DATABASES),
    "users": _by(USERS),
    "lists": lists,
    "state": state,
    "prepared_statements": _by(PREPARED),
    "listeners": _by(LISTENERS),
    "hosts": _by(HOSTS),
    "mem": _by(MEM),
}


def merge(what: str, tables: Sequence[Worked]) -> Table:
    """The whole pgtarn's SHOW <what> from its workers' tables (at least one)."""
    return MERGED[what](sorted(tables, key=lambda t: t[0]))
