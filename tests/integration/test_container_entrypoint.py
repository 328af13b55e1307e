"""The container entrypoint's generated configuration, run by a real pgtarn against PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from pgtarn.cli.container import generate, health_check, write_generated
from tests.support import PgtarnProcess, TempCluster, free_port

from .conftest import ITEMS, ROLE_PASSWORDS


def _env(pg_cluster: TempCluster, user: str, port: int, **extra: str) -> dict[str, str]:
    password = quote(ROLE_PASSWORDS[user], safe="")
    url = f"postgres://{quote(user)}:{password}@{pg_cluster.host}:{pg_cluster.port}/app"
    return {
        "DATABASE_URL": url,
        "LISTEN_ADDR": "127.0.0.1",
        "LISTEN_PORT": str(port),
        "POOL_MODE": "transaction",
        "DEFAULT_POOL_SIZE": "3",
        **extra,
    }


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    # a short path: it is the unix socket's directory too (107 bytes at most)
    path = Path(f"/tmp/pgtarn-ct-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    yield path
    for child in path.glob("*") if path.exists() else ():
        child.unlink()
    if path.exists():
        path.rmdir()


def _items(user: str, port: int) -> list[tuple[int, str]]:
    dsn = (
        f"host=127.0.0.1 port={port} dbname=app user={user} "
        f"password={ROLE_PASSWORDS[user]} sslmode=disable"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id, name FROM items ORDER BY id").fetchall()


@pytest.mark.parametrize(("user", "auth_type"), [("app", "scram-sha-256"), ("md5_user", "md5")])
def test_generated_files_serve_clients(
    pg_cluster: TempCluster, run_dir: Path, tmp_path: Path, user: str, auth_type: str
) -> None:
    port = free_port()
    generated = generate(_env(pg_cluster, user, port, AUTH_TYPE=auth_type), str(run_dir))
    ini = write_generated(generated, str(run_dir))
    proc = PgtarnProcess.launch(
        ini, host="127.0.0.1", port=port, workdir=str(tmp_path), socket_dir=str(run_dir)
    )
    try:
        assert _items(user, port) == ITEMS
        assert health_check("127.0.0.1", port)
        admin = (
            f"host=127.0.0.1 port={port} dbname=pgbouncer user={user} "
            f"password={ROLE_PASSWORDS[user]} sslmode=disable"
        )
        with psycopg.connect(admin, autocommit=True) as console:
            cursor = console.execute("SHOW POOLS")
            names = [column.name for column in cursor.description or ()]
            pools = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        assert {(pool["database"], pool["pool_mode"]) for pool in pools} >= {("app", "transaction")}
    finally:
        proc.stop()
    assert "Traceback" not in proc.log_text()


def test_entrypoint_generates_runs_and_stops_on_sigterm(
    pg_cluster: TempCluster, run_dir: Path
) -> None:
    port = free_port()
    env = {**os.environ, **_env(pg_cluster, "app", port), "PGTARN_RUN_DIR": str(run_dir)}
    env.pop("PGTARN_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtarn", "container", "-v"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not health_check("127.0.0.1", port, timeout=0.5):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the entrypoint's pgtarn never answered"
            time.sleep(0.1)
        assert _items("app", port) == ITEMS
        health = subprocess.run(
            [sys.executable, "-m", "pgtarn", "container", "health"],
            env={**env, "LISTEN_PORT": str(port)},
            capture_output=True,
            timeout=10,
        )
        assert health.returncode == 0, health.stderr
        proc.send_signal(signal.SIGTERM)  # no client left: exits at once, as PgBouncer
        output, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output
    assert ROLE_PASSWORDS["app"] not in output
    assert "pgtarn container: wrote" in output
    assert "Traceback" not in output
    assert not health_check("127.0.0.1", port, timeout=0.5)
