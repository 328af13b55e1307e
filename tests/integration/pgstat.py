"""Watch PostgreSQL's own view of the pooler: backends per user and database."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from tests.support import SUPERUSER, TempCluster


def superuser_connect(cluster: TempCluster) -> psycopg.Connection[Any]:
    """A direct superuser connection over the cluster's unix socket (trust)."""
    return psycopg.connect(
        host=cluster.socket_dir,
        port=cluster.port,
        user=SUPERUSER,
        dbname="postgres",
        autocommit=True,
    )


def backend_pids(
    conn: psycopg.Connection[Any], users: tuple[str, ...] = ("app",), dbname: str | None = "app"
) -> set[int]:
    """Pids of client backends of these users (and database), other than conn's own."""
    rows = conn.execute(
        "select pid from pg_stat_activity where backend_type = 'client backend'"
        " and pid <> pg_backend_pid() and usename = any(%s)"
        " and (%s::text is null or datname = %s)",
        (list(users), dbname, dbname),
    ).fetchall()
    return {row[0] for row in rows}


def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll condition until true; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class PeakBackends:
    """Samples the number of backends in a thread; .peak is the most seen at once."""

    def __init__(self, cluster: TempCluster, users: tuple[str, ...], dbname: str | None) -> None:
        self.conn = superuser_connect(cluster)
        self.users = users
        self.dbname = dbname
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(backend_pids(self.conn, self.users, self.dbname)))
            self.samples += 1
            time.sleep(0.005)

    def __enter__(self) -> PeakBackends:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()


def wait_quiet(cluster: TempCluster, users: tuple[str, ...], dbname: str | None) -> None:
    """No backend of users is left from an earlier test (it would count in a PeakBackends)."""
    admin = superuser_connect(cluster)
    try:
        wait_until(lambda: not backend_pids(admin, users, dbname), 30, "earlier backends to exit")
    finally:
        admin.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll predicate until true or timeout seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def make_table(cluster: TempCluster, prefix: str) -> str:
    """A new table (v int) in the app database that every role may use; its name."""
    table = prefix + uuid.uuid4().hex[:12]
    cluster.psql(
        f"CREATE TABLE {table} (v int); GRANT ALL ON TABLE {table} TO PUBLIC;", dbname="app"
    )
    return table


def rows(cluster: TempCluster, table: str) -> list[int]:
    """The values in a make_table table, in order."""
    out = cluster.psql(f"SELECT v FROM {table} ORDER BY v", dbname="app")
    return [int(line) for line in out.split()]
