"""Idle-client memory test: open many SCRAM-authenticated idle clients, read the pooler's memory."""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from dataclasses import dataclass, field

from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.proto.framing import MessageScanner
from pgtarn.proto.msgtypes import ALL_TYPES, ERROR_RESPONSE, READY_FOR_QUERY
from pgtarn.proto.server_login import ServerAuth, server_error

LOGIN_TIMEOUT = 60.0


@dataclass(frozen=True)
class Login:
    """Where and as whom the idle clients log in."""

    host: str
    port: int
    user: str
    password: str
    dbname: str


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(
    login: Login, sql: str = "SELECT 1", tls: ssl.SSLContext | None = None
) -> Connection:
    """Log in (SCRAM or whatever the server asks for), run `sql` once, return the open stream.
    With `tls`, an SSLRequest first: the server must accept it (plain SCRAM over TLS then)."""
    reader, writer = await asyncio.open_connection(login.host, login.port)
    try:
        if tls is not None:
            writer.write(build.SSL_REQUEST)
            if await reader.readexactly(1) != b"S":
                raise ConnectionError("the server refused TLS")
            await writer.start_tls(tls)
        # channel binding off: the same login whichever pooler, as tls_logins.py's TLS variant
        state = ServerAuth(login.user, login.password, channel_binding="disable")
        params = {"user": login.user, "database": login.dbname, "application_name": "bench"}
        writer.write(build.startup_message(params))
        scanner = MessageScanner(ALL_TYPES)
        while True:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            for msg_type, body, _end in scanner.feed(data):
                if not state.done:
                    reply = state.feed(msg_type, body)  # raises on ErrorResponse
                    if reply:
                        writer.write(reply)
                    if state.done:
                        writer.write(build.query(sql))
                elif msg_type == ERROR_RESPONSE:
                    raise server_error(body, "query failed")
                elif msg_type == READY_FOR_QUERY:
                    return reader, writer
    except BaseException:
        writer.close()
        raise


async def _close(conns: list[Connection]) -> None:
    for _reader, writer in conns:
        writer.write(build.TERMINATE)
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _r, w in conns), return_exceptions=True)
    conns.clear()


def check_login(login: Login, timeout: float = 5.0) -> None:
    """Log in once and run SELECT 1; raises OSError/PgtarnError/TimeoutError on failure."""

    async def once() -> None:
        async with asyncio.timeout(timeout):
            conn = await connect(login)
        await _close([conn])

    asyncio.run(once())


def proc_status_kb(pid: int, key: str) -> int:
    """A `kB` value (VmRSS, VmHWM, ...) from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def proc_pss_kb(pid: int) -> int:
    """PSS of a process in kB: its private pages plus each shared page divided by the
    processes that share it (/proc/<pid>/smaps_rollup), what a worker really adds."""
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise KeyError(f"no Pss in /proc/{pid}/smaps_rollup")


def process_tree(pid: int) -> list[int]:
    """pid and its live children (a pgtarn supervisor's workers), children by pid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return [pid, *sorted(found)]


def tree_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, from /proc/<pid>/stat."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def tree_rss_kb(pids: list[int]) -> int:
    return sum(proc_status_kb(pid, "VmRSS") for pid in pids)


async def _settled_rss(pids: list[int], max_wait: float = 5.0) -> int:
    """Summed VmRSS once two reads half a second apart differ by < 256 kB (or after max_wait)."""
    deadline = time.monotonic() + max_wait
    last = tree_rss_kb(pids)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = tree_rss_kb(pids)
        if abs(now - last) < 256:
            return now
        last = now
    return last


@dataclass(frozen=True)
class ProcessMemory:
    """One process of a pooler: a single process, or a supervisor or one of its workers."""

    role: str
    pid: int
    rss_kb: int
    pss_kb: int


@dataclass
class MemoryResult:
    """Memory of one pooler (all its processes) with 1 warm client, then more idle clients."""

    baseline_kb: int = 0  # RSS, summed over the processes
    baseline_pss_kb: int = 0
    processes: list[ProcessMemory] = field(default_factory=list)  # with the one client
    rss_kb: dict[int, int] = field(default_factory=dict)  # clients -> summed VmRSS
    pss_kb: dict[int, int] = field(default_factory=dict)  # clients -> summed PSS
    open_fds: dict[int, int] = field(default_factory=dict)  # clients -> the pooler's open fds
    kb_per_client: dict[int, float] = field(default_factory=dict)
    open_seconds: dict[int, float] = field(default_factory=dict)
    cpu_seconds: dict[int, float] = field(default_factory=dict)  # the pooler's, while opening
    error: str = ""


def snapshot(pids: list[int]) -> list[ProcessMemory]:
    """RSS and PSS of each process; the first is the one started (a supervisor if more)."""
    roles = ["process"] if len(pids) == 1 else \
        ["supervisor", *(f"worker {n}" for n in range(1, len(pids)))]  # fmt: skip
    return [ProcessMemory(role, pid, proc_status_kb(pid, "VmRSS"), proc_pss_kb(pid))
            for role, pid in zip(roles, pids, strict=True)]  # fmt: skip


async def _all_started(pid: int, processes: int, max_wait: float = 15.0) -> list[int]:
    """The process tree once it has `processes` processes (a supervisor's workers started)."""
    deadline = time.monotonic() + max_wait
    while len(pids := process_tree(pid)) < processes and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return pids


async def _measure(login: Login, pid: int, levels: list[int], batch: int,
                   processes: int, tls: ssl.SSLContext | None) -> MemoryResult:  # fmt: skip
    result = MemoryResult()
    conns: list[Connection] = []
    gate = asyncio.Semaphore(batch)

    async def one() -> None:
        async with gate, asyncio.timeout(LOGIN_TIMEOUT):
            conns.append(await connect(login, tls=tls))

    try:
        pids = await _all_started(pid, processes)
        conns.append(await connect(login, tls=tls))  # the pool exists, a server is warm
        result.baseline_kb = await _settled_rss(pids)
        result.processes = snapshot(pids)
        result.baseline_pss_kb = sum(p.pss_kb for p in result.processes)
        for level in sorted(levels):
            started, cpu = time.monotonic(), tree_cpu_seconds(pids)
            tasks = [asyncio.ensure_future(one()) for _ in range(level - len(conns))]
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            result.cpu_seconds[level] = tree_cpu_seconds(pids) - cpu
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if failures:
                result.error = f"{len(failures)} of {len(tasks)} logins failed at {level}: " + (
                    f"{type(failures[0]).__name__}: {failures[0]}"
                )
                break
            result.open_seconds[level] = time.monotonic() - started
            rss = await _settled_rss(pids)
            result.rss_kb[level] = rss
            result.pss_kb[level] = sum(proc_pss_kb(p) for p in pids)
            result.kb_per_client[level] = (rss - result.baseline_kb) / max(level - 1, 1)
            result.open_fds[level] = sum(len(os.listdir(f"/proc/{p}/fd")) for p in pids)
            if result.open_fds[level] < level:  # sanity check: it really holds the clients
                result.error = f"{level} clients, but the pooler has {result.open_fds[level]} fds"
                break
    except (OSError, PgtarnError, TimeoutError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        await _close(conns)
    return result


def measure_memory(
    login: Login,
    pid: int,
    levels: list[int],
    batch: int = 200,
    processes: int = 1,
    tls: ssl.SSLContext | None = None,
) -> MemoryResult:
    """Connect idle clients up to each level in `levels` (totals); read the memory of `pid`
    and its children (`processes` in all: a supervisor and its workers) at each.

    KB per client is (RSS at level - RSS with one client) / (level - 1), RSS summed over the
    processes. Logins run `batch` at a time (over TLS with `tls`); every client sends one
    SELECT 1 and stays idle.
    """
    return asyncio.run(_measure(login, pid, levels, batch, processes, tls))
