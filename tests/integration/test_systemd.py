"""systemd: Type=notify datagrams from a real pgtarn, and socket activation (LISTEN_FDS)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import TempCluster, free_port

LISTEN_WRAPPER = (
    # as systemd does: the sockets at 3, 4..., LISTEN_PID our own pid (exec keeps it)
    "import os, sys\n"
    "fds = [int(fd) for fd in os.environ['TEST_FDS'].split(',')]\n"
    "for target, fd in enumerate(fds, 3):\n"
    "    os.dup2(fd, target)\n"
    "for fd in fds:\n"
    "    if fd >= 3 + len(fds):\n"
    "        os.close(fd)\n"
    "os.environ['LISTEN_PID'] = str(os.getpid())\n"
    "os.environ['LISTEN_FDS'] = str(len(fds))\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'pgtarn', *sys.argv[1:]])\n"
)


class Notifications:
    """The datagram socket NOTIFY_SOCKET names, with each sender's pid (SO_PASSCRED)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(path)

    def next(self, timeout: float = 20.0) -> tuple[dict[str, str], int]:
        """The next notification's fields and its sender's pid."""
        self.sock.settimeout(timeout)
        data, ancillary, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = 0
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
        fields = dict(line.split("=", 1) for line in data.decode().splitlines())
        return fields, pid

    def until(self, key: str, timeout: float = 20.0) -> tuple[dict[str, str], int]:
        """Notifications up to the first one with key (others before it are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            fields, pid = self.next(max(0.1, deadline - time.monotonic()))
            if key in fields:
                return fields, pid

    def nothing_more(self, wait: float = 1.0) -> None:
        self.sock.settimeout(wait)
        with pytest.raises(TimeoutError):
            self.sock.recv(4096)


@pytest.fixture
def notifications(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Notifications]:
    listener = Notifications(str(tmp_path / "notify.sock"))
    monkeypatch.setenv("NOTIFY_SOCKET", listener.path)
    yield listener
    listener.sock.close()


class Pgtarn:
    """A pgtarn started for these tests; stopped (and its log checked) at teardown."""

    def __init__(self, workdir: Path, cluster: TempCluster) -> None:
        self.workdir = workdir
        self.cluster = cluster
        self.port = free_port()
        self.ini = workdir / "pgbouncer.ini"
        self.log = workdir / "pgtarn.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def write_ini(self, **settings: object) -> None:
        (self.workdir / "userlist.txt").write_text('"app" "app_pass"\n')
        values: dict[str, object] = {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": "",
            "auth_type": "scram-sha-256",
            "auth_file": self.workdir / "userlist.txt",
            "logfile": self.log,
            "pool_mode": "transaction",
            "admin_users": "app",
        }
        values.update(settings)
        self.ini.write_text(
            f"[databases]\napp = host=127.0.0.1 port={self.cluster.port} dbname=app\n"
            "[pgbouncer]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
        )

    def start(self, argv: list[str] | None = None, **popen: Any) -> subprocess.Popen[bytes]:
        argv = argv or [sys.executable, "-m", "pgtarn"]
        with open(self.workdir / "stderr", "wb") as stderr:
            self.proc = subprocess.Popen(
                [*argv, "-v", str(self.ini)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=self.workdir,
                start_new_session=True,
                **popen,
            )
        return self.proc

    def log_text(self) -> str:
        texts = [
            p.read_text(errors="replace") for p in (self.log, self.workdir / "stderr") if p.exists()
        ]
        return "\n".join(texts)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def pgtarn(pg_cluster: TempCluster, tmp_path: Path) -> Iterator[Pgtarn]:
    started = Pgtarn(tmp_path, pg_cluster)
    yield started
    started.stop()
    assert "Traceback" not in started.log_text(), started.log_text()


def _query(dsn: str) -> object:
    with psycopg.connect(
        dsn + " dbname=app user=app password=app_pass", autocommit=True, connect_timeout=5
    ) as conn:
        row = conn.execute("select 41 + 1").fetchone()
    return row[0] if row else None


def _tcp(port: int) -> str:
    return f"host=127.0.0.1 port={port}"


@pytest.mark.parametrize("workers", [1, 2])
def test_ready_reload_and_stopping_from_the_main_process(
    pgtarn: Pgtarn, notifications: Notifications, workers: int
) -> None:
    pgtarn.write_ini(workers=workers)
    proc = pgtarn.start()
    fields, pid = notifications.until("READY")
    assert pid == proc.pid and fields["MAINPID"] == str(proc.pid)
    assert _query(_tcp(pgtarn.port)) == 42  # READY=1 came once clients could connect

    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    proc.send_signal(signal.SIGHUP)
    fields, pid = notifications.next()
    assert pid == proc.pid and fields["RELOADING"] == "1"
    assert (
        before
        <= int(fields["MONOTONIC_USEC"])
        <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    )
    fields, pid = notifications.next()
    assert pid == proc.pid and fields["READY"] == "1"

    # the admin console's RELOAD too
    with psycopg.connect(
        _tcp(pgtarn.port) + " dbname=pgbouncer user=app password=app_pass", autocommit=True
    ) as admin:
        admin.execute("RELOAD")
    fields, pid = notifications.next()
    assert pid == proc.pid and fields["RELOADING"] == "1"
    assert "READY" in notifications.next()[0]

    proc.send_signal(signal.SIGTERM)
    fields, pid = notifications.next()
    assert pid == proc.pid and fields == {"STOPPING": "1"}
    assert proc.wait(15) == 0
    notifications.nothing_more(0.5)  # and no worker spoke up (they had no NOTIFY_SOCKET)


def test_stopping_at_sigint(pgtarn: Pgtarn, notifications: Notifications) -> None:
    pgtarn.write_ini()
    proc = pgtarn.start()
    notifications.until("READY")
    proc.send_signal(signal.SIGINT)
    assert notifications.next()[0] == {"STOPPING": "1"}
    assert proc.wait(15) == 0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory short enough for a unix socket's path."""
    path = Path(tempfile.mkdtemp(prefix="pgtarn-sd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("workers", [1, 2])
def test_socket_activation_serves_the_passed_sockets(
    pgtarn: Pgtarn, notifications: Notifications, short_dir: Path, workers: int
) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    unix_port = free_port()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(short_dir / f".s.PGSQL.{unix_port}"))
    unix.listen()
    # listen_port is taken, and unix_socket_dir would get a socket of its own: both ignored
    squatter = socket.create_server(("127.0.0.1", 0))
    own_dir = short_dir / "own"
    own_dir.mkdir()
    pgtarn.write_ini(
        listen_port=squatter.getsockname()[1], unix_socket_dir=own_dir, workers=workers
    )
    fds = [tcp.fileno(), unix.fileno()]
    env = dict(os.environ, TEST_FDS=",".join(str(fd) for fd in fds))
    proc = pgtarn.start([sys.executable, "-c", LISTEN_WRAPPER], pass_fds=fds, env=env)
    try:
        _fields, pid = notifications.until("READY")
        assert pid == proc.pid, pgtarn.log_text()
        tcp_port = tcp.getsockname()[1]
        # only pgtarn holds them now: a connection is served by it, not left in a queue here
        tcp.close()
        unix.close()
        assert _query(_tcp(tcp_port)) == 42
        assert _query(f"host={short_dir} port={unix_port}") == 42
        assert list(own_dir.iterdir()) == []
        assert "socket activation" in pgtarn.log_text()
    finally:
        squatter.close()
        tcp.close()
        unix.close()
