"""`pgtarn top`'s reading: the admin console's SHOW tables (psycopg) and, when given, the
Prometheus endpoint's transaction histogram, as one model.Sample."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .model import Row, Sample, buckets_from_metrics

METRICS_TIMEOUT = 2.0


def metrics_url(option: str) -> str:
    """--metrics: a URL as it is, or a port of this host's endpoint."""
    if option.isdigit():
        return f"http://127.0.0.1:{option}/metrics"
    return option


class AdminSource:
    """One connection to an admin console (PgBouncer's or pgtarn's), reopened after a loss."""

    def __init__(self, conninfo: str, metrics: str | None = None) -> None:
        self.conninfo = conninfo
        self.metrics = metrics_url(metrics) if metrics else None
        self._conn: psycopg.Connection[Row] | None = None

    def _connection(self) -> psycopg.Connection[Row]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True, row_factory=dict_row)
        return self._conn

    def _show(self, what: str) -> list[Row]:
        # the admin console speaks the simple query protocol only: no parameters, no prepare
        return self._connection().execute(f"SHOW {what}", prepare=False).fetchall()

    def sample(self) -> Sample:
        """The tables read back to back, stamped with the monotonic time between them."""
        try:
            pools, stats, clients = self._show("POOLS"), self._show("STATS"), self._show("CLIENTS")
        except psycopg.Error:
            self.close()
            raise
        taken = time.monotonic()
        return Sample(taken, pools, stats, clients, self._buckets())

    def _buckets(self) -> Any:
        if self.metrics is None:
            return None
        with urllib.request.urlopen(self.metrics, timeout=METRICS_TIMEOUT) as response:
            return buckets_from_metrics(response.read().decode())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
