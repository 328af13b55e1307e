"""`pgtarn top` against a live pgtarn: one frame with --once, and the live view under tmux
(its keys: q quits)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, free_port

from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_for

SRC = Path(__file__).resolve().parents[2] / "src"


def admin_conninfo(proc: PgtarnProcess) -> str:
    return str(proc.dsn("app", "app_pass", dbname="pgbouncer"))


def top_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "COLUMNS": "160",
        "PYTHONPATH": f"{SRC}{os.pathsep}{path}" if path else str(SRC),
    }


def section(text: str, title: str) -> list[list[str]]:
    """The rows of the table titled `title` in a frame, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.lstrip()[0] not in "│┃┏┡└┗━─╇":
            break
        if "│" in line:
            rows.append([cell.strip() for cell in line.split("│")[1:-1]])
    return rows


def pool_cells(text: str, database: str = "app") -> dict[str, str]:
    header = ["database", "user", "cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait"]
    for cells in section(text, "pools"):
        if cells[:2] == [database, "app"]:
            return dict(zip(header, cells, strict=True))
    raise AssertionError(f"no pool row for {database} in:\n{text}")


def hold_transactions(proc: PgtarnProcess, count: int) -> list[psycopg.Connection[Any]]:
    """`count` clients each in a transaction (so each holds a server)."""
    conns = [connect(proc) for _ in range(count)]
    for conn in conns:
        conn.execute("select 1")
    return conns


def test_once_prints_the_pool_row_with_its_active_clients(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    conns = hold_transactions(proc, 2)
    pinned = connect(proc, autocommit=True)
    pinned.execute("create temp table top_pinned (v int)")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pgtarn", "top", "--once", admin_conninfo(proc)],
            env=top_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        text = result.stdout
        assert "\x1b[" not in text  # not a terminal: no colour codes
        row = pool_cells(text)
        assert (row["cl_active"], row["sv_active"], row["cl_waiting"]) == ("3", "3", "0"), text
        assert "databases" in text and "busiest clients" in text
        # the two in a transaction and the pinned one are linked to their servers
        assert sum(1 for c in section(text, "busiest clients") if c[0] == "app") == 3
        assert "pinned clients: 1" in text and "temp_object" in text
    finally:
        for conn in [*conns, pinned]:
            conn.close()


def test_once_rates_count_the_transactions_between_its_two_samples(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory()
    stop = time.monotonic() + 20
    with connect(proc, autocommit=True) as conn:
        top = subprocess.Popen(
            [sys.executable, "-m", "pgtarn", "top", "--once", admin_conninfo(proc)],
            env=top_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while top.poll() is None and time.monotonic() < stop:
            conn.execute("select 1")
        out, err = top.communicate(timeout=10)
    assert top.returncode == 0, err
    rates = {cells[0]: cells for cells in section(out, "databases")}
    assert float(rates["app"][1]) > 0, out  # xact/s
    assert rates["app"][4] == "-"  # no --metrics: no p99


def test_once_p99_from_the_metrics_endpoint(pgtarn_factory: PgtarnFactory) -> None:
    port = free_port()
    proc = pgtarn_factory(settings={"metrics_port": port})
    stop = time.monotonic() + 20
    with connect(proc, autocommit=True) as conn:
        top = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgtarn",
                "top",
                "--once",
                "--metrics",
                str(port),
                admin_conninfo(proc),
            ],
            env=top_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while top.poll() is None and time.monotonic() < stop:
            conn.execute("select pg_sleep(0.002)")
        out, err = top.communicate(timeout=10)
    assert top.returncode == 0, err
    rates = {cells[0]: cells for cells in section(out, "databases")}
    assert 1.0 < float(rates["app"][4]) < 1000.0, out  # p99 in ms: a few ms each


def test_once_without_a_pooler_fails_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgtarn",
            "top",
            "--once",
            f"host={tmp_path} port=1 dbname=pgbouncer user=x",
        ],
        env=top_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and "pgtarn top:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_live_view_under_tmux_shows_the_pools_and_quits_on_q(
    pgtarn_factory: PgtarnFactory, tmp_path: Path
) -> None:
    proc = pgtarn_factory()
    conns = hold_transactions(proc, 2)
    session = f"pgtarn-top-{os.getpid()}"
    socket_name = str(tmp_path / "tmux.sock")
    marker = tmp_path / "exited"
    env = top_env()
    command = (
        f"env PYTHONPATH={shlex.quote(env['PYTHONPATH'])} {shlex.quote(sys.executable)}"
        f" -m pgtarn top --interval 0.3 {shlex.quote(admin_conninfo(proc))};"
        f" echo $? > {shlex.quote(str(marker))}"
    )

    def tmux(*args: str) -> str:
        return subprocess.run(
            ["tmux", "-S", socket_name, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout

    def screen_shows(check: Callable[[str], bool]) -> bool:
        return wait_for(lambda: check(tmux("capture-pane", "-p", "-t", session)), 15)

    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50", command)
    try:

        def two_active(text: str) -> bool:
            try:
                return pool_cells(text)["cl_active"] == "2"
            except (AssertionError, StopIteration, ValueError):  # not drawn yet
                return False

        assert screen_shows(two_active), tmux("capture-pane", "-p", "-t", session)
        conns.pop().close()  # the next refreshes follow
        assert screen_shows(lambda t: "pools" in t and pool_cells(t)["cl_active"] == "1")
        # `d` filters on the first database (app), `/` then a name filters by it
        tmux("send-keys", "-t", session, "d")
        assert screen_shows(lambda t: "databases: app" in t)
        tmux("send-keys", "-t", session, "/", "pgb", "Enter")
        assert screen_shows(lambda t: "databases: *pgb*" in t and "│ app " not in t)
        tmux("send-keys", "-t", session, "q")
        assert wait_for(marker.exists, 10), tmux("capture-pane", "-p", "-t", session)
        assert marker.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "-S", socket_name, "kill-server"], capture_output=True, timeout=10)
        for conn in conns:
            conn.close()
