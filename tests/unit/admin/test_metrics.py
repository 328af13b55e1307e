"""pgtarn.admin.metrics: values exposed for a runtime with fake servers; the HTTP endpoint."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgtarn import __version__
from pgtarn.admin import metrics
from pgtarn.admin.metrics import families, merge_families, render, serve_metrics
from pgtarn.config.settings import Config, DatabaseEntry
from pgtarn.native.buildinfo import BUILD
from pgtarn.pool.pool import Pool, PooledServer, Waiter
from pgtarn.runtime import Runtime


class FakeServer(PooledServer):
    """Just what the SHOW tables read of a server connection."""

    _ids = iter(range(1, 1_000_000))

    def __init__(self, pool: Pool[Any], last_used: float, client: object | None = None) -> None:
        self.id = next(self._ids)
        self.pool = pool
        self.connstr = pool.connstr
        self.created_at = last_used
        self.last_used = last_used
        self.close_needed = False
        self.client = client
        self.closed: str | None = None
        self.replication = ""

    def close(self, reason: str, wait: bool = False) -> None:
        self.closed = reason

    def start_check(self) -> None:
        pass


class FakeWaiter(Waiter[FakeServer]):
    pass


def make_runtime() -> tuple[Runtime, Any]:
    runtime = Runtime(Config.default(), {})
    pool = runtime.registry.get_pool(DatabaseEntry(name="db1"), "u")
    now = time.monotonic()
    pool.idle.append(FakeServer(pool, now))
    pool.idle.append(FakeServer(pool, now))
    pool.idle.append(FakeServer(pool, now - 1000.0))  # past server_check_delay: "used"
    pool.active.add(FakeServer(pool, now, client=object()))
    pool.tested.add(FakeServer(pool, now))
    pool.login.add(FakeServer(pool, now))
    pool.stats.query.observe(0.002)
    pool.stats.xact.observe(0.003)
    pool.stats.wait.observe(0.0)
    pool.stats.wait.observe(0.5)
    pool.stats.received += 100
    pool.stats.sent += 250
    pool.stats.client_logins += 2
    pool.prepared_counters.client_parses = 3
    pool.prepared_counters.server_parses = 2
    pool.prepared_counters.binds = 7
    return runtime, pool


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def samples() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    runtime, _ = make_runtime()
    return parse(render(runtime).decode())


def test_pool_gauges(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> None:
    pool = {"database": "db1", "user": "u"}
    assert value(samples, "pgtarn_pools_server_idle_connections", **pool) == 2
    assert value(samples, "pgtarn_pools_server_used_connections", **pool) == 1
    assert value(samples, "pgtarn_pools_server_active_connections", **pool) == 1
    assert value(samples, "pgtarn_pools_server_testing_connections", **pool) == 1
    assert value(samples, "pgtarn_pools_server_login_connections", **pool) == 1
    assert value(samples, "pgtarn_pools_client_active_connections", **pool) == 0
    assert value(samples, "pgtarn_pools_client_waiting_connections", **pool) == 0
    assert value(samples, "pgtarn_pools_client_maxwait_seconds", **pool) == 0
    admin = {"database": "pgbouncer", "user": "pgbouncer"}
    assert value(samples, "pgtarn_pools_server_idle_connections", **admin) == 0


def test_maxwait_seconds_and_microseconds() -> None:
    runtime, pool = make_runtime()
    waiter = FakeWaiter()
    pool.waiting.append(waiter, time.monotonic() - 2.5)
    got = value(
        parse(render(runtime).decode()),
        "pgtarn_pools_client_maxwait_seconds",
        database="db1",
        user="u",
    )
    assert 2.5 <= got < 3.5
    assert got != int(got)  # the microseconds are added


def test_stats_counters(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> None:
    expected = {
        "pgtarn_stats_server_assignments_total": 2,
        "pgtarn_stats_sql_transactions_pooled_total": 1,
        "pgtarn_stats_queries_pooled_total": 1,
        "pgtarn_stats_received_bytes_total": 100,
        "pgtarn_stats_sent_bytes_total": 250,
        "pgtarn_stats_server_in_transaction_seconds_total": 0.003,
        "pgtarn_stats_queries_duration_seconds_total": 0.002,
        "pgtarn_stats_client_wait_seconds_total": 0.5,
        "pgtarn_stats_client_parses_total": 3,
        "pgtarn_stats_server_parses_total": 2,
        "pgtarn_stats_binds_total": 7,
        "pgtarn_stats_client_logins_total": 2,
    }
    for name, want in expected.items():
        assert value(samples, name, database="db1") == pytest.approx(want), name
        assert value(samples, name, database="pgbouncer") == 0, name


def test_database_gauges() -> None:
    runtime, _ = make_runtime()
    runtime.registry.disabled.add("db1")
    samples = parse(render(runtime).decode())
    assert value(samples, "pgtarn_databases_current_connections", database="db1") == 6
    assert value(samples, "pgtarn_databases_pool_size", database="db1") == 20
    assert value(samples, "pgtarn_databases_max_connections", database="db1") == 0
    assert value(samples, "pgtarn_databases_current_client_connections", database="db1") == 0
    assert value(samples, "pgtarn_databases_paused", database="db1") == 0
    assert value(samples, "pgtarn_databases_disabled", database="db1") == 1
    assert value(samples, "pgtarn_databases_pool_size", database="pgbouncer") == 2


def test_lists_and_process_gauges(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float],
) -> None:
    assert value(samples, "pgtarn_lists_items", list="pools") == 1
    assert value(samples, "pgtarn_lists_items", list="used_servers") == 6
    assert value(samples, "pgtarn_lists_items", list="databases") == 2
    assert value(samples, "pgtarn_lists_items", list="dns_names") == 0
    assert value(samples, "pgtarn_up") == 1
    assert value(samples, "pgtarn_version_info", version=__version__, build=BUILD) == 1
    assert value(samples, "pgtarn_config_max_client_connections") == 100


def test_histograms(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> None:
    pool = {"database": "db1", "user": "u"}
    query = "pgtarn_query_duration_seconds"
    assert value(samples, f"{query}_bucket", le="0.001", **pool) == 0
    assert value(samples, f"{query}_bucket", le="0.0025", **pool) == 1
    assert value(samples, f"{query}_bucket", le="+Inf", **pool) == 1
    assert value(samples, f"{query}_count", **pool) == 1
    assert value(samples, f"{query}_sum", **pool) == pytest.approx(0.002)
    xact = "pgtarn_transaction_duration_seconds"
    assert value(samples, f"{xact}_bucket", le="0.0025", **pool) == 0
    assert value(samples, f"{xact}_bucket", le="0.005", **pool) == 1
    assert value(samples, f"{xact}_sum", **pool) == pytest.approx(0.003)
    wait = "pgtarn_client_wait_seconds"
    assert value(samples, f"{wait}_bucket", le="0.0001", **pool) == 1  # the 0.0 wait
    assert value(samples, f"{wait}_bucket", le="0.5", **pool) == 2  # a bound is inclusive
    assert value(samples, f"{wait}_count", **pool) == 2
    assert value(samples, f"{wait}_sum", **pool) == pytest.approx(0.5)


class FakeLink:
    """A listener connection that connects nowhere (the board's ListenerLink)."""

    def sync(self) -> None:
        pass

    def tick(self, now: float) -> None:
        pass

    def hold(self, held: bool) -> None:
        pass

    def restart(self, reason: str) -> None:
        pass

    def close(self, reason: str) -> None:
        pass


class FakeSubscriber:
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def notify(self, message: bytes) -> None:
        self.got.append(message)

    def listener_confirmed(self, warning: str) -> None:
        pass

    def listener_lost(self) -> None:
        pass

    def release_notifications(self) -> None:
        pass


def test_notification_metrics_per_pool() -> None:
    runtime, _ = make_runtime()
    runtime.registry.open_listener = lambda _pool, _db, _board: FakeLink()
    listening = runtime.registry.get_pool(DatabaseEntry(name="db2"), "u")
    board = listening.board
    assert board is not None
    board.update(FakeSubscriber(), frozenset(), frozenset({"ch"}), time.monotonic())
    board.notification("ch", b"A")
    board.notification("other", b"A")
    board.delivered, board.dropped, board.queued = 5, 3, 2
    board.connection_lost()

    samples = parse(render(runtime).decode())

    labels = {"database": "db2", "user": "u"}
    assert value(samples, "pgtarn_notifications_received_total", **labels) == 2
    assert value(samples, "pgtarn_notifications_delivered_total", **labels) == 5
    assert value(samples, "pgtarn_notifications_dropped_total", **labels) == 3
    assert value(samples, "pgtarn_notifications_queued", **labels) == 2
    assert value(samples, "pgtarn_listener_reconnects_total", **labels) == 1
    assert value(samples, "pgtarn_listener_connections", **labels) == 1
    # a pool nobody listens in: zeros, and no listener connection
    quiet = {"database": "db1", "user": "u"}
    assert value(samples, "pgtarn_notifications_delivered_total", **quiet) == 0
    assert value(samples, "pgtarn_listener_connections", **quiet) == 0


def test_notification_metrics_have_help_and_type() -> None:
    runtime, _ = make_runtime()
    text = render(runtime).decode()
    for name, kind in (
        ("pgtarn_notifications_delivered_total", "counter"),
        ("pgtarn_notifications_dropped_total", "counter"),
        ("pgtarn_notifications_received_total", "counter"),
        ("pgtarn_notifications_queued", "gauge"),
        ("pgtarn_listener_reconnects_total", "counter"),
        ("pgtarn_listener_connections", "gauge"),
    ):
        assert f"# TYPE {name} {kind}\n" in text, name
        assert f"# HELP {name} " in text, name


def test_empty_runtime_renders() -> None:
    samples = parse(render(Runtime(Config.default(), {})).decode())
    assert value(samples, "pgtarn_up") == 1
    assert value(samples, "pgtarn_stats_queries_pooled_total", database="pgbouncer") == 0


# --- HTTP ----------------------------------------------------------------------------------------


async def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        writer.write_eof()  # nothing more to send; the server answers what it has
        data = await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()
        await writer.wait_closed()
    if not data:
        return 0, {}, b""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    assert status_line.startswith("HTTP/1.1 ")
    headers = {}
    for line in header_lines:
        key, _, val = line.partition(":")
        headers[key.strip().lower()] = val.strip()
    return int(status_line.split()[1]), headers, body


async def _serve(runtime: Runtime) -> asyncio.Server:
    """serve_metrics on a free port (a single process: it listens)."""
    server = await serve_metrics(runtime, "127.0.0.1", 0)
    assert isinstance(server, asyncio.Server)
    return server


async def _with_server(requests: list[bytes]) -> list[tuple[int, dict[str, str], bytes]]:
    runtime, _ = make_runtime()
    server = await _serve(runtime)
    try:
        port = server.sockets[0].getsockname()[1]
        return [await _exchange(port, request) for request in requests]
    finally:
        server.close()
        await server.wait_closed()


def test_http_metrics() -> None:
    (status, headers, body), (root_status, _, root_body) = asyncio.run(_with_server([
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET /?x=1 HTTP/1.0\r\n\r\n",
    ]))  # fmt: skip
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["content-length"] == str(len(body))
    assert headers["connection"] == "close"
    samples = parse(body.decode())
    assert value(samples, "pgtarn_stats_queries_pooled_total", database="db1") == 1
    assert root_status == 200
    assert b"pgtarn_up 1.0" in root_body


def test_http_errors() -> None:
    results = asyncio.run(_with_server([
        b"GET /nope HTTP/1.1\r\n\r\n",
        b"nonsense\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X-Long: " + b"a" * 9000 + b"\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n",  # cut short: EOF before the blank line
    ]))  # fmt: skip
    statuses = [status for status, _, _ in results]
    assert statuses == [404, 400, 400, 405, 400]
    assert results[0][1]["content-length"] == str(len(results[0][2]))


def test_http_head_request() -> None:
    [(status, headers, body)] = asyncio.run(_with_server([b"HEAD /metrics HTTP/1.1\r\n\r\n"]))
    assert status == 200
    assert int(headers["content-length"]) > 0
    assert body == b""


def test_http_read_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "READ_TIMEOUT", 0.1)

    async def idle_client() -> bytes:
        runtime, _ = make_runtime()
        server = await _serve(runtime)
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\n")  # never finishes the head
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 5.0)
            writer.close()
            await writer.wait_closed()
            return data
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(idle_client()) == b""  # closed without an answer


def test_workers_samples_merge_summed_greatest_or_per_worker() -> None:
    def family(name: str, kind: str, samples: list[list[Any]]) -> list[Any]:
        return [name, kind, "doc", samples]

    def reply(
        active: float, pool_size: float, cpu: float, pools: float, used: float
    ) -> list[list[Any]]:
        return [
            family(
                "pgtarn_pools_client_active_connections",
                "gauge",
                [
                    [
                        "pgtarn_pools_client_active_connections",
                        {"database": "app", "user": "app"},
                        active,
                    ]
                ],
            ),
            family(
                "pgtarn_databases_pool_size",
                "gauge",
                [["pgtarn_databases_pool_size", {"database": "app"}, pool_size]],
            ),
            family(
                "pgtarn_worker_cpu_seconds",
                "counter",
                [["pgtarn_worker_cpu_seconds_total", {}, cpu]],
            ),
            family(
                "pgtarn_lists_items",
                "gauge",
                [
                    ["pgtarn_lists_items", {"list": "pools"}, pools],
                    ["pgtarn_lists_items", {"list": "used_clients"}, used],
                ],
            ),
        ]

    merged = merge_families([(1, reply(4, 20, 2.5, 1, 4)), (0, reply(3, 20, 1.5, 2, 3))])
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in merged for s in m.samples
    }
    assert samples == {
        ("pgtarn_pools_client_active_connections", (("database", "app"), ("user", "app"))): 7,
        ("pgtarn_databases_pool_size", (("database", "app"),)): 20,
        ("pgtarn_worker_cpu_seconds_total", (("worker", "0"),)): 1.5,
        ("pgtarn_worker_cpu_seconds_total", (("worker", "1"),)): 2.5,
        ("pgtarn_lists_items", (("list", "pools"),)): 2,
        ("pgtarn_lists_items", (("list", "used_clients"),)): 7,
    }


def test_a_workers_families_carry_its_cpu_and_connections() -> None:
    names = [f[0] for f in families(Runtime(Config.default(), {}))]
    assert {
        "pgtarn_worker_cpu_seconds",
        "pgtarn_worker_client_connections",
        "pgtarn_worker_server_connections",
        "pgtarn_pools_client_active_connections",
    } <= set(names)
