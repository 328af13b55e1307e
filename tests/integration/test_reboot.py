"""Rolling restart: pgtarn --reboot takes over the sockets and the idle clients of the running
one, under pgbench, with no connection refused; a client keeps its session through it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster

from .certs import Pki
from .conftest import PgtarnFactory
from .drivers import connect
from .test_pgbench import pgbench_tables, processed
from .test_tls import tls_in_use, tls_settings

__all__ = ["pgbench_tables"]

pytestmark = pytest.mark.integration

SERVING = re.compile(
    r"of (\d+) clients (\d+) are idle and go to it now, (\d+) are in a "
    r"transaction and (\d+) in a query or waiting for a server \(they go "
    r"when it ends\), (\d+) stay here"
)


class ConnectLoop:
    """Connections attempted (each running one query) in a thread all through a restart:
    none may be refused."""

    def __init__(self, proc: PgtarnProcess) -> None:
        self.proc = proc
        self.attempts = 0
        self.refused: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.attempts += 1
            try:
                with connect(self.proc, autocommit=True, connect_timeout=20) as c:
                    c.execute("select 1")
            except psycopg.Error as exc:
                self.refused.append(str(exc))

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=60)


def _reboot(proc: PgtarnProcess, workdir: Path) -> PgtarnProcess:
    """A second pgtarn with --reboot on proc's configuration, once it serves the sockets."""
    workdir.mkdir(exist_ok=True)
    new = PgtarnProcess.launch(
        proc.ini_path,
        host=proc.host,
        port=proc.port,
        workdir=str(workdir),
        args=["-v", "--reboot"],
        logfile=proc.logfile,
        socket_dir=proc.socket_dir,
    )
    _wait_for(lambda: "takeover: the new process serves" in proc.log_text(), 30)
    return new


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _stopped(new: PgtarnProcess) -> None:
    new.stop(timeout=10)
    assert "Traceback" not in new.log_text()


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed")
def test_rolling_restart_under_pgbench(
    pgtarn_factory: PgtarnFactory, pgbench_tables: None, tmp_path: Path
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 5, "max_client_conn": 200})
    bench = subprocess.Popen(
        ["pgbench", "-n", "-N", "-c", "20", "-j", "2", "-T", "8", proc.dsn("app", "app_pass")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    loop = ConnectLoop(proc)  # connections attempted all through the restart
    new = None
    try:
        time.sleep(1.5)  # pgbench is under way
        assert bench.poll() is None, "pgbench ended before the restart"
        new = _reboot(proc, tmp_path / "new")
        proc.proc.wait(timeout=120)  # the old one drains and exits
        bench_running = bench.poll() is None
        time.sleep(0.5)
        loop.stop()
        out, err = bench.communicate(timeout=300)
        assert bench.returncode == 0, err[-2000:]
        done, failed = processed(out)
        assert done > 0 and failed == 0
        assert loop.refused == [], loop.refused[:3]
        assert loop.attempts > 5
        counts = SERVING.search(proc.log_text())
        assert counts is not None
        total, idle, in_xact, busy, stay = map(int, counts.groups())
        print(
            f"\nat the takeover: {total} clients, {idle} idle, {in_xact} mid-transaction, "
            f"{busy} in a query or waiting for a server, {stay} stayed; {loop.attempts} "
            f"connects during the restart, none refused; pgbench: {done} transactions, "
            f"{failed} failed"
        )
        handed = re.search(r"takeover: (\d+) clients handed over", proc.log_text())
        assert handed is not None
        print(
            f"{handed.group(1)} clients handed over; pgbench still running when the old "
            f"process exited: {bench_running}"
        )
        assert stay <= 1  # (the connect loop's client may be logging in)
        # every pgbench client went over while it ran (none was cut off)
        assert bench_running and int(handed.group(1)) >= 20
        assert proc.proc.returncode == 0
        with connect(proc, autocommit=True) as c:  # the new one serves
            assert c.execute("select 7").fetchone() == (7,)
        assert new.proc.poll() is None
    finally:
        loop.stop()
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
        if new is not None:
            _stopped(new)


def test_a_client_keeps_its_session_through_the_restart(
    pgtarn_factory: PgtarnFactory, tmp_path: Path
) -> None:
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    idle = connect(proc, autocommit=True)
    idle.execute("SET statement_timeout = '123s'")
    idle.execute("SET application_name = 'kept'")
    assert idle.execute("select %s::int + 1", [1], prepare=True).fetchone() == (2,)
    in_xact = connect(proc)
    in_xact.execute("select 1")  # a transaction is open (psycopg's implicit BEGIN)
    new = _reboot(proc, tmp_path / "new")
    try:
        # the old process keeps the client whose transaction is open, and only it
        time.sleep(0.5)
        assert proc.proc.poll() is None
        # its CancelRequest lands on the new process, which passes it to the old one
        canceller = threading.Timer(1.0, in_xact.cancel)
        canceller.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            in_xact.execute("select pg_sleep(20)")
        canceller.join()
        assert proc.proc.poll() is None
        in_xact.rollback()  # its transaction ends: it goes to the new process too
        proc.proc.wait(timeout=30)
        _wait_for(lambda: "is done; 2 clients came from it" in proc.log_text(), 10)
        # same connection, same session: the setting, the parameter, the prepared statement
        assert idle.execute("show statement_timeout").fetchone() == ("123s",)
        assert idle.execute("show application_name").fetchone() == ("kept",)
        assert idle.execute("select %s::int + 1", [41], prepare=True).fetchone() == (42,)
        assert in_xact.execute("select 5").fetchone() == (5,)
        in_xact.commit()
        # its cancel key works on the new process
        canceller = threading.Timer(1.0, idle.cancel)
        canceller.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            idle.execute("select pg_sleep(20)")
        canceller.join()
        assert idle.execute("select 9").fetchone() == (9,)
    finally:
        idle.close()
        in_xact.close()
        _stopped(new)


def test_tls_and_pinned_clients_finish_on_the_old_process(
    pgtarn_factory: PgtarnFactory, pki: Pki, tmp_path: Path
) -> None:
    proc = pgtarn_factory(settings=tls_settings(pki, "allow"))
    secure = connect(proc, autocommit=True, sslmode="require")
    assert tls_in_use(secure)
    pinned = connect(proc, autocommit=True, sslmode="disable")
    pinned.execute("select pg_advisory_lock(4242)")  # session state that cannot move
    plain = connect(proc, autocommit=True, sslmode="disable")
    assert plain.execute("select 1").fetchone() == (1,)
    new = _reboot(proc, tmp_path / "new")
    try:
        _wait_for(
            lambda: (
                re.search(r"of 3 clients 1 are idle .* 2 stay here", proc.log_text()) is not None
            ),
            10,
        )
        # both still served by the old process, which waits for them
        assert secure.execute("select 2").fetchone() == (2,)
        assert pinned.execute("select pg_advisory_unlock(4242)").fetchone() == (True,)
        time.sleep(0.5)
        assert proc.proc.poll() is None
        secure.close()
        # unpinned now (the lock is gone): it goes over at its next idle moment
        proc.proc.wait(timeout=30)
        assert pinned.execute("select 3").fetchone() == (3,)
        assert plain.execute("select 4").fetchone() == (4,)
        with connect(proc, sslmode="require") as again:  # the new one serves TLS too
            assert tls_in_use(again)
    finally:
        for conn in (secure, pinned, plain):
            conn.close()
        _stopped(new)


def _scram_keys(verifier: str, password: str) -> list[bytes]:
    """The ClientKey and ServerKey a SCRAM login with password against verifier yields."""
    iterations, salt = verifier.split("$")[1].split(":")
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations)
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return [client_key, base64.b64decode(verifier.split("$")[2].split(":")[1])]


def test_scram_passthrough_keys_go_with_the_clients(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    pg_roles: dict[str, str],
    tmp_path: Path,
) -> None:
    """Only a SCRAM verifier stored: the new process logs in to PostgreSQL for a handed-over
    client with the keys of that client's login, which never show in the log."""
    verifier = pg_cluster.scram_verifier("app")
    proc = pgtarn_factory(userlist={"app": verifier}, settings={"verbose": 2})
    client = connect(proc, autocommit=True)
    assert client.execute("select current_user").fetchone() == ("app",)
    new = _reboot(proc, tmp_path / "new")
    try:
        proc.proc.wait(timeout=30)  # the old one exits: its server connections are gone
        _wait_for(lambda: "is done; 1 clients came from it" in proc.log_text(), 10)
        # the new process opens a server for the client: SCRAM with the handed-over keys
        assert client.execute("select current_user").fetchone() == ("app",)
        log = proc.log_text()
        for key in _scram_keys(verifier, pg_roles["app"]):
            for shown in (key.hex(), base64.b64encode(key).decode(), repr(key)):
                assert shown not in log
    finally:
        client.close()
        _stopped(new)
