"""LISTEN/NOTIFY fan-out: many listening clients through pgtarn against a backend per listener."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import struct
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memory import proc_status_kb
from run import (
    BENCH_DB,
    BENCH_USER,
    MAX_CONNECTIONS,
    Database,
    Pooler,
    add_postgres_options,
    cpu_seconds,
    ended,
    finish,
    fmt,
    log,
    make_workdir,
    markdown,
    postgres_account,
    prepare_process,
    write_json,
)
from storm import RawClient, ServerError, Target, log_summary, percentiles

import pgtarn
from pgtarn.proto.msgtypes import ERROR_RESPONSE, NOTIFICATION_RESPONSE, READY_FOR_QUERY

try:
    import asyncpg  # type: ignore[import-untyped]
except ImportError:  # only --client asyncpg needs it
    asyncpg = None
try:
    import uvloop
except ImportError:
    uvloop = None

CASES = ("direct", "pgtarn")
BURST_TIMEOUTS = 5  # a burst's NOTIFYs may take this many --timeout to commit
WARMUP_S = 15.0  # how long every listener may take to see its first notification
USAGE = """
examples:
  python3 bench/listen.py                          # 1,000 listeners, direct then pgtarn
  python3 bench/listen.py --listeners 200 --only direct
  python3 bench/listen.py --only pgtarn --pool-mode session --pool-size 250 --listeners 200

Latency: the notifier puts time.monotonic() in each payload just before it writes the NOTIFY
(an autocommitted simple Query, so the commit follows within that statement's round trip);
a listener's latency is its receive time minus that. "paced": one NOTIFY at a time, the next
after every listener of its channel has it. "burst": --notifies NOTIFYs written at once
(pipelined, one transaction each); its latencies include the queueing of the burst.
"""


# --------------------------------------------------------------------------- what arrives


@dataclass
class Phase:
    """One run of NOTIFYs: what the listeners must receive and what they did."""

    tag: bytes = b""
    count: int = 0  # deliveries of this phase's NOTIFYs
    latencies: list[float] = field(default_factory=list)
    last_at: float = 0.0


class Deliveries:
    """Counts what every listener receives for the phase in progress; wakes whoever waits."""

    def __init__(self) -> None:
        self.phase = Phase()
        self.stray = 0  # deliveries of an earlier phase (late warm-up notifications)
        self.target = 0
        self.reached: asyncio.Future[None] | None = None
        self.disconnected = 0

    def begin(self, tag: str, listeners: Sequence[Listener]) -> Phase:
        for listener in listeners:
            listener.received = 0
        self.phase = Phase(tag.encode("ascii"))
        return self.phase

    def record(self, listener: Listener, payload: bytes, now: float) -> None:
        """One NotificationResponse's payload (phase:seq:sent) received at `now`."""
        tag, _seq, sent = payload.split(b":")
        phase = self.phase
        if tag != phase.tag:
            self.stray += 1
            return
        listener.received += 1
        phase.latencies.append(now - float(sent))
        phase.count += 1
        phase.last_at = now
        if phase.count >= self.target and self.reached is not None and not self.reached.done():
            self.reached.set_result(None)

    async def wait_for(self, target: int, timeout: float) -> bool:
        """Whether the phase's deliveries reach `target` within `timeout` seconds."""
        self.target = target
        if self.phase.count >= target:
            return True
        self.reached = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self.reached
        except TimeoutError:
            return False
        finally:
            self.reached = None
        return True


class RawListener(RawClient):
    """A listening client on the wire protocol: login, LISTEN, then NotificationResponses."""

    def __init__(self, target: Target, keys: dict[tuple[bytes, int], tuple[bytes, bytes]],
                 sink: Deliveries, channel: str) -> None:  # fmt: skip
        super().__init__(target, keys, "bench-listen")
        self.sink = sink
        self.channel = channel
        self.received = 0
        self.now = 0.0
        self.closing = False

    async def start(self) -> None:
        await self.login()
        await self.query(f"LISTEN {self.channel}")

    def data_received(self, data: bytes) -> None:
        self.now = time.monotonic()  # one read, one receive time for what it holds
        super().data_received(data)

    def _handle(self, kind: int, body: bytes) -> None:
        if kind == NOTIFICATION_RESPONSE:  # process ID, channel\0, payload\0
            self.sink.record(self, body[body.index(0, 4) + 1 : -1], self.now)
        else:
            super()._handle(kind, body)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.sink.disconnected += 1
        super().connection_lost(exc)

    async def close(self) -> None:
        self.closing = True
        await super().close()


class AsyncpgListener:
    """A listening client through asyncpg's add_listener (its own parsing and callbacks)."""

    def __init__(self, target: Target, sink: Deliveries, channel: str) -> None:
        self.target = target
        self.sink = sink
        self.channel = channel
        self.received = 0
        self.conn: Any = None

    async def start(self) -> None:
        t = self.target
        self.conn = await asyncpg.connect(
            host=t.host, port=t.port, user=t.user, password=t.password, database=t.dbname,
            ssl=False, statement_cache_size=0,
            server_settings={"application_name": "bench-listen"},
        )  # fmt: skip
        self.conn.add_termination_listener(self._terminated)
        await self.conn.add_listener(self.channel, self._notified)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.sink.record(self, payload.encode("ascii"), time.monotonic())

    def _terminated(self, _conn: object) -> None:
        self.sink.disconnected += 1

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.remove_termination_listener(self._terminated)
            await self.conn.close(timeout=10)


Listener = RawListener | AsyncpgListener


class Notifier(RawClient):
    """The one connection that sends NOTIFYs, pipelined: one simple Query (transaction) each."""

    def __init__(self, target: Target, keys: dict[tuple[bytes, int], tuple[bytes, bytes]]):
        super().__init__(target, keys, "bench-notify")
        self.pending = 0  # ReadyForQuery still to come for the NOTIFYs sent
        self.error: ServerError | None = None

    def _handle(self, kind: int, body: bytes) -> None:
        if not self.pending:
            super()._handle(kind, body)
        elif kind == READY_FOR_QUERY:
            self.pending -= 1
            if not self.pending:
                self._finish(self.error)
        elif kind == ERROR_RESPONSE and self.error is None:
            self.error = ServerError({chr(part[0]): part[1:].decode("utf-8", "replace")
                                      for part in body.split(b"\0") if part})  # fmt: skip

    async def send(self, tag: str, first_seq: int, channels: Sequence[str]) -> None:
        """NOTIFY each channel in turn, stamped when written; return after the last commit."""
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.pending, self.error = len(channels), None
        write = self.transport.write
        for seq, channel in enumerate(channels, first_seq):
            sql = f"NOTIFY {channel}, '{tag}:{seq}:{time.monotonic()!r}'".encode("ascii")
            write(b"Q" + struct.pack("!I", len(sql) + 5) + sql + b"\0")
        await self.waiter


# --------------------------------------------------------------------------- one case


@dataclass
class Burst:
    """One burst of NOTIFYs: rates, latencies, losses, CPU seconds."""

    notifies_per_s: float = 0.0
    deliveries_per_s: float = 0.0
    delivered: int = 0
    expected: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)  # pgtarn / postgres / client
    wall_s: float = 0.0


@dataclass
class CaseResult:
    """Everything measured for one case (direct or pgtarn)."""

    case: str
    listeners: int
    channels: int
    listening: int = 0
    connect_s: float | None = None
    connect_errors: dict[str, int] = field(default_factory=dict)
    backends: dict[str, int] = field(default_factory=dict)  # application_name -> count, max
    backends_pss_kb: int | None = None  # PostgreSQL backends of database bench, summed
    pgtarn_rss_kb: int | None = None  # with every listener connected, after the warm-up
    pgtarn_peak_rss_kb: int | None = None  # VmHWM after the bursts
    paced_latency_ms: dict[str, float] = field(default_factory=dict)
    bursts: list[Burst] = field(default_factory=list)
    burst_latency_ms: dict[str, float] = field(default_factory=dict)  # all bursts pooled
    missing: int = 0  # deliveries that never arrived
    stray: int = 0
    disconnected: int = 0
    failure: str = ""
    log_lines: dict[str, int] = field(default_factory=dict)


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pss_kb(pid: int) -> int | None:
    """A process's proportional set size (shared pages split among their users)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def total_cpu_s(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # gone: its CPU seconds are lost (understates)
            total += cpu_seconds(pid)
    return total


def ms(latencies: list[float]) -> dict[str, float]:
    return {k: v * 1000 for k, v in percentiles(latencies).items()}


class Case:
    """One case: listeners and notifier against `target`, PostgreSQL watched through `db`."""

    def __init__(self, name: str, args: argparse.Namespace, db: Database, target: Target,
                 pgtarn_pid: int | None) -> None:  # fmt: skip
        self.args = args
        self.db = db
        self.target = target
        self.pgtarn_pid = pgtarn_pid
        self.result = CaseResult(name, args.listeners, args.channels)
        self.sink = Deliveries()
        self.keys: dict[tuple[bytes, int], tuple[bytes, bytes]] = {}
        self.channels = [f"bench_ch{i}" for i in range(args.channels)]
        self.listeners: list[Listener] = []
        self.backend_pids: list[int] = []
        self.burst_latencies: list[float] = []  # every burst's, pooled

    def listener(self, i: int) -> Listener:
        channel = self.channels[i % len(self.channels)]
        if self.args.client == "asyncpg":
            return AsyncpgListener(self.target, self.sink, channel)
        return RawListener(self.target, self.keys, self.sink, channel)

    async def backends(self) -> None:
        """Count the backends of database bench (kept: the most seen) and sum their PSS."""
        rows = await asyncio.to_thread(
            self.db.sql,
            f"SELECT pid, application_name FROM pg_stat_activity WHERE datname = '{BENCH_DB}'",
        )
        pids, names = [], Counter[str]()
        for line in rows.splitlines():
            if line.strip():
                pid, name = line.split("|", 1)
                pids.append(int(pid))
                names[name or "(none)"] += 1
        if sum(names.values()) >= sum(self.result.backends.values()):
            self.result.backends = dict(names)
        self.backend_pids = pids
        sizes = [pss_kb(pid) for pid in pids]
        if pids and None not in sizes:
            self.result.backends_pss_kb = sum(s for s in sizes if s is not None)

    async def connect(self) -> None:
        """Every listener logs in and LISTENs, --connect-batch at a time, within --timeout."""
        res, args = self.result, self.args
        warm = RawClient(self.target, self.keys, "bench-warm")  # PBKDF2 once, off the clock
        async with asyncio.timeout(args.timeout):
            await warm.login()
        await warm.close()
        self.listeners = [self.listener(i) for i in range(args.listeners)]
        gate = asyncio.Semaphore(args.connect_batch)

        async def start(listener: Listener) -> None:
            async with gate:
                await listener.start()

        started = time.monotonic()
        tasks = [asyncio.create_task(start(listener)) for listener in self.listeners]
        done, pending = await asyncio.wait(tasks, timeout=args.timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        errors = Counter(f"{type(e).__name__}: {e}" for t in done if (e := t.exception()))
        res.connect_errors = dict(errors.most_common(5))
        ok = [li for li, t in zip(self.listeners, tasks, strict=True)
              if t in done and not t.exception()]  # fmt: skip
        res.listening = len(ok)
        if pending:
            res.failure = (
                f"only {len(ok)} of {args.listeners} listeners had LISTEN answered "
                f"within {args.timeout:g} s ({len(pending)} waiting)"
            )
        elif errors:
            res.failure = f"{sum(errors.values())} listeners failed"
        else:
            res.connect_s = time.monotonic() - started

    async def warm_up(self, notifier: Notifier) -> None:
        """NOTIFY every channel until each listener has seen one (a pooler may LISTEN late)."""
        self.sink.begin("w", self.listeners)
        deadline = time.monotonic() + WARMUP_S
        seq = 0
        while time.monotonic() < deadline:
            await notifier.send("w", seq, self.channels)
            seq += len(self.channels)
            for _ in range(20):
                await asyncio.sleep(0.05)
                if all(li.received for li in self.listeners):
                    return
        deaf = sum(not li.received for li in self.listeners)
        raise RuntimeError(f"{deaf} listeners received no notification in {WARMUP_S:g} s")

    async def paced(self, notifier: Notifier, run: int) -> list[float]:
        phase = self.sink.begin(f"p{run}", self.listeners)
        on = Counter(li.channel for li in self.listeners)
        target = 0
        for seq in range(self.args.paced):
            channel = self.channels[seq % len(self.channels)]
            target += on[channel]
            await notifier.send(phase.tag.decode(), seq, [channel])
            if not await self.sink.wait_for(target, self.args.timeout):
                self.result.missing += target - phase.count
                raise RuntimeError(
                    f"paced NOTIFY {seq}: {target - phase.count} deliveries "
                    f"missing after {self.args.timeout:g} s"
                )
        return phase.latencies

    async def burst(self, notifier: Notifier, run: int) -> Burst:
        args = self.args
        phase = self.sink.begin(f"b{run}", self.listeners)
        on = Counter(li.channel for li in self.listeners)
        channels = [self.channels[i % len(self.channels)] for i in range(args.notifies)]
        burst = Burst(expected=sum(on[c] for c in channels))
        pid = self.pgtarn_pid
        cpu0 = (cpu_seconds(pid) if pid else 0.0, total_cpu_s(self.backend_pids),
                client_cpu_s())  # fmt: skip
        started = time.monotonic()
        async with asyncio.timeout(args.timeout * BURST_TIMEOUTS):
            await notifier.send(phase.tag.decode(), 0, channels)
        committed = time.monotonic()
        arrived = await self.sink.wait_for(burst.expected, args.timeout)
        burst.wall_s = (phase.last_at if arrived else time.monotonic()) - started
        burst.cpu_s = {"pgtarn": cpu_seconds(pid) - cpu0[0] if pid else 0.0,
                       "postgres": total_cpu_s(self.backend_pids) - cpu0[1],
                       "client": client_cpu_s() - cpu0[2]}  # fmt: skip
        burst.delivered = phase.count
        burst.notifies_per_s = args.notifies / (committed - started)
        burst.deliveries_per_s = phase.count / burst.wall_s
        burst.latency_ms = ms(phase.latencies)
        self.result.missing += burst.expected - phase.count
        self.burst_latencies.extend(phase.latencies)
        return burst

    async def run(self) -> CaseResult:
        res, args = self.result, self.args
        notifier = Notifier(self.target, self.keys)
        try:
            await self.connect()
            await self.backends()
            if self.pgtarn_pid:
                res.pgtarn_rss_kb = proc_status_kb(self.pgtarn_pid, "VmRSS")
            if res.failure:
                return res
            async with asyncio.timeout(args.timeout):
                await notifier.login()
            await self.warm_up(notifier)
            await asyncio.sleep(1.0)  # settle before reading memory
            if self.pgtarn_pid:
                res.pgtarn_rss_kb = proc_status_kb(self.pgtarn_pid, "VmRSS")
            await self.backends()
            paced: list[float] = []
            for run in range(1, args.runs + 1):
                paced += await self.paced(notifier, run)
                burst = await self.burst(notifier, run)
                res.bursts.append(burst)
                log(
                    f"{res.case}: run {run}/{args.runs}: {burst.notifies_per_s:,.0f} NOTIFY/s, "
                    f"{burst.deliveries_per_s:,.0f} deliveries/s, "
                    f"{burst.delivered:,}/{burst.expected:,} delivered"
                )
                if burst.delivered < burst.expected:
                    res.failure = (
                        f"burst {run}: {burst.expected - burst.delivered:,} "
                        f"deliveries missing after {args.timeout:g} s"
                    )
                    break
            res.paced_latency_ms = ms(paced)
            res.burst_latency_ms = ms(self.burst_latencies)
            await self.backends()
            if self.pgtarn_pid:
                res.pgtarn_peak_rss_kb = proc_status_kb(self.pgtarn_pid, "VmHWM")
        except (RuntimeError, OSError, ServerError, TimeoutError) as exc:
            res.failure = res.failure or f"{type(exc).__name__}: {exc}"
        finally:
            res.stray = self.sink.stray
            res.disconnected = self.sink.disconnected
            await asyncio.gather(notifier.close(), *(li.close() for li in self.listeners),
                                 return_exceptions=True)  # fmt: skip
        return res


def run_case(name: str, args: argparse.Namespace, db: Database, target: Target,
             pgtarn_pid: int | None) -> CaseResult:  # fmt: skip
    runner: Any = uvloop.run if uvloop is not None and not args.no_uvloop else asyncio.run
    return runner(Case(name, args, db, target, pgtarn_pid).run())


def wait_backends_gone(db: Database, timeout: float = 30.0) -> None:
    """Let the previous case's backends exit, so the next case counts only its own."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = db.sql(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{BENCH_DB}'")
        if int(left.strip()) == 0:
            return
        time.sleep(0.2)
    log(f"warning: backends of {BENCH_DB} still there after {timeout:g} s")


# --------------------------------------------------------------------------- report


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    text = f"{statistics.median(values):,.0f}"
    return text + (f" ({min(values):,.0f}-{max(values):,.0f})" if len(values) > 1 else "")


def latency(percent: dict[str, float]) -> str:
    return "/".join(fmt(percent.get(k), ".1f") for k in ("p50", "p99", "max"))


def burst_cpu(r: CaseResult, key: str) -> str:
    return fmt(statistics.median([b.cpu_s[key] for b in r.bursts]) if r.bursts else None, ".2f")


def table(results: list[CaseResult]) -> str:
    header = ["case", "listening", "connect s", "PG backends", "pgtarn RSS MB listening/peak",
              "backends PSS MB", "paced latency ms p50/p99/max", "NOTIFY/s", "deliveries/s",
              "burst latency ms p50/p99/max", "burst CPU s pgtarn/PG/client", "lost"]  # fmt: skip
    rows = []
    for r in results:
        rss = "/".join(fmt(kb / 1024 if kb else None, ".1f")
                       for kb in (r.pgtarn_rss_kb, r.pgtarn_peak_rss_kb))  # fmt: skip
        rows.append([
            r.case, f"{r.listening:,}/{r.listeners:,}", fmt(r.connect_s, ".1f"),
            f"{sum(r.backends.values()):,}",
            rss, fmt(r.backends_pss_kb / 1024 if r.backends_pss_kb else None, ".1f"),
            latency(r.paced_latency_ms), spread([b.notifies_per_s for b in r.bursts]),
            spread([b.deliveries_per_s for b in r.bursts]), latency(r.burst_latency_ms),
            "/".join(burst_cpu(r, k) for k in ("pgtarn", "postgres", "client")),
            f"{r.missing:,}" + (f", {r.disconnected} dropped" if r.disconnected else ""),
        ])  # fmt: skip
    return markdown(header, rows)


def report(args: argparse.Namespace, versions: dict[str, str], results: list[CaseResult],
           notes: list[str]) -> None:  # fmt: skip
    per = args.listeners // args.channels
    loop = "asyncio" if uvloop is None or args.no_uvloop else "uvloop"
    print(
        f"\n## LISTEN/NOTIFY: {args.listeners:,} listeners on {args.channels} channels "
        f"(~{per:,} per NOTIFY), {args.runs} run(s) of {args.paced} paced + "
        f"{args.notifies:,} burst NOTIFYs; client {args.client} ({loop}, one process); "
        f"pgtarn {args.pool_mode} mode, default_pool_size {args.pool_size}, SCRAM; "
        f"{os.cpu_count()} CPUs"
    )
    print(", ".join(f"{k} {v}" for k, v in versions.items()) + "\n")
    print(table(results))
    print(
        "\nlatency: receive time - time.monotonic() in the payload, written just before the "
        "NOTIFY; paced and burst latencies pooled over the runs. NOTIFY/s: burst NOTIFYs / "
        "time to the last one's ReadyForQuery; deliveries/s: notifications received / time "
        "to the last one; median (min-max) over runs. PG backends: most backends of database "
        "bench seen in pg_stat_activity while listening. backends PSS: their proportional "
        "set size, summed. burst CPU s: user+system during one burst (median), of pgtarn, "
        "of those backends and of this process (listeners + notifier). lost: deliveries "
        "that never arrived."
    )
    for r in results:
        if r.backends:
            print(
                f"- {r.case}: backends by application_name: "
                + ", ".join(f"{k} {v:,}" for k, v in sorted(r.backends.items()))
            )
        for error, n in r.connect_errors.items():
            print(f"- {r.case}: {n:,} x listener error `{error}`")
        if r.stray:
            print(f"- {r.case}: {r.stray:,} late warm-up notifications ignored")
        for line, n in r.log_lines.items():
            print(f"- {r.case} log: {n:,} x {line}")
        if r.failure:
            print(f"- {r.case}: FAILED: {r.failure}")
        busy = [b for b in r.bursts if b.cpu_s["client"] > 0.8 * b.wall_s]
        if busy:
            notes.append(
                f"{r.case}: this process was busy >80% of {len(busy)} burst(s): the "
                "listeners' side may be the bottleneck"
            )
    for note in notes:
        print(f"note: {note}")
    write_json(args, versions, results=[asdict(r) for r in results])


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--listeners", type=int, default=1000, metavar="N", help="listening clients (1000)"
    )
    p.add_argument(
        "--channels",
        type=int,
        default=10,
        metavar="N",
        help="channels; listener i listens on channel i %% N (10)",
    )
    p.add_argument(
        "--notifies",
        type=int,
        default=1000,
        metavar="N",
        help="NOTIFYs per burst, round-robin over the channels (1000)",
    )
    p.add_argument(
        "--paced",
        type=int,
        default=100,
        metavar="N",
        help="NOTIFYs one at a time per run, for the unloaded latency (100)",
    )
    p.add_argument("--runs", type=int, default=3, metavar="N", help="paced + burst runs (3)")
    p.add_argument("--only", choices=CASES, help="run one case (default: both)")
    p.add_argument(
        "--client",
        choices=("raw", "asyncpg"),
        default="raw",
        help="listeners on a minimal wire-protocol client, or asyncpg's add_listener (raw)",
    )
    p.add_argument(
        "--pool-size", type=int, default=5, metavar="N", help="pgtarn's default_pool_size (5)"
    )
    p.add_argument(
        "--pool-mode",
        choices=("transaction", "session"),
        default="transaction",
        help="pgtarn's pool_mode (transaction)",
    )
    p.add_argument(
        "--listen-queue-size",
        type=int,
        metavar="N",
        help="pgtarn's listen_queue_size (default: pgtarn's)",
    )
    p.add_argument(
        "--connect-batch",
        type=int,
        default=100,
        metavar="N",
        help="listeners logging in at once (100)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="for all listeners to LISTEN, for each paced NOTIFY's deliveries, "
        f"for a burst's deliveries after its last commit; {BURST_TIMEOUTS} x S "
        "for a burst's NOTIFYs to commit (60)",
    )
    p.add_argument("--no-uvloop", action="store_true", help="asyncio's own event loop")
    p.add_argument("--json", metavar="PATH", help="also write all raw numbers as JSON to PATH")
    add_postgres_options(p)
    args = p.parse_args(argv)  # fmt: skip
    if min(args.listeners, args.channels, args.notifies, args.runs, args.connect_batch) < 1:
        p.error("--listeners, --channels, --notifies, --runs, --connect-batch: at least 1")
    if args.client == "asyncpg" and asyncpg is None:
        p.error("--client asyncpg: asyncpg is not installed")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes = prepare_process(args.listeners + 200, f"{args.listeners} listeners")
    cases = [args.only] if args.only else list(CASES)
    account = postgres_account()
    workdir = make_workdir("listen", account)
    # the direct case needs a backend per listener, plus the notifier and psql
    need = args.listeners + 20 if "direct" in cases else args.pool_size + 20
    db = Database(argparse.Namespace(**{**vars(args), "clients": [need]}))
    pooler: Pooler | None = None
    results: list[CaseResult] = []
    try:
        db.setup(scale=None, max_connections=max(MAX_CONNECTIONS, need + 30))
        versions = {"postgres": db.version, "pgtarn": pgtarn.__version__}
        if args.client == "asyncpg":
            versions["asyncpg"] = asyncpg.__version__
        for name in cases:
            if name == "direct":
                target = Target(db.host, db.port, BENCH_USER, db.password, BENCH_DB)
                log(f"direct: {args.listeners:,} listeners ...")
                result = run_case(name, args, db, target, None)
            else:
                settings: dict[str, object] = {
                    "default_pool_size": args.pool_size, "pool_mode": args.pool_mode,
                    "max_client_conn": max(10000, args.listeners + 100),
                }  # fmt: skip
                if args.listen_queue_size is not None:
                    settings["listen_queue_size"] = args.listen_queue_size
                pooler = Pooler("pgtarn", [sys.executable, "-m", "pgtarn"], workdir, db, None,
                                settings=settings, secret=db.scram_verifier())  # fmt: skip
                pooler.start()
                target = Target("127.0.0.1", pooler.port, BENCH_USER, db.password, BENCH_DB)
                log(f"pgtarn: {args.listeners:,} listeners ...")
                try:
                    result = run_case(name, args, db, target, pooler.pid)
                finally:
                    pooler.stop()
                result.log_lines = log_summary(pooler.log_path)
            results.append(result)
            if result.failure:
                log(f"{name}: FAILED: {result.failure}")
            wait_backends_gone(db)
        report(args, versions, results, notes)
        return 1 if any(r.failure or r.missing for r in results) else 0
    except (RuntimeError, KeyboardInterrupt) as exc:  # includes ClusterError: setup failed
        return ended(exc)
    finally:
        finish([pooler], db, workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
