"""The command line: flags, config errors, daemon mode, listeners, reload and the demo."""

from __future__ import annotations

import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pgtarn import __version__
from tests.support import TempCluster, free_port, ipv6_loopback_works

from .conftest import PgtarnFactory
from .drivers import connect, scalar
from .test_admin import admin


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtarn", *args], capture_output=True, text=True, timeout=timeout
    )


def test_version_and_help(pgtarn_factory: PgtarnFactory) -> None:
    # scripts compare --version's first line with the admin console's SHOW VERSION
    proc = pgtarn_factory()
    with admin(proc) as console:
        shown = scalar(console.execute("SHOW VERSION"))
    assert shown.startswith("PgBouncer 1.") and f"pgtarn {__version__}" in shown
    assert run_cli("--version").stdout.splitlines()[0] == shown
    assert run_cli("-V").stdout.splitlines()[0] == shown
    helptext = run_cli("--help").stdout
    for flag in ("--quiet", "--verbose", "--version", "--daemon", "demo"):
        assert flag in helptext
    assert run_cli().returncode == 2


def test_version_on_a_terminal_names_pgtarn_first() -> None:
    """A person reads pgtarn's own line first; piped (scripts, PgBouncer's test of --version
    against SHOW VERSION) the first line stays PgBouncer's, and both carry the other line."""
    primary, secondary = os.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "pgtarn", "--version"], stdout=secondary, stderr=subprocess.DEVNULL
    ) as proc:
        os.close(secondary)
        shown = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: pgtarn has exited and closed its end
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(timeout=30) == 0
    os.close(primary)
    on_terminal = shown.decode().splitlines()
    piped = run_cli("--version").stdout.splitlines()
    assert on_terminal[0].startswith(f"pgtarn {__version__} (")
    assert on_terminal[0].endswith(", compatible with PgBouncer 1.25.2")
    assert piped[0].startswith("PgBouncer 1.25.2 (pgtarn ")
    assert sorted(on_terminal) == sorted(piped)


def test_invalid_config_stops_startup_naming_file_line_and_key(tmp_path: Path) -> None:
    ini = tmp_path / "bad.ini"
    ini.write_text("[pgbouncer]\nlisten_port = 6432\npool_mode = sometimes\n")
    result = run_cli(str(ini))
    assert result.returncode == 1
    assert re.search(r"bad\.ini:3.*pool_mode", result.stderr), result.stderr
    ini.write_text("[pgbouncer]\nlisten_port = 6432\n[nonsense]\n")
    result = run_cli(str(ini))
    assert result.returncode == 1 and "bad.ini:3" in result.stderr
    assert run_cli(str(tmp_path / "missing.ini")).returncode == 1


def test_unknown_key_is_a_warning(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"no_such_setting": "1"})
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert "no_such_setting" in proc.log_text()


def test_daemon_writes_pidfile(pg_cluster: TempCluster, tmp_path: Path) -> None:
    port = free_port()
    pidfile = tmp_path / "pgtarn.pid"
    (tmp_path / "userlist.txt").write_text('"app" "app_pass"\n')
    ini = tmp_path / "d.ini"
    ini.write_text(
        f"[databases]\napp = host=127.0.0.1 port={pg_cluster.port}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"unix_socket_dir =\nauth_file = {tmp_path}/userlist.txt\n"
        f"auth_type = scram-sha-256\npidfile = {pidfile}\nlogfile = {tmp_path}/log\n"
    )
    result = run_cli("-d", str(ini))
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 15
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    try:
        with psycopg.connect(
            f"host=127.0.0.1 port={port} dbname=app user=app password=app_pass", autocommit=True
        ) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        os.kill(pid, signal.SIGTERM)
    while pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pidfile.exists()


def test_listen_on_all_addresses_and_ipv6(pgtarn_factory: PgtarnFactory) -> None:
    addr = "*" if ipv6_loopback_works() else "0.0.0.0"
    proc = pgtarn_factory(settings={"listen_addr": addr})
    hosts = ["127.0.0.1"] + (["::1"] if ipv6_loopback_works() else [])
    for host in hosts:
        with psycopg.connect(
            f"host={host} port={proc.port} dbname=app user=app password=app_pass", autocommit=True
        ) as conn:
            assert conn.execute("select 1").fetchone() == (1,)


@pytest.mark.skipif(not ipv6_loopback_works(), reason="no IPv6 loopback")
def test_listen_addr_comma_list_with_ipv6(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"listen_addr": "127.0.0.1, ::1"})
    for host in ("127.0.0.1", "::1"):  # pgtarn serves on each address of the list ...
        with psycopg.connect(
            f"host={host} port={proc.port} dbname=app user=app password=app_pass", autocommit=True
        ) as conn:
            assert conn.info.hostaddr == host
            assert conn.execute("select 1").fetchone() == (1,)
    # ... and on those only: another loopback address is not listened on
    with socket.socket(socket.AF_INET) as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.2", proc.port))


def test_sighup_reload_applies_pool_mode_and_keeps_clients(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"pool_mode": "transaction"})
    with connect(proc, autocommit=True) as kept:
        assert kept.execute("select 1").fetchone() == (1,)
        text = Path(proc.ini_path).read_text()
        Path(proc.ini_path).write_text(
            text.replace("pool_mode = transaction", "pool_mode = statement")
        )
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "configuration reloaded" not in proc.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "configuration reloaded" in proc.log_text()
        assert kept.execute("select 2").fetchone() == (2,)  # not dropped
        with connect(proc, autocommit=True) as fresh:
            with pytest.raises(psycopg.OperationalError, match="statement pooling mode"):
                fresh.execute("begin")
        # an invalid file is reported and the old config kept
        Path(proc.ini_path).write_text(text.replace("pool_mode = transaction", "pool_mode = bogus"))
        proc.send_signal(signal.SIGHUP)
        while "reload failed" not in proc.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "reload failed" in proc.log_text()
        assert kept.execute("select 3").fetchone() == (3,)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("started_as", ["foreground", "background job"])
def test_demo_prints_working_psql_and_admin_console_commands(started_as: str) -> None:
    # a shell's background job starts with SIGINT ignored, and the demo inherits that
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtarn", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint if started_as == "background job" else None,
    )
    assert proc.stdout is not None
    lines = []
    commands = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r'^\s+psql "(.+)"$', line)
            if match:
                commands.append(match.group(1))
            if line.startswith("Press Ctrl-C"):
                break
        assert len(commands) == 2, "".join(lines)
        command, console = commands  # as printed: the database, then the admin console
        out = subprocess.run(
            ["psql", command, "-XAtc", "select current_user, 40 + 2"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.stdout.strip() == "demo|42", out.stderr
        out = subprocess.run(
            ["psql", console, "-XAtc", "SHOW POOLS"], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        assert [
            row.split("|")[:2] for row in out.stdout.splitlines() if row.startswith("demo|")
        ] == [["demo", "demo"]], out.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()  # not communicate(): it would skip readline's buffer
        proc.stdout.close()
        proc.wait(timeout=60)
    assert proc.returncode == 0, rest
    workdir = re.search(r"Files .* are in (\S+?)\.?$", "".join(lines) + rest, re.M)
    assert workdir is not None, rest
    assert not Path(workdir.group(1)).exists()


def _uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(row for row in status if row.startswith("Uid:"))
    return int(line.split()[2])  # the effective uid


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user")
@pytest.mark.parametrize("workers", [1, 2])
def test_user_setting_gives_up_root_once_listening(
    pgtarn_factory: PgtarnFactory, workers: int
) -> None:
    target = pwd.getpwnam("postgres")
    proc = pgtarn_factory(settings={"user": "postgres", "workers": workers})
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    processes = workers + (1 if workers > 1 else 0)
    deadline = time.monotonic() + 20  # (a worker may still be starting: it says when done)
    while proc.log_text().count("running as postgres") < processes:
        assert time.monotonic() < deadline, proc.log_text()
        time.sleep(0.05)
    pids = [proc.proc.pid] + [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-P", str(proc.proc.pid)], capture_output=True, text=True
        ).stdout.split()
    ]
    assert len(pids) == processes
    assert {_uid_of(pid) for pid in pids} == {target.pw_uid}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user")
def test_a_stop_right_after_start_reaches_workers_still_root(pgtarn_factory: PgtarnFactory) -> None:
    """The supervisor gives up root before its workers do: a SIGTERM it passes on to a worker
    still starting is refused for a moment, and sent again until taken."""
    proc = pgtarn_factory(settings={"user": "postgres", "workers": 2})
    assert proc.stop(timeout=20) == 0  # (no Traceback in the logs: the fixture checks)
    assert "refuses" not in proc.log_text()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stop_sent_once_the_port_accepts_waits_for_the_handler(
    pgtarn_factory: PgtarnFactory, tmp_path: Path, workers: int
) -> None:
    """The port accepts (a start looks done) before the signal handlers are in place; a
    SIGTERM sent then is held for them, not the default action that kills the process. The
    pidfile, written in between, is a FIFO here: pgtarn waits in it until the test reads."""
    fifo = tmp_path / "pgtarn.pid"
    os.mkfifo(fifo)
    proc = pgtarn_factory(settings={"pidfile": fifo, "workers": workers})
    proc.send_signal(signal.SIGTERM)  # pgtarn waits in open(pidfile): no handler yet
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets it go on
    try:
        assert proc.proc.wait(timeout=30) == 0, proc.log_text()
        assert os.read(reader, 64).decode().strip() == str(proc.proc.pid)
    finally:
        os.close(reader)
    assert "SIGTERM" in proc.log_text()


def test_so_reuseport_lets_two_pgtarns_share_a_port(pgtarn_factory: PgtarnFactory) -> None:
    """PgBouncer's recipe for several processes: each binds the port with SO_REUSEPORT."""
    first = pgtarn_factory(settings={"so_reuseport": 1})
    second = pgtarn_factory(settings={"so_reuseport": 1, "listen_port": first.port})
    deadline = time.monotonic() + 20  # (the port answered already: the first one listens)
    while f"listening on ('127.0.0.1', {first.port})" not in second.log_text():
        assert time.monotonic() < deadline, second.log_text()
        time.sleep(0.05)
    for _ in range(30):  # the kernel spreads new connections over both
        with connect(first, autocommit=True) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    served = "closing because: client close request"
    assert served in first.log_text() and served in second.log_text()
    assert first.stop() == 0
    with connect(second, autocommit=True) as conn:  # the other one serves the port alone
        assert conn.execute("select 1").fetchone() == (1,)


def test_small_socket_buffers_carry_large_copies_both_ways(pgtarn_factory: PgtarnFactory) -> None:
    """tcp_socket_buffer = 4096 on the listening sockets (accepted ones inherit it) and on
    server connections before they connect: megabytes still flow each way."""
    proc = pgtarn_factory(settings={"tcp_socket_buffer": 4096})
    rows = 200_000
    with connect(proc, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE big (n int, pad text)")
        with conn.cursor().copy("COPY big FROM STDIN") as copy:
            for n in range(rows):
                copy.write_row((n, "x" * 40))
        received = 0
        with conn.cursor().copy("COPY big TO STDOUT") as copy:
            for block in copy:
                received += len(block)
        assert received > rows * 40
        assert conn.execute("SELECT count(*) FROM big").fetchone() == (rows,)
