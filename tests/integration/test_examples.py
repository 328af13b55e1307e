"""examples/pgbouncer.ini and userlist.txt run as shipped, pointed at the test cluster."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster, free_port

from .conftest import ITEMS, ROLE_PASSWORDS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _replace_once(text: str, pattern: str, new: str) -> str:
    """text with the one line matching pattern replaced (the example must still have it)."""
    result, count = re.subn(pattern, new, text, flags=re.MULTILINE)
    assert count == 1, f"examples/: expected one line matching {pattern!r}"
    return result


@pytest.fixture
def socket_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="pgtarn-ex-", dir="/tmp")  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_example_serves_clients_and_the_admin_console(
    pg_cluster: TempCluster, tmp_path: Path, socket_dir: str
) -> None:
    port = free_port()
    ini = (EXAMPLES / "pgbouncer.ini").read_text(encoding="utf-8")
    # only where the server, the port and the socket are, as a user adapting it would
    ini = _replace_once(
        ini, r"^app = host=\S+ port=\d+", f"app = host={pg_cluster.host} port={pg_cluster.port}"
    )
    ini = _replace_once(ini, r"^listen_port = \d+$", f"listen_port = {port}")
    ini = _replace_once(ini, r"^unix_socket_dir = \S+$", f"unix_socket_dir = {socket_dir}")
    users = (EXAMPLES / "userlist.txt").read_text(encoding="utf-8")
    users = _replace_once(users, r'^"app" "[^"]*"$', f'"app" "{ROLE_PASSWORDS["app"]}"')
    (tmp_path / "pgbouncer.ini").write_text(ini, encoding="utf-8")
    (tmp_path / "userlist.txt").write_text(users, encoding="utf-8")

    # started in its directory: the example's auth_file is relative
    proc = PgtarnProcess.launch(
        str(tmp_path / "pgbouncer.ini"),
        host="127.0.0.1",
        port=port,
        workdir=str(tmp_path),
        socket_dir=socket_dir,
    )
    try:
        dsn = (
            f"host=127.0.0.1 port={port} user=app password={ROLE_PASSWORDS['app']} sslmode=disable"
        )
        with psycopg.connect(f"{dsn} dbname=app") as conn:
            for _ in range(2):  # two transactions: the server goes back in between
                assert conn.execute("SELECT id, name FROM items ORDER BY id").fetchall() == ITEMS
                conn.commit()
        with psycopg.connect(f"{dsn} dbname=pgbouncer", autocommit=True) as console:
            cursor = console.execute("SHOW POOLS")
            names = [column.name for column in cursor.description or ()]
            pools = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        assert ("app", "app", "transaction") in {
            (p["database"], p["user"], p["pool_mode"]) for p in pools
        }
    finally:
        proc.stop()
    assert "Traceback" not in proc.log_text()
