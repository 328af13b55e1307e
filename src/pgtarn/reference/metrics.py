"""The metrics reference page, from the families the Prometheus collector yields."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from ..admin.metrics import GREATEST, LEAST, PER_WORKER, PgtarnCollector, worker_metrics
from ..config.settings import Config
from ..runtime import Runtime
from .markdown import GENERATED, cell

INTRO = """\
# Metrics reference

{generated}

With `metrics_port` set, pgtarn answers `GET /metrics` on `metrics_listen_addr` (127.0.0.1
unless set) in Prometheus' text format. Every number is read at scrape time from the same
tables the admin console's SHOW commands show; the `database` and `user` labels are a pool's,
as in SHOW POOLS. With `workers` above 1, worker 0 serves the endpoint and reports the whole
pgtarn: each family says how the workers' samples are combined.

A counter's samples carry the suffix `_total`; a histogram's are `_bucket` (with `le`),
`_sum` and `_count`.
"""


@dataclass(frozen=True)
class Family:
    """One metric family as the page lists it."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def _labels(metric: Metric) -> tuple[str, ...]:
    # The family's label names are known before it has samples only as this attribute of
    # prometheus_client's *MetricFamily classes; samples, when there are some, agree.
    names: tuple[str, ...] = tuple(getattr(metric, "_labelnames", ()))
    if not names and metric.samples:
        names = tuple(k for k in metric.samples[0].labels if k != "le")
    return names


def families() -> list[Family]:
    """Every family the endpoint can report, as an empty pgtarn's collector yields them."""
    runtime = Runtime(Config.default(), {})
    metrics: Iterator[Metric] = iter(
        [*PgtarnCollector(runtime).collect(), *worker_metrics(runtime)]
    )
    return [Family(m.name, m.type, _labels(m), m.documentation) for m in metrics]


def exposed(family: Family) -> str:
    """The sample names a scrape shows for a family."""
    if family.type == "counter":
        return f"`{family.name}_total`"
    if family.type == "histogram":
        return ", ".join(f"`{family.name}{s}`" for s in ("_bucket", "_sum", "_count"))
    return f"`{family.name}`"


def merge_rule(name: str) -> str:
    """How the workers' samples of a family are combined (metrics.merge_families)."""
    if name.startswith(PER_WORKER):
        return "only with `workers` above 1: one sample per worker (`worker` label)"
    if name in LEAST:
        return "least"
    if name in GREATEST:
        return "greatest"
    if name == "pgtarn_lists_items":
        return "as SHOW LISTS"
    return "sum"


def render() -> str:
    """The whole page."""
    lines = [
        INTRO.format(generated=GENERATED),
        "| Metric | Type | Labels | Workers | Meaning |",
        "|---|---|---|---|---|",
    ]
    for family in families():
        labels = (
            ", ".join(
                f"`{label}`"
                for label in family.labels
                + (("worker",) if family.name.startswith(PER_WORKER) else ())
            )
            or "none"
        )
        lines.append(
            f"| {exposed(family)} | {family.type} | {labels} | "
            f"{merge_rule(family.name)} | {cell(family.help)} |"
        )
    return "\n".join(lines).rstrip("\n") + "\n"
