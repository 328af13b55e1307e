"""The Prometheus endpoint of a running pgtarn: parsed with prometheus_client's parser, its
numbers match SHOW POOLS and SHOW STATS_TOTALS taken at the same moment."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support import free_port

from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_for
from .test_admin import Waiter, admin, pool_row, show


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_match_show_pools_and_stats(pgtarn_factory: PgtarnFactory) -> None:
    port = free_port()
    proc = pgtarn_factory(settings={"default_pool_size": 1, "metrics_port": port})
    holder = connect(proc)
    waiter = None
    try:
        holder.execute("select 1")  # in a transaction: the only server is taken
        waiter = Waiter(proc, "select 2")
        waiter.start()
        with admin(proc) as a:
            assert wait_for(lambda: pool_row(a)["cl_waiting"] == 1)
            pool = pool_row(a)
            samples = scrape(port)
            labels = {"database": "app", "user": "app"}
            for column, metric in (
                ("cl_active", "client_active"),
                ("cl_waiting", "client_waiting"),
                ("sv_active", "server_active"),
                ("sv_idle", "server_idle"),
                ("sv_login", "server_login"),
            ):
                got = value(samples, f"pgtarn_pools_{metric}_connections", **labels)
                assert got == pool[column], column
            assert (pool["cl_active"], pool["cl_waiting"], pool["sv_active"]) == (1, 1, 1)
            assert value(samples, "pgtarn_pools_client_maxwait_seconds", **labels) > 0
            holder.commit()
            waiter.join(10)
            assert waiter.result == [(2,)]
            totals = {r["database"]: r for r in show(a, "STATS_TOTALS")}["app"]
            samples = scrape(port)
            assert (
                value(samples, "pgtarn_stats_sql_transactions_pooled_total", database="app")
                == totals["xact_count"]
                == 2
            )
            assert (
                value(samples, "pgtarn_stats_queries_pooled_total", database="app")
                == totals["query_count"]
            )
            assert (
                value(samples, "pgtarn_stats_received_bytes_total", database="app")
                == totals["bytes_received"]
            )
            waited = value(samples, "pgtarn_stats_client_wait_seconds_total", database="app")
            assert abs(waited - float(totals["wait_time"]) / 1e6) < 1e-6
            # the histograms count the same transactions and waits
            assert value(samples, "pgtarn_transaction_duration_seconds_count", **labels) == 2
            assert value(samples, "pgtarn_client_wait_seconds_count", **labels) == 2
            assert value(samples, "pgtarn_client_wait_seconds_bucket", le="+Inf", **labels) == 2
            assert value(samples, "pgtarn_up") == 1
    finally:
        holder.close()
        if waiter is not None:
            waiter.conn.close()


def test_notification_metrics_count_a_delivery(pgtarn_factory: PgtarnFactory) -> None:
    port = free_port()
    proc = pgtarn_factory(settings={"default_pool_size": 1, "metrics_port": port})
    listener = connect(proc, autocommit=True)
    sender = connect(proc, autocommit=True)
    try:
        listener.execute("LISTEN jobs")
        labels = {"database": "app", "user": "app"}
        samples = scrape(port)
        assert value(samples, "pgtarn_listener_connections", **labels) == 1
        assert value(samples, "pgtarn_notifications_delivered_total", **labels) == 0
        sender.execute("NOTIFY jobs, 'hello'")
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in got] == [("jobs", "hello")]
        samples = scrape(port)
        assert value(samples, "pgtarn_notifications_received_total", **labels) == 1
        assert value(samples, "pgtarn_notifications_delivered_total", **labels) == 1
        assert value(samples, "pgtarn_notifications_dropped_total", **labels) == 0
        assert value(samples, "pgtarn_notifications_queued", **labels) == 0
        assert value(samples, "pgtarn_listener_reconnects_total", **labels) == 0
    finally:
        listener.close()
        sender.close()


def test_metrics_are_off_by_default(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    assert "metrics on" not in proc.log_text()
