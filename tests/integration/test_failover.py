"""Failover under load with read_write_split: the primary crashes under pgbench -N and -S
clients, its standby is promoted with pg_ctl promote, and pgtarn follows without a reload; only
the transactions in flight on the dead primary fail, reads go on, and the old primary joins
again as a replica."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess
from tests.support.cluster import PrimaryCluster, StandbyCluster, primary_and_standby

from .conftest import PgtarnFactory
from .drivers import connect, scalar
from .pgstat import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed"),
]

POOL_SIZE = 4
CLIENTS = 8
PORT = "select current_setting('port')::int"


@pytest.fixture
def pair() -> Iterator[tuple[PrimaryCluster, StandbyCluster]]:
    with primary_and_standby() as (primary, standby):
        subprocess.run(
            ["pgbench", "-i", "-s", "1", "-q", primary.dsn("app", "app_pass", dbname="app")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield primary, standby


def _pgbench(proc: PgtarnProcess, mode: str, seconds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "pgbench",
            "-n",
            "-c",
            str(CLIENTS),
            "-j",
            "2",
            "-T",
            str(seconds),
            mode,
            proc.dsn("app", "app_pass"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(run: subprocess.Popen[str]) -> tuple[int, int, str]:
    """Transactions processed, clients aborted, and the output."""
    out, err = run.communicate(timeout=120)
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    aborted = len(re.findall(r"client \d+ aborted", err))
    return (int(done.group(1)) if done else 0), aborted, out + err


def _hosts(proc: PgtarnProcess) -> dict[int, str]:
    """port -> role, from SHOW HOSTS."""
    with connect(proc, dbname="pgbouncer", autocommit=True) as admin:  # app: admin_users
        cur = admin.execute("SHOW HOSTS")
        names = [d.name for d in cur.description or ()]
        return {int(row[names.index("port")]): row[names.index("role")] for row in cur}


def _split(
    pgtarn_factory: PgtarnFactory,
    pair: tuple[PrimaryCluster, StandbyCluster],
    primary_reads: str = "off",
    **settings: object,
) -> Any:
    """pgtarn on the pair with read_write_split = auto, once the checks know both roles."""
    primary, standby = pair
    entry = (
        f"host={primary.host},{standby.host} port={primary.port},{standby.port} "
        f"dbname=app read_write_split=auto primary_reads={primary_reads} "
        "health_check_period=0.2"
    )
    proc = pgtarn_factory(
        databases={"app": entry}, settings={"default_pool_size": POOL_SIZE, **settings}
    )
    with connect(proc) as conn:  # the first client makes the pools and starts the checks
        conn.execute("select 1")
    roles = {primary.port: "primary", standby.port: "replica"}
    assert wait_for(lambda: _hosts(proc) == roles, timeout=30)
    return proc


def test_failover_under_pgbench(
    pgtarn_factory: PgtarnFactory, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    primary, standby = pair
    proc = _split(pgtarn_factory, pair, max_client_conn=100, query_wait_timeout=30)
    writes = _pgbench(proc, "-N", 14)
    reads = _pgbench(proc, "-S", 14)
    time.sleep(4)
    primary.crash()
    time.sleep(2)
    standby.promote()
    written, writers_aborted, write_log = _result(writes)
    read, readers_aborted, read_log = _result(reads)
    print(
        f"failover: -N {written} transactions, {writers_aborted} of {CLIENTS} clients "
        f"aborted; -S {read} transactions, {readers_aborted} aborted"
    )
    # only transactions in flight on the dead primary failed: at most one per server of
    # the primary's pool; the other writers waited for the promoted standby and went on
    assert writers_aborted <= POOL_SIZE, write_log
    assert writers_aborted < CLIENTS and written > 0, write_log
    # reads went on on the replica the whole time
    assert readers_aborted == 0, read_log
    assert read > 0
    assert _hosts(proc)[standby.port] == "primary"
    with connect(proc, autocommit=True) as conn:
        conn.execute("insert into pgbench_history (tid, bid, aid, delta) values (1, 1, 1, 1)")
        with conn.transaction():  # a transaction that may write: on the new primary
            assert scalar(conn.execute(PORT)) == standby.port
    # the old primary comes back as a standby of the new one, on its old port: a replica
    old_port = primary.port
    primary.cleanup()
    rejoined = StandbyCluster(standby, port=old_port)
    try:
        rejoined.start()
        assert wait_for(lambda: _hosts(proc).get(old_port) == "replica", timeout=30)
        with connect(proc, autocommit=True) as conn:
            assert wait_for(lambda: scalar(conn.execute(PORT)) == old_port, timeout=30)
    finally:
        rejoined.cleanup()


def test_two_primaries_get_no_writes(
    pgtarn_factory: PgtarnFactory, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    primary, standby = pair
    proc = _split(pgtarn_factory, pair, primary_reads="on", query_wait_timeout=2)
    with connect(proc, autocommit=True) as conn:
        conn.execute("insert into pgbench_history (tid, bid, aid, delta) values (1, 1, 1, 1)")
    standby.promote()  # while the primary is up: both say they are the primary
    roles = {primary.port: "primary", standby.port: "primary"}
    assert wait_for(lambda: _hosts(proc) == roles, timeout=30)
    with pytest.raises(psycopg.OperationalError):
        with connect(proc, autocommit=True) as conn:
            conn.execute("insert into pgbench_history (tid, bid, aid, delta) values (1, 1, 1, 2)")
    log = proc.log_text()
    assert "2 servers claim to be the primary" in log
    assert "more than one server claims to be the primary" in log


def test_writes_wait_for_a_primary_then_fail_clearly(
    pgtarn_factory: PgtarnFactory, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    primary, standby = pair
    proc = _split(pgtarn_factory, pair, query_wait_timeout=3)
    primary.crash()  # and nobody promotes the standby
    with connect(proc, autocommit=True) as reader:  # reads go on on the replica
        assert reader.execute(PORT).fetchone() == (standby.port,)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as error:
            reader.execute("insert into pgbench_history (tid, bid, aid, delta) values (1, 1, 1, 3)")
        waited = time.monotonic() - started
    assert "query_wait_timeout" in str(error.value) and "no primary" in str(error.value)
    assert 2.5 < waited < 15, waited  # query_wait_timeout, not at once nor forever
