"""Rolling restart with workers: --reboot between pgtarns of workers = 2 and 1 (either way),
under pgbench, with no connection refused; a client mid-transaction is cancelled through
the new pgtarn, then goes over with its session."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.support import PgtarnProcess
from tests.support.procs import wait_children

from .conftest import PgtarnFactory
from .drivers import connect
from .test_pgbench import pgbench_tables, processed
from .test_reboot import SERVING, ConnectLoop, _stopped, _wait_for

__all__ = ["pgbench_tables"]

pytestmark = pytest.mark.integration


def _with_workers(proc: PgtarnProcess, workers: int, workdir: Path) -> str:
    """A copy of proc's configuration with workers = workers."""
    workdir.mkdir(exist_ok=True)
    lines = [
        line
        for line in Path(proc.ini_path).read_text().splitlines()
        if not re.match(r"\s*workers\s*=", line)
    ]
    at = lines.index("[pgbouncer]") + 1
    lines.insert(at, f"workers = {workers}")
    path = workdir / "pgbouncer.ini"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _reboot(proc: PgtarnProcess, workers: int, workdir: Path) -> PgtarnProcess:
    """A second pgtarn with --reboot and workers = workers, once it serves the sockets."""
    new = PgtarnProcess.launch(
        _with_workers(proc, workers, workdir),
        host=proc.host,
        port=proc.port,
        workdir=str(workdir),
        args=["-v", "--reboot"],
        logfile=proc.logfile,
        socket_dir=proc.socket_dir,
    )
    _wait_for(lambda: "takeover: the new process serves" in proc.log_text(), 30)
    return new


def _old_workers(proc: PgtarnProcess, workers: int) -> list[int]:
    if workers == 1:
        return []
    pids = wait_children(proc.proc.pid, workers)
    assert len(pids) == workers, pids
    return pids


def _logfile_text(proc: PgtarnProcess) -> str:
    """pgtarn's logfile alone (log_text repeats it with stderr)."""
    assert proc.logfile is not None
    return Path(proc.logfile).read_text()


def _clients_came(proc: PgtarnProcess) -> int:
    """How many clients the log says came from old processes (summed over its lines)."""
    found = re.findall(r"is done; (\d+) clients came from it", _logfile_text(proc))
    return sum(int(n) for n in found)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed")
@pytest.mark.parametrize(("old", "new"), [(2, 2), (2, 1), (1, 2)])
def test_rolling_restart_with_workers_under_pgbench(
    pgtarn_factory: PgtarnFactory,
    pgbench_tables: None,
    tmp_path: Path,
    old: int,
    new: int,
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 5, "max_client_conn": 200, "workers": old})
    old_pids = _old_workers(proc, old)
    bench = subprocess.Popen(
        ["pgbench", "-n", "-N", "-c", "20", "-j", "2", "-T", "10", proc.dsn("app", "app_pass")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    loop = ConnectLoop(proc)  # connections attempted all through the restart
    successor = None
    try:
        time.sleep(2.0)  # pgbench is under way
        assert bench.poll() is None, "pgbench ended before the restart"
        successor = _reboot(proc, new, tmp_path / "new")
        proc.proc.wait(timeout=120)  # the old workers drain, and their supervisor exits
        bench_running = bench.poll() is None
        _wait_for(lambda: all(_gone(pid) for pid in old_pids), 30)
        time.sleep(0.5)
        loop.stop()
        out, err = bench.communicate(timeout=300)
        assert bench.returncode == 0, err[-2000:]
        done, failed = processed(out)
        assert done > 0 and failed == 0
        assert loop.refused == [], loop.refused[:3]
        assert loop.attempts > 5
        log = _logfile_text(proc)  # (log_text repeats it with stderr)
        counts = [tuple(map(int, m.groups())) for m in SERVING.finditer(log)]
        assert len(counts) == old, counts  # one line per old worker (or the one process)
        total, idle, in_xact, busy, stay = (sum(c[i] for c in counts) for i in range(5))
        handed = sum(int(n) for n in re.findall(r"takeover: (\d+) clients handed over, ", log))
        print(
            f"\n{old} -> {new} workers: at the takeover {total} clients, {idle} idle, "
            f"{in_xact} mid-transaction, {busy} in a query or waiting for a server, "
            f"{stay} stayed; {handed} handed over; {loop.attempts} connects during the "
            f"restart, none refused; pgbench: {done} transactions, {failed} failed; "
            f"pgbench still running when the old pgtarn exited: {bench_running}"
        )
        assert stay <= 1  # (the connect loop's client may be logging in)
        assert "exited unexpectedly" not in log  # no draining worker was restarted
        assert "Traceback" not in log
        assert bench_running and handed >= 20  # every pgbench client went over
        assert proc.proc.returncode == 0
        with connect(proc, autocommit=True) as c:  # the new one serves
            assert c.execute("select 7").fetchone() == (7,)
        assert successor.proc.poll() is None
        if new > 1:
            assert len(wait_children(successor.proc.pid, new)) == new
        assert os.path.exists(os.path.join(proc.socket_dir, f".s.PGSQL.{proc.port}"))
    finally:
        loop.stop()
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
        if successor is not None:
            _stopped(successor)


def test_a_client_mid_transaction_is_cancelled_through_the_new_workers(
    pgtarn_factory: PgtarnFactory,
    tmp_path: Path,
) -> None:
    proc = pgtarn_factory(settings={"workers": 2, "max_prepared_statements": 10})
    _old_workers(proc, 2)
    idle = [connect(proc, autocommit=True) for _ in range(4)]
    for n, conn in enumerate(idle):
        conn.execute(f"SET application_name = 'kept{n}'")
        assert conn.execute("select %s::int + 1", [n], prepare=True).fetchone() == (n + 1,)
    in_xact = [connect(proc) for _ in range(4)]  # over both old workers, most likely
    for conn in in_xact:
        conn.execute("select 1")  # a transaction is open (psycopg's implicit BEGIN)
    successor = _reboot(proc, 2, tmp_path / "new")
    try:
        time.sleep(0.5)
        assert proc.proc.poll() is None  # the old workers keep the clients in a transaction
        # their CancelRequests land on the new workers, which pass them to the old pgtarn
        for conn in in_xact:
            canceller = threading.Timer(1.0, conn.cancel)
            canceller.start()
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("select pg_sleep(20)")
            canceller.join()
            conn.rollback()  # its transaction ends: it goes over
        proc.proc.wait(timeout=30)
        _wait_for(lambda: _clients_came(proc) == 8, 10)
        for n, conn in enumerate(idle):  # same connection, same session
            assert conn.execute("show application_name").fetchone() == (f"kept{n}",)
            assert conn.execute("select %s::int + 1", [41], prepare=True).fetchone() == (42,)
        for conn in in_xact:
            assert conn.execute("select 5").fetchone() == (5,)
            conn.commit()
        # a handed client's cancel key works on the new workers
        canceller = threading.Timer(1.0, idle[0].cancel)
        canceller.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            idle[0].execute("select pg_sleep(20)")
        canceller.join()
    finally:
        for conn in idle + in_xact:
            conn.close()
        _stopped(successor)


def test_one_reboot_after_another(pgtarn_factory: PgtarnFactory, tmp_path: Path) -> None:
    """1 -> 2 (the two workers share the single process's socket) -> 1: the second takeover
    finds the sockets the first one spread, sent once each."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    clients = [connect(proc, autocommit=True) for _ in range(6)]
    for n, conn in enumerate(clients):
        conn.execute(f"SET application_name = 'kept{n}'")
    second = third = None
    try:
        second = _reboot(proc, 2, tmp_path / "second")
        proc.proc.wait(timeout=30)
        assert len(wait_children(second.proc.pid, 2)) == 2
        _wait_for(lambda: "takeover: the old process (pid" in second.log_text(), 10)
        third = _reboot(second, 1, tmp_path / "third")
        second.proc.wait(timeout=30)
        assert second.proc.returncode == 0
        log = _logfile_text(proc)
        sent = re.findall(r"asks for the listening sockets; sending (\d+)", log)
        assert sent == ["2", "2"], sent  # TCP and unix, each once
        for n, conn in enumerate(clients):  # same connection, same session, twice over
            assert conn.execute("show application_name").fetchone() == (f"kept{n}",)
        with connect(proc, autocommit=True) as c:
            assert c.execute("select 8").fetchone() == (8,)
        assert third.proc.poll() is None
    finally:
        for conn in clients:
            conn.close()
        if third is not None:
            _stopped(third)
        if second is not None and second.proc.poll() is None:
            second.stop()
