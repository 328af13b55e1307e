"""Faults while serving: PostgreSQL restarted under pgbench, a silent network partition,
the wall clock stepped backwards and forwards."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .faultproxy import FaultProxy
from .pgstat import superuser_connect
from .test_admin import admin, show
from .test_pgbench import pgbench_tables  # noqa: F401  (a fixture)
from .test_timeouts import final_error, query, raw_login

pytestmark = pytest.mark.integration

LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))), None)


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed")
def test_postgres_restart_during_pgbench(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    pgbench_tables: None,  # noqa: F811 (the fixture)
) -> None:
    pool_size = 4
    proc = pgtarn_factory(settings={"default_pool_size": pool_size, "max_client_conn": 100})
    bench = subprocess.Popen(
        ["pgbench", "-n", "-N", "-c", "20", "-j", "2", "-T", "6", proc.dsn("app", "app_pass")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2)
        pg_cluster.stop()  # fast shutdown: every backend gets FATAL 57P01
        time.sleep(0.5)
        pg_cluster.start()
        with superuser_connect(pg_cluster) as su:
            restarted = su.execute("select now()").fetchone()
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode in (0, 2), err  # 2: some clients aborted
    aborted = len(re.findall(r"client \d+ script \d+ aborted", err))
    # only the transactions under way when PostgreSQL stopped (at most one per server) failed
    assert aborted <= pool_size, err
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    assert done and int(done.group(1)) > 0, out
    with psycopg.connect(pg_cluster.dsn("app", "app_pass", dbname="app")) as direct:
        after = direct.execute(
            "select count(*) from pgbench_history where mtime > %s", restarted
        ).fetchone()
    assert after is not None and after[0] > 0  # the other clients went on after the restart


def test_silent_partition_then_restore(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy
) -> None:
    proc = pgtarn_factory(
        databases={"app": f"host={fault_proxy.host} port={fault_proxy.port} dbname=app"},
        settings={
            "default_pool_size": 2,
            "query_timeout": 3,
            "cancel_wait_timeout": 0.3,
            "server_connect_timeout": 30,
        },
    )
    with connect(proc, autocommit=True) as stuck, connect(proc, autocommit=True) as later:
        assert stuck.execute("select 1").fetchone() == (1,)
        fault_proxy.blackhole()  # packets vanish; nothing is closed or refused
        try:
            with pytest.raises(psycopg.OperationalError) as info:
                stuck.execute("select 2")  # no answer: closed at query_timeout, its server too
            assert info.value.sqlstate == "08P01" and "query timeout" in str(info.value)
            answer: list[Any] = []
            waiter = threading.Thread(
                target=lambda: answer.append(later.execute("select 3").fetchone())
            )
            waiter.start()  # needs a server, which cannot log in yet
            time.sleep(1.0)
            assert answer == []
        finally:
            fault_proxy.blackhole(False)
        waiter.join(30)
        assert answer == [(3,)]  # served once the network came back
    with connect(proc, autocommit=True) as fresh:
        assert fresh.execute("select 4").fetchone() == (4,)


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime not installed")
def test_wall_clock_steps_neither_crash_nor_move_timeouts(
    pgtarn_factory: PgtarnFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = tmp_path / "faketime"
    clock.write_text("+0\n")
    # Only the wall clock is stepped, as NTP or an operator would; CLOCK_MONOTONIC runs on.
    monkeypatch.setenv("LD_PRELOAD", str(LIBFAKETIME))
    monkeypatch.setenv("FAKETIME_TIMESTAMP_FILE", str(clock))
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
    monkeypatch.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    proc = pgtarn_factory(users={"app": "client_idle_timeout=2"})
    monkeypatch.delenv("LD_PRELOAD")  # the test's own clients keep the real clock
    with connect(proc, "scram_user", "scram_pass", autocommit=True) as steady:
        idle = raw_login(proc)
        clock.write_text("+1d\n")  # a day forward: a wall-clock timer would fire now
        tomorrow = time.strftime("%Y-%m-%d", time.localtime(time.time() + 86400))
        time.sleep(1.0)
        assert query(idle, "select 1") == b"I"  # not early
        assert steady.execute("select 1").fetchone() == (1,)
        with admin(proc) as console:
            rows = show(console, "CLIENTS")
        assert any(str(r["connect_time"]).startswith(tomorrow) for r in rows), rows
        clock.write_text("-2d\n")  # and back: a wall-clock timer would wait two days
        fields = final_error(idle)  # idle 2 s by the monotonic clock: ended
        assert fields["C"] == "57P05"
        assert steady.execute("select 2").fetchone() == (2,)
    clock.write_text("+0\n")
    assert tomorrow in proc.log_text()  # pgtarn really ran on the stepped clock
