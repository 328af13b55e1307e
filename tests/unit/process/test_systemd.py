"""systemd.py: sd_notify datagrams to a real socket, and socket activation's descriptors."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgtarn.process import systemd


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound in a temp dir, named by NOTIFY_SOCKET (as systemd does)."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield sock


def test_ready_sends_ready_and_mainpid(notify_socket: socket.socket) -> None:
    assert systemd.ready()
    fields = _fields(notify_socket.recv(4096))
    assert fields == {"READY": "1", "MAINPID": str(os.getpid())}


def test_stopping(notify_socket: socket.socket) -> None:
    systemd.stopping()
    assert _fields(notify_socket.recv(4096)) == {"STOPPING": "1"}


def test_reloading_brackets_the_reload_with_monotonic_usec(notify_socket: socket.socket) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    with systemd.reloading():
        during = _fields(notify_socket.recv(4096))
        notify_socket.settimeout(0.1)
        with pytest.raises(TimeoutError):  # READY=1 only once the reload is done
            notify_socket.recv(4096)
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert during["RELOADING"] == "1"
    assert before <= int(during["MONOTONIC_USEC"]) <= after
    assert _fields(notify_socket.recv(4096))["READY"] == "1"


def test_reloading_says_ready_even_when_the_reload_raises(notify_socket: socket.socket) -> None:
    with pytest.raises(RuntimeError), systemd.reloading():
        raise RuntimeError("bad config")
    assert "RELOADING" in _fields(notify_socket.recv(4096))
    assert _fields(notify_socket.recv(4096))["READY"] == "1"


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"pgtarn-test-notify-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("STATUS=hello")
        assert sock.recv(4096) == b"STATUS=hello"


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not systemd.ready()
    with systemd.reloading():
        pass


def test_a_gone_notify_socket_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody"))
    assert not systemd.ready()


def test_child_environment_drops_notify_and_listen_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/x")
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("KEEP_ME", "1")
    env = systemd.child_environment()
    assert "NOTIFY_SOCKET" not in env and "LISTEN_FDS" not in env
    assert env["KEEP_ME"] == "1"
    assert os.environ["NOTIFY_SOCKET"] == "/run/x"  # the main process goes on notifying


@pytest.fixture
def clean_listen_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        monkeypatch.delenv(name, raising=False)


def _copy(fd: int) -> int | None:
    try:
        return os.dup(fd)
    except OSError:
        return None


def _at(fd: int, sock: socket.socket) -> socket.socket:
    """sock's descriptor duplicated onto fd, as systemd passes it (closed by the caller)."""
    os.dup2(sock.fileno(), fd)
    return socket.socket(fileno=fd)


@pytest.mark.usefixtures("clean_listen_env")
def test_listen_sockets_takes_ours_and_unsets_the_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "s"))
    unix.listen()
    # fds 3 and 4 may be the test runner's: keep copies, lend them, put them back
    saved = [_copy(3), _copy(4)]
    try:
        _at(3, tcp).detach()
        _at(4, unix).detach()
        monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
        monkeypatch.setenv("LISTEN_FDS", "2")
        monkeypatch.setenv("LISTEN_FDNAMES", "tcp:unix")
        taken = systemd.listen_sockets()
        assert [s.fileno() for s in taken] == [3, 4]
        assert taken[0].getsockname() == tcp.getsockname()
        assert taken[1].family == socket.AF_UNIX
        assert not any(os.get_inheritable(s.fileno()) for s in taken)
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            assert name not in os.environ
        for sock in taken:
            sock.detach()
    finally:
        for fd, copy in zip((3, 4), saved, strict=True):
            if copy is None:
                os.close(fd)
            else:
                os.dup2(copy, fd)
                os.close(copy)
        tcp.close()
        unix.close()


@pytest.mark.usefixtures("clean_listen_env")
def test_listen_sockets_for_another_pid_are_not_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "1")
    assert systemd.listen_sockets() == []
    assert "LISTEN_FDS" not in os.environ


@pytest.mark.usefixtures("clean_listen_env")
def test_no_socket_activation() -> None:
    assert systemd.listen_sockets() == []
