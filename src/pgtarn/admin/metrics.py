"""Prometheus endpoint: gauges, counters and histograms built from the SHOW tables when scraped.

With workers = N, worker 0 serves the port: at each scrape it gathers every worker's samples
over the control channel and merges them (:func:`merge_families`) into one report of the whole
pgtarn; the pgtarn_worker_* families carry a ``worker`` label.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .. import __version__
from ..native.buildinfo import BUILD
from ..pool.pool import Pool
from ..pool.stats import Histogram
from ..runtime import Runtime
from .merge import LIST_ADDED
from .tables import (
    Table,
    Value,
    all_servers,
    show_clients,
    show_databases,
    show_hosts,
    show_lists,
    show_pools,
    show_stats_totals,
)

log = logging.getLogger("pgtarn.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_HEAD = 8192
READ_TIMEOUT = 5.0

#: SHOW POOLS column -> gauge (labels database, user).
POOL_GAUGES = (
    ("cl_active", "pools_client_active_connections", "Client connections linked to a server"
     " or idle, per pool"),
    ("cl_waiting", "pools_client_waiting_connections", "Client connections waiting for a"
     " server, per pool"),
    ("sv_active", "pools_server_active_connections", "Server connections linked to a client,"
     " per pool"),
    ("sv_idle", "pools_server_idle_connections", "Server connections idle and ready, per pool"),
    ("sv_used", "pools_server_used_connections", "Server connections idle longer than"
     " server_check_delay, per pool"),
    ("sv_tested", "pools_server_testing_connections", "Server connections running a reset or"
     " check, per pool"),
    ("sv_login", "pools_server_login_connections", "Server connections logging in, per pool"),
)  # fmt: skip

#: SHOW STATS_TOTALS column -> counter (label database), and the factor to its unit.
STATS_COUNTERS = (
    ("server_assignment_count", "stats_server_assignments", 1.0,
     "Times a server was assigned to a client"),
    ("xact_count", "stats_sql_transactions_pooled", 1.0, "SQL transactions pooled"),
    ("query_count", "stats_queries_pooled", 1.0, "SQL queries pooled"),
    ("bytes_received", "stats_received_bytes", 1.0, "Bytes received from clients"),
    ("bytes_sent", "stats_sent_bytes", 1.0, "Bytes sent to clients"),
    ("xact_time", "stats_server_in_transaction_seconds", 1e-6,
     "Time spent in transactions (including idle in transaction)"),
    ("query_time", "stats_queries_duration_seconds", 1e-6, "Time spent running queries"),
    ("wait_time", "stats_client_wait_seconds", 1e-6, "Time clients spent waiting for a server"),
    ("client_parse_count", "stats_client_parses", 1.0, "Prepared statements clients prepared"),
    ("server_parse_count", "stats_server_parses", 1.0, "Prepared statements prepared on servers"),
    ("bind_count", "stats_binds", 1.0, "Executions of prepared statements"),
    ("client_login_count", "stats_client_logins", 1.0, "Client logins"),
)  # fmt: skip

#: SHOW DATABASES column -> gauge (label database).
DATABASE_GAUGES = (
    ("current_connections", "databases_current_connections", "Server connections of the"
     " database"),
    ("pool_size", "databases_pool_size", "Pool size of the database"),
    ("max_connections", "databases_max_connections", "max_db_connections (0: no limit)"),
    ("current_client_connections", "databases_current_client_connections", "Client"
     " connections to the database"),
    ("paused", "databases_paused", "1 if the database is paused"),
    ("disabled", "databases_disabled", "1 if the database is disabled"),
)  # fmt: skip

#: ChannelBoard attribute -> metric (labels database, user): LISTEN/NOTIFY through the
#: pool's listener connection (transaction and statement mode, see pool/channels.py).
BOARD_METRICS = (
    ("received", "notifications_received", True,
     "Notifications the listener connection received, per pool"),
    ("delivered", "notifications_delivered", True,
     "Notifications sent to listening clients (one per client), per pool"),
    ("dropped", "notifications_dropped", True,
     "Notifications dropped with a client that left or was closed at listen_queue_size,"
     " per pool"),
    ("queued", "notifications_queued", False,
     "Notifications waiting in clients' queues for delivery, per pool"),
    ("reconnects", "listener_reconnects", True,
     "Times the listener connection was lost or moved (RECONNECT, RELOAD) after logging in;"
     " each warns the clients listening, per pool"),
    ("open_links", "listener_connections", False,
     "Listener connections open or being opened (counted against max_db_connections and"
     " max_user_connections), per pool"),
)  # fmt: skip

#: SHOW HOSTS column -> gauge (labels database, host, port): read/write split's servers.
HOST_GAUGES = (
    ("lag_bytes", "host_lag_bytes", "Bytes of WAL a replica's replay is behind the primary's"
     " insert position (0 for the primary), at its last check"),
    ("lag_seconds", "host_lag_seconds", "Seconds a replica's replay is behind, at its last"
     " check"),
)  # fmt: skip

#: PoolStats histogram attribute -> histogram (labels database, user).
POOL_HISTOGRAMS = (
    ("xact_times", "transaction_duration_seconds", "Duration of transactions, per pool"),
    ("query_times", "query_duration_seconds", "Duration of queries, per pool"),
    ("wait_times", "client_wait_seconds", "Time clients waited for a server, per pool"),
)


def _number(value: Value) -> float:
    """A table cell as a sample value: NULL and non-numeric text count as 0."""
    if value is None:
        return 0.0
    if isinstance(value, int):
        return float(value)
    try:
        return float(value)
    except ValueError:
        return 0.0


def _label(value: Value) -> str:
    return "" if value is None else str(value)


def _pools_by_label(runtime: Runtime) -> list[tuple[str, str, list[Pool[Any]]]]:
    """The pools of each (database, user): a split database's replicas' pools share their
    home pool's labels, so their numbers are reported together."""
    by_key: dict[tuple[str, str], list[Pool[Any]]] = {}
    for pool in runtime.registry:
        by_key.setdefault((pool.database, pool.user), []).append(pool)
    return [(database, user, pools) for (database, user), pools in sorted(by_key.items())]


def _histogram_buckets(hist: Histogram) -> list[tuple[str, float]]:
    return [
        ("+Inf" if bound == float("inf") else repr(float(bound)), float(count))
        for bound, count in hist.cumulative()
    ]


class PgtarnCollector:
    """Reads the SHOW tables and pool histograms of a runtime whenever Prometheus scrapes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self.runtime
        yield from self._pools(show_pools(runtime))
        yield from self._stats(show_stats_totals(runtime))
        yield from self._databases(show_databases(runtime))
        yield from self._lists(show_lists(runtime))
        yield from self._histograms()
        yield from self._pins(show_clients(runtime))
        yield from self._notifications()
        yield from self._hosts(show_hosts(runtime))

        up = GaugeMetricFamily("pgtarn_up", "1 while pgtarn answers")
        up.add_metric([], 1.0)
        yield up
        version = GaugeMetricFamily(
            "pgtarn_version_info", "pgtarn version and build", labels=["version", "build"]
        )
        version.add_metric([__version__, BUILD], 1.0)
        yield version
        yield GaugeMetricFamily(
            "pgtarn_config_max_client_connections",
            "max_client_conn setting",
            value=float(runtime.config.max_client_conn),
        )
        cache = runtime.statement_cache
        yield CounterMetricFamily(
            "pgtarn_prepared_statement_renewals",
            "Shared prepared statements given a new server-side name to be prepared afresh"
            " (schema changes, stale plans, RENEW_STATEMENTS)",
            value=float(cache.renewals),
        )
        yield CounterMetricFamily(
            "pgtarn_prepared_statement_generations",
            "Schema changes seen (DDL through pgtarn, RENEW_STATEMENTS): each starts a new"
            " generation of shared prepared statements",
            value=float(cache.generation),
        )

    def _pools(self, table: Table) -> Iterator[Metric]:
        databases = [_label(v) for v in table.column("database")]
        users = [_label(v) for v in table.column("user")]
        for column, name, doc in POOL_GAUGES:
            gauge = GaugeMetricFamily(f"pgtarn_{name}", doc, labels=["database", "user"])
            for database, user, value in zip(databases, users, table.column(column), strict=True):
                gauge.add_metric([database, user], _number(value))
            yield gauge
        gauge = GaugeMetricFamily(
            "pgtarn_pools_client_maxwait_seconds",
            "Age of the oldest waiting client, per pool",
            labels=["database", "user"],
        )
        for database, user, seconds, micros in zip(
            databases, users, table.column("maxwait"), table.column("maxwait_us"), strict=True
        ):
            gauge.add_metric([database, user], _number(seconds) + _number(micros) / 1e6)
        yield gauge

    def _stats(self, table: Table) -> Iterator[Metric]:
        databases = [_label(v) for v in table.column("database")]
        for column, name, factor, doc in STATS_COUNTERS:
            counter = CounterMetricFamily(f"pgtarn_{name}", doc, labels=["database"])
            for database, value in zip(databases, table.column(column), strict=True):
                counter.add_metric([database], _number(value) * factor)
            yield counter

    def _databases(self, table: Table) -> Iterator[Metric]:
        names = [_label(v) for v in table.column("name")]
        for column, name, doc in DATABASE_GAUGES:
            gauge = GaugeMetricFamily(f"pgtarn_{name}", doc, labels=["database"])
            for database, value in zip(names, table.column(column), strict=True):
                gauge.add_metric([database], _number(value))
            yield gauge

    def _lists(self, table: Table) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "pgtarn_lists_items", "Items in each list (SHOW LISTS)", labels=["list"]
        )
        for name, items in zip(table.column("list"), table.column("items"), strict=True):
            gauge.add_metric([_label(name)], _number(items))
        yield gauge

    def _histograms(self) -> Iterator[Metric]:
        groups = _pools_by_label(self.runtime)
        for attribute, name, doc in POOL_HISTOGRAMS:
            family = HistogramMetricFamily(f"pgtarn_{name}", doc, labels=["database", "user"])
            for database, user, pools in groups:
                hist = Histogram()
                for pool in pools:
                    one: Histogram = getattr(pool.stats, attribute)
                    hist.counts = [a + b for a, b in zip(hist.counts, one.counts, strict=True)]
                    hist.total += one.total
                family.add_metric([database, user], _histogram_buckets(hist), sum_value=hist.total)
            yield family

    def _pins(self, clients: Table) -> Iterator[Metric]:
        """Clients that keep their server for their session state (see client/tracking.py)."""
        pinned: dict[tuple[str, str], int] = {}
        for database, user, reasons in zip(
            clients.column("database"),
            clients.column("user"),
            clients.column("pinned"),
            strict=True,
        ):
            if reasons:
                key = (_label(database), _label(user))
                pinned[key] = pinned.get(key, 0) + 1
        gauge = GaugeMetricFamily(
            "pgtarn_clients_pinned",
            "Clients pinned to their server by session state, per pool",
            labels=["database", "user"],
        )
        counter = CounterMetricFamily(
            "pgtarn_client_pins",
            "Pins of a client to its server begun, per pool and reason",
            labels=["database", "user", "reason"],
        )
        for database, user, pools in _pools_by_label(self.runtime):
            gauge.add_metric([database, user], float(pinned.get((database, user), 0)))
            pins: dict[str, int] = {}
            for pool in pools:
                for reason, count in pool.stats.pins.items():
                    pins[reason] = pins.get(reason, 0) + count
            for reason, count in sorted(pins.items()):
                counter.add_metric([database, user, reason], float(count))
        yield gauge
        yield counter

    def _notifications(self) -> Iterator[Metric]:
        """LISTEN/NOTIFY counters of each pool's ChannelBoard (zeros while nobody listens)."""
        pools = sorted(self.runtime.registry, key=lambda p: (p.database, p.user))
        for attribute, name, is_counter, doc in BOARD_METRICS:
            family: CounterMetricFamily | GaugeMetricFamily = (
                CounterMetricFamily(f"pgtarn_{name}", doc, labels=["database", "user"])
                if is_counter
                else GaugeMetricFamily(f"pgtarn_{name}", doc, labels=["database", "user"])
            )
            for pool in pools:
                board = pool.board
                if board is not None:
                    family.add_metric([pool.database, pool.user], float(getattr(board, attribute)))
            yield family

    def _hosts(self, table: Table) -> Iterator[Metric]:
        """read/write split: each host as its health checks see it, and the transactions
        routed to it (no samples without a split database)."""
        hosts = [
            [_label(d), _label(h), _label(p)]
            for d, h, p in zip(
                table.column("database"), table.column("host"), table.column("port"), strict=True
            )
        ]
        up = GaugeMetricFamily(
            "pgtarn_host_up",
            "1 if the host's last check passed (0: banned or not checked yet), with its role",
            labels=["database", "host", "port", "role"],
        )
        for labels, role, state in zip(
            hosts, table.column("role"), table.column("state"), strict=True
        ):
            up.add_metric([*labels, _label(role)], 1.0 if state == "up" else 0.0)
        yield up
        for column, name, doc in HOST_GAUGES:
            gauge = GaugeMetricFamily(f"pgtarn_{name}", doc, labels=["database", "host", "port"])
            for labels, value in zip(hosts, table.column(column), strict=True):
                gauge.add_metric(labels, _number(value))
            yield gauge
        routed = CounterMetricFamily(
            "pgtarn_host_transactions_routed",
            "Transactions routed to the host (reads and writes)",
            labels=["database", "host", "port"],
        )
        for labels, value in zip(hosts, table.column("routed"), strict=True):
            routed.add_metric(labels, _number(value))
        yield routed


def render(runtime: Runtime) -> bytes:
    """The metrics of a runtime in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PgtarnCollector(runtime))
    return generate_latest(registry)


# --- workers = N ---------------------------------------------------------------------------------

SAMPLES_KIND = "metrics_samples"
#: Families whose samples are settings or ages: the workers' greatest, not their sum.
GREATEST = frozenset(
    {
        "pgtarn_up",
        "pgtarn_version_info",
        "pgtarn_config_max_client_connections",
        "pgtarn_pools_client_maxwait_seconds",
        "pgtarn_databases_pool_size",
        "pgtarn_databases_max_connections",
        "pgtarn_databases_paused",
        "pgtarn_databases_disabled",
        "pgtarn_host_lag_bytes",
        "pgtarn_host_lag_seconds",
    }
)
#: Families whose samples are the workers' least: a host is up only when every worker's health
#: checks find it up (each worker checks the hosts itself).
LEAST = frozenset({"pgtarn_host_up"})
#: Families of one worker each, labelled with its index (the others are summed).
PER_WORKER = "pgtarn_worker_"

Family = list[Any]  # [name, type, documentation, [[sample name, labels, value], ...]]


def worker_metrics(runtime: Runtime) -> Iterator[Metric]:
    """This worker's own numbers: CPU time and connections."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    yield CounterMetricFamily(
        f"{PER_WORKER}cpu_seconds",
        "CPU time of the worker process (user and system)",
        value=usage.ru_utime + usage.ru_stime,
    )
    yield GaugeMetricFamily(
        f"{PER_WORKER}client_connections",
        "Client connections the worker holds",
        value=float(len(runtime.clients)),
    )
    yield GaugeMetricFamily(
        f"{PER_WORKER}server_connections",
        "Server connections the worker holds",
        value=float(len(all_servers(runtime))),
    )


def families(runtime: Runtime) -> list[Family]:
    """This worker's metrics as plain data, for the control channel."""
    metrics = [*PgtarnCollector(runtime).collect(), *worker_metrics(runtime)]
    return [
        [m.name, m.type, m.documentation, [[s.name, dict(s.labels), s.value] for s in m.samples]]
        for m in metrics
    ]


def merge_families(replies: Iterable[tuple[int, list[Family]]]) -> list[Metric]:
    """Every worker's families as one report: per-worker families labelled, settings, ages and
    lags the greatest, host_up the least, SHOW LISTS' list sizes as SHOW LISTS merges them, the
    rest summed."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for worker, reply in sorted(replies, key=lambda r: r[0]):
        for name, kind, doc, samples in reply:
            if name not in merged:
                merged[name] = Metric(name, doc, kind)
                values[name] = {}
            into = values[name]
            for sample_name, labels, number in samples:
                if name.startswith(PER_WORKER):
                    labels = {**labels, "worker": str(worker)}
                key = (sample_name, tuple(sorted(labels.items())))
                have = into.get(key)
                if have is None:
                    into[key] = float(number)
                elif name in LEAST:
                    into[key] = min(have, float(number))
                elif name in GREATEST or (
                    name == "pgtarn_lists_items" and labels.get("list") not in LIST_ADDED
                ):
                    into[key] = max(have, float(number))
                else:
                    into[key] = have + float(number)
    for name, metric in merged.items():
        for (sample_name, labels), number in values[name].items():
            metric.add_sample(sample_name, dict(labels), number)
    return list(merged.values())


class MergedCollector(Collector):
    """Yields metrics already made (the merged report of the workers)."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


async def render_all(runtime: Runtime) -> bytes:
    """The whole pgtarn's metrics: this runtime's, or with workers every worker's merged (a
    worker that does not answer in time is left out)."""
    coordinator = runtime.coordinator
    if coordinator is None:
        return render(runtime)
    replies = await coordinator.gather({"kind": SAMPLES_KIND}, READ_TIMEOUT)
    found = [
        (int(r["worker"]), r["families"])
        for r in replies
        if isinstance(r.get("worker"), int) and isinstance(r.get("families"), list)
    ]
    if not found:
        found = [(coordinator.index, families(runtime))]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedCollector(merge_families(found)))
    return generate_latest(registry)


# --- HTTP ----------------------------------------------------------------------------------------

_REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    500: "Internal Server Error",
}  # fmt: skip


def _response(
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    head_only: bool = False,
    extra: str = "",
) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request head up to its blank line; None when it is longer than MAX_HEAD or cut."""
    buffer = b""
    while b"\r\n\r\n" not in buffer and b"\n\n" not in buffer:
        if len(buffer) >= MAX_HEAD:
            return None
        chunk = await reader.read(MAX_HEAD - len(buffer))
        if not chunk:
            return None
        buffer += chunk
    return buffer


async def _answer(runtime: Runtime, head: bytes | None) -> bytes:
    """The whole HTTP response to a request head."""
    if head is None:
        return _response(400, b"bad request\n")
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
        return _response(400, b"bad request\n")
    method, target = parts[0], parts[1]
    path = target.split(b"?", 1)[0]
    if path not in (b"/", b"/metrics"):
        return _response(404, b"not found\n")
    if method not in (b"GET", b"HEAD"):
        return _response(405, b"method not allowed\n", extra="Allow: GET, HEAD\r\n")
    try:
        body = await render_all(runtime)
    except Exception:
        log.exception("metrics: rendering failed")
        return _response(500, b"internal error\n")
    return _response(200, body, CONTENT_TYPE, head_only=method == b"HEAD")


async def _handle(
    runtime: Runtime, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        try:
            head = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT)
        except TimeoutError:
            log.debug("metrics: request head not received within %.0f s", READ_TIMEOUT)
            return
        writer.write(await _answer(runtime, head))
        await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
    except (ConnectionError, TimeoutError) as exc:
        log.debug("metrics: connection lost: %s", exc)
    except Exception:
        log.exception("metrics: request failed")
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def serve_metrics(runtime: Runtime, host: str, port: int) -> asyncio.AbstractServer | None:
    """Listen for Prometheus scrapes (GET /metrics) on host:port; close the returned server.

    In a worker of workers = N: every worker answers the gathers of its samples; worker 0
    alone listens (None for the others)."""
    coordinator = runtime.coordinator
    if coordinator is not None:
        coordinator.handle(SAMPLES_KIND, lambda _message, _fds: {"families": families(runtime)})
        if coordinator.index != 0:
            return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _handle(runtime, reader, writer)

    return await asyncio.start_server(handle, host, port)
