"""Metrics of a split database: per host gauges and routed transactions, a replica's pool under
its home pool's labels, and how the workers' host samples merge."""

from __future__ import annotations

from collections import Counter
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pgtarn.admin.metrics import merge_families, render
from pgtarn.config.settings import Config, DatabaseEntry
from pgtarn.runtime import Runtime

SPLIT = DatabaseEntry(
    name="app",
    host="a",
    hosts=("a", "b", "c"),
    port=5432,
    ports=(5432, 5433, 5434),
    read_write_split="explicit",
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def split_runtime() -> tuple[Runtime, Any]:
    runtime = Runtime(Config.default(), {})
    home = runtime.registry.get_pool(SPLIT, "u")
    assert home.split is not None
    hosts = home.split.hosts
    now = hosts.clock()
    hosts.check_passed(0, False, 5000, 0.0, now)
    hosts.check_passed(1, True, 4000, 2.5, now)
    hosts.check_failed(2, "connection refused")
    hosts.hosts[0].routed = 11
    hosts.hosts[1].routed = 4
    return runtime, home


def scrape(runtime: Runtime) -> tuple[Samples, Counter[tuple[str, frozenset[tuple[str, str]]]]]:
    samples: Samples = {}
    seen: Counter[tuple[str, frozenset[tuple[str, str]]]] = Counter()
    for family in text_string_to_metric_families(render(runtime).decode()):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            samples[key] = sample.value
            seen[key] += 1
    return samples, seen


def host(name: str, port: int, **more: str) -> frozenset[tuple[str, str]]:
    return frozenset({"database": "app", "host": name, "port": str(port), **more}.items())


def test_host_gauges_and_routed_counter() -> None:
    runtime, _ = split_runtime()
    samples, _ = scrape(runtime)
    assert samples[("pgtarn_host_up", host("a", 5432, role="primary"))] == 1
    assert samples[("pgtarn_host_up", host("b", 5433, role="replica"))] == 1
    assert samples[("pgtarn_host_up", host("c", 5434, role="unknown"))] == 0
    assert samples[("pgtarn_host_lag_bytes", host("b", 5433))] == 1000
    assert samples[("pgtarn_host_lag_seconds", host("b", 5433))] == 2.5
    assert samples[("pgtarn_host_lag_bytes", host("a", 5432))] == 0
    assert samples[("pgtarn_host_transactions_routed_total", host("a", 5432))] == 11
    assert samples[("pgtarn_host_transactions_routed_total", host("b", 5433))] == 4
    assert samples[("pgtarn_host_transactions_routed_total", host("c", 5434))] == 0


def test_no_host_samples_without_split() -> None:
    runtime = Runtime(Config.default(), {})
    runtime.registry.get_pool(DatabaseEntry(name="plain"), "u")
    samples, _ = scrape(runtime)
    assert not [key for key in samples if key[0].startswith("pgtarn_host_")]


def test_a_replica_pool_is_counted_under_its_home_pools_labels_once() -> None:
    runtime, home = split_runtime()
    replica_pool = home.split.make(1)
    home.split.replicas[1] = replica_pool
    home.stats.wait.observe(0.0)
    replica_pool.stats.wait.observe(0.0)
    replica_pool.stats.wait.observe(0.2)
    replica_pool.stats.note_pin("advisory lock")

    samples, seen = scrape(runtime)

    assert [key for key, count in seen.items() if count > 1] == []
    pool = frozenset({"database": "app", "user": "u"}.items())
    assert samples[("pgtarn_client_wait_seconds_count", pool)] == 3
    assert samples[("pgtarn_client_wait_seconds_sum", pool)] == 0.2
    assert samples[("pgtarn_clients_pinned", pool)] == 0
    assert (
        samples[
            (
                "pgtarn_client_pins_total",
                frozenset({"database": "app", "user": "u", "reason": "advisory lock"}.items()),
            )
        ]
        == 1
    )


def test_workers_host_samples_merge_up_only_when_every_worker_sees_it_worst_lag_routed_added() -> (
    None
):
    def reply(up: float, lag: float, routed: float) -> list[list[Any]]:
        labels = {"database": "app", "host": "b", "port": "5433"}
        return [
            [
                "pgtarn_host_up",
                "gauge",
                "",
                [["pgtarn_host_up", {**labels, "role": "replica"}, up]],
            ],
            ["pgtarn_host_lag_bytes", "gauge", "", [["pgtarn_host_lag_bytes", labels, lag]]],
            [
                "pgtarn_host_lag_seconds",
                "gauge",
                "",
                [["pgtarn_host_lag_seconds", labels, lag / 100]],
            ],
            [
                "pgtarn_host_transactions_routed",
                "counter",
                "",
                [["pgtarn_host_transactions_routed_total", labels, routed]],
            ],
        ]

    merged = merge_families([(0, reply(1, 300, 5)), (1, reply(0, 700, 6))])
    samples = {s.name: s.value for m in merged for s in m.samples}
    assert samples == {
        "pgtarn_host_up": 0,
        "pgtarn_host_lag_bytes": 700,
        "pgtarn_host_lag_seconds": 7,
        "pgtarn_host_transactions_routed_total": 11,
    }
