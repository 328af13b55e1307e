"""What /proc says about pgtarn's processes: a supervisor's workers, a process's clients."""

from __future__ import annotations

import os
import time


def children(pid: int) -> list[int]:
    """The live child processes of pid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return sorted(found)


def wait_children(
    pid: int, count: int, timeout: float = 15.0, exclude: tuple[int, ...] = ()
) -> list[int]:
    """pid's children once there are count of them (none of exclude)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [c for c in children(pid) if c not in exclude]
        if len(found) == count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_connections() -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, inode) of every TCP socket, from /proc/net/tcp*."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            rows.append(
                (
                    int(fields[1].rsplit(":", 1)[1], 16),
                    int(fields[2].rsplit(":", 1)[1], 16),
                    fields[3],
                    int(fields[9]),
                )
            )
    return rows


def tcp_clients(pid: int, port: int) -> int:
    """Established TCP connections that pid holds on local port (its clients there)."""
    inodes = _socket_inodes(pid)
    return sum(
        1
        for local, _remote, state, inode in _tcp_connections()
        if local == port and state == "01" and inode in inodes
    )


def holder_of(pids: list[int], port: int, client_port: int) -> int | None:
    """Which of pids holds the TCP connection from local client_port to port."""
    connections = {
        inode
        for local, remote, _state, inode in _tcp_connections()
        if local == port and remote == client_port
    }
    for pid in pids:
        if _socket_inodes(pid) & connections:
            return pid
    return None
