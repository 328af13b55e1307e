"""pgbench through transaction pooling: 50 clients, zero errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory

pytestmark = pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed")

CLIENTS = 50
PER_CLIENT = 100


@pytest.fixture(scope="module")
def pgbench_tables(pg_cluster: TempCluster) -> None:
    subprocess.run(
        ["pgbench", "-i", "-s", "1", "-q", pg_cluster.dsn("app", "app_pass", dbname="app")],
        check=True,
        capture_output=True,
        timeout=120,
    )


def run_pgbench(proc: PgtarnProcess, *args: str) -> str:
    result = subprocess.run(
        [
            "pgbench",
            "-n",
            "-c",
            str(CLIENTS),
            "-j",
            "2",
            "-t",
            str(PER_CLIENT),
            *args,
            proc.dsn("app", "app_pass"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def processed(output: str) -> tuple[int, int]:
    done = re.search(r"number of transactions actually processed: (\d+)", output)
    failed = re.search(r"number of failed transactions: (\d+)", output)
    assert done and failed, output
    return int(done.group(1)), int(failed.group(1))


@pytest.mark.parametrize("mode", ["-S", "-N"])
def test_pgbench_transaction_mode_50_clients(
    pgtarn_factory: PgtarnFactory, pgbench_tables: None, mode: str
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 10, "max_client_conn": 200})
    assert processed(run_pgbench(proc, mode)) == (CLIENTS * PER_CLIENT, 0)


def test_pgbench_extended_protocol_and_reconnects(
    pgtarn_factory: PgtarnFactory, pgbench_tables: None
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 10, "max_client_conn": 200})
    assert processed(run_pgbench(proc, "-S", "-M", "extended")) == (CLIENTS * PER_CLIENT, 0)
    # -C: a new connection (SCRAM login) per transaction
    result = subprocess.run(
        ["pgbench", "-n", "-C", "-c", "10", "-t", "20", "-S", proc.dsn("app", "app_pass")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert processed(result.stdout) == (200, 0)
