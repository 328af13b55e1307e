"""Soak test: pgbench through pgtarn for a long time, with connection churn; is its RSS flat?

pgbench (--clients, default 50; the TPC-B-like default script, or -S with --select-only)
runs for --duration seconds (600) against pgtarn in transaction mode (pool_size 20, SCRAM
logins with the server's verifier in auth_file). Every --interval seconds (10) pgtarn's
VmRSS, CPU time and open file descriptors are sampled. Every --churn-every seconds (30,
first at half of it) a churn round runs: --churn-conns (200) short-lived psycopg connections
(50 at a time) each log in, run a few statements with prepare=True (named prepared
statements from a fixed set of texts) and close; then a short `pgbench -S -M prepared`
(10 clients x 200 transactions) runs. So logins, client teardown and the prepared-statement
caches are exercised all along.

Reported: TPS and latency per interval (pgbench -P), RSS at the start, at the end of the
warm-up (--warmup, default 60 s, or a third of a shorter run), at the end and the max; the
least-squares slope over the post-warm-up samples in MB per 10 minutes; pgtarn's CPU; churn
rounds and errors; and a verdict: "RSS flat" when the growth after warm-up (the larger of
end minus warm-up RSS and slope x time) is under max(--threshold-mb, --threshold-pct % of
the warm-up RSS), else "RSS grows".

    python3 bench/soak.py                         # 10 minutes
    python3 bench/soak.py --duration 60           # a quick check
    python3 bench/soak.py --select-only --clients 100 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from memory import proc_status_kb
from run import (
    BENCH_DB,
    BENCH_USER,
    SCALE,
    Database,
    Pooler,
    add_postgres_options,
    clean_env,
    cpu_seconds,
    ended,
    fmt,
    log,
    make_workdir,
    markdown,
    parse_pgbench,
    prepare_process,
    remove_workdir,
    version_of,
    write_json,
)
from storm import log_summary

import pgtarn

PROGRESS = re.compile(r"^progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms"
                      r"(?: stddev [\d.na]+)?(?:, (\d+) failed)?")  # fmt: skip
STATEMENTS = [f"select abalance from pgbench_accounts where aid = %s /* soak {i} */"
              for i in range(20)]  # fmt: skip
CHURN_CONCURRENCY = 50
BURST = ("-S", "-M", "prepared", "-c", "10", "-j", "2", "-t", "200")


@dataclass
class Sample:
    """pgtarn's state at one moment (t: seconds since the load started)."""

    t: float
    rss_kb: int
    cpu_s: float
    fds: int


@dataclass
class Progress:
    """One pgbench -P line."""

    t: float
    tps: float
    lat_ms: float
    failed: int


@dataclass
class Churn:
    """One churn round."""

    t: float
    seconds: float = 0.0
    connections_ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    burst_tps: float | None = None
    burst_error: str = ""


@dataclass
class SoakResult:
    """Everything measured."""

    samples: list[Sample] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    churns: list[Churn] = field(default_factory=list)
    pgbench: dict[str, float] = field(default_factory=dict)
    pgbench_exit: int | None = None
    pgbench_errors: list[str] = field(default_factory=list)
    pooler_alive: bool = True
    log_lines: dict[str, int] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


class Children:
    """Every subprocess we start, so that all of them can be ended on any exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen[str]] = []
        self.closed = False

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        with self.lock:
            if self.closed:
                raise RuntimeError("shutting down: no new processes")
            proc = subprocess.Popen(cmd, text=True, **kwargs)
            self.procs.append(proc)
            return proc

    def stop_all(self) -> None:
        with self.lock:
            self.closed = True
            procs = list(self.procs)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --------------------------------------------------------------------------- load


def pgbench_cmd(db: Database, port: int, *args: str) -> list[str]:
    return [db.tool("pgbench"), "-n", *args, "-h", "127.0.0.1", "-p", str(port),
            "-U", BENCH_USER, BENCH_DB]  # fmt: skip


async def churn_connections(dsn: str, count: int, round_no: int) -> tuple[int, Counter[str]]:
    """`count` short-lived psycopg connections, each running a few prepared statements."""
    import psycopg

    gate = asyncio.Semaphore(CHURN_CONCURRENCY)
    errors: Counter[str] = Counter()
    ok = 0

    async def one(i: int) -> None:
        nonlocal ok
        async with gate:
            try:
                async with asyncio.timeout(60):
                    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                    try:
                        for k in range(3):  # three of the fixed texts, each run twice
                            sql = STATEMENTS[(i * 3 + k + round_no) % len(STATEMENTS)]
                            for aid in (i + 1, i + 1001):
                                cur = await conn.execute(sql, (aid,), prepare=True)
                                await cur.fetchall()
                    finally:
                        await conn.close()
                ok += 1
            except Exception as exc:  # every failure is a result here
                sqlstate = getattr(getattr(exc, "diag", None), "sqlstate", None)
                errors[f"{type(exc).__name__}: {sqlstate or ''} {str(exc).strip()[:160]}"] += 1

    await asyncio.gather(*(one(i) for i in range(count)))
    return ok, errors


def churn_round(db: Database, port: int, count: int, t: float, round_no: int,
                children: Children) -> Churn:  # fmt: skip
    result = Churn(t=t)
    started = time.monotonic()
    dsn = (f"host=127.0.0.1 port={port} user={BENCH_USER} dbname={BENCH_DB} "
           f"password={db.password} sslmode=disable gssencmode=disable "
           "application_name=soak-churn")  # fmt: skip
    ok, errors = asyncio.run(churn_connections(dsn, count, round_no))
    result.connections_ok, result.errors = ok, dict(errors)
    proc = children.popen(
        pgbench_cmd(db, port, *BURST),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=clean_env(PGPASSWORD=db.password),
    )
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        result.burst_error = "timed out"
    nums = parse_pgbench(out)
    result.burst_tps = nums.get("tps")
    if proc.returncode or nums.get("failed"):
        problems = [ln for ln in out.splitlines() if "error" in ln.lower() or "abort" in ln]
        result.burst_error = result.burst_error or (
            f"exit {proc.returncode}: " + (problems[0] if problems else out.strip()[-200:])
        )
    result.seconds = time.monotonic() - started
    return result


def churner(args: argparse.Namespace, db: Database, port: int, start: float,
            stop: threading.Event, children: Children, out: list[Churn]) -> None:  # fmt: skip
    """Churn rounds at every/2, every/2 + every, ... while at least 10 s of the run remain."""
    round_no = 0
    while True:
        due = start + args.churn_every / 2 + round_no * args.churn_every
        if due + 10 > start + args.duration or stop.wait(max(0.0, due - time.monotonic())):
            return
        try:
            out.append(churn_round(db, port, args.churn_conns, due - start, round_no, children))
        except Exception as exc:  # keep soaking; the report shows it
            out.append(Churn(t=due - start, burst_error=f"round failed: {exc!r}"))
        round_no += 1


def read_lines(stream: Any, sink: list[str], progress: list[Progress]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        m = PROGRESS.match(line)
        if m:
            progress.append(Progress(float(m.group(1)), float(m.group(2)), float(m.group(3)),
                                     int(m.group(4) or 0)))  # fmt: skip
        else:
            sink.append(line)


def sample(pid: int, t: float) -> Sample:
    return Sample(t, proc_status_kb(pid, "VmRSS"), cpu_seconds(pid),
                  len(os.listdir(f"/proc/{pid}/fd")))  # fmt: skip


def soak(args: argparse.Namespace, db: Database, pooler: Pooler, children: Children,
         result: SoakResult) -> None:  # fmt: skip
    pid = pooler.pid
    script = ("-S",) if args.select_only else ()
    cmd = pgbench_cmd(db, pooler.port, *script, "-c", str(args.clients), "-j", "2",
                      "-T", str(args.duration), "-P", str(args.interval))  # fmt: skip
    log(f"soak: {' '.join(cmd[1:])} ({args.duration} s) ...")
    result.samples.append(sample(pid, 0.0))
    start = time.monotonic()
    bench = children.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=clean_env(PGPASSWORD=db.password))  # fmt: skip
    out_lines: list[str] = []
    err_lines: list[str] = []
    readers = [
        threading.Thread(target=read_lines, args=(s, sink, result.progress), daemon=True)
        for s, sink in ((bench.stdout, out_lines), (bench.stderr, err_lines))
    ]
    stop = threading.Event()
    churn = threading.Thread(target=churner, daemon=True, args=(
        args, db, pooler.port, start, stop, children, result.churns))  # fmt: skip
    for thread in (*readers, churn):
        thread.start()
    try:
        k = 1
        while bench.poll() is None:
            due = start + k * args.interval
            time.sleep(max(0.0, min(due - time.monotonic(), 1.0)))
            if pooler.proc is not None and pooler.proc.poll() is not None:
                result.pooler_alive = False
                log("pgtarn died")
                break
            if time.monotonic() >= due:
                result.samples.append(sample(pid, due - start))
                s = result.samples[-1]
                log(f"  {s.t:5.0f} s  RSS {s.rss_kb / 1024:6.1f} MB  CPU {s.cpu_s:7.1f} s  "
                    f"fds {s.fds}")  # fmt: skip
                k += 1
        stop.set()
        churn.join()
        bench.wait(60)
    finally:
        stop.set()
    for thread in readers:
        thread.join(10)
    result.pgbench_exit = bench.returncode
    text = "\n".join(out_lines + err_lines)
    result.pgbench = parse_pgbench(text)
    result.pgbench_errors = [ln for ln in err_lines if "error" in ln.lower() or "abort" in ln]
    if result.pooler_alive and pooler.proc is not None and pooler.proc.poll() is None:
        time.sleep(2.0)  # let the last clients' teardown finish
        result.samples.append(sample(pid, time.monotonic() - start))
    else:
        result.pooler_alive = False


# --------------------------------------------------------------------------- analysis


def slope_per_s(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def summarize(args: argparse.Namespace, r: SoakResult) -> dict[str, Any]:
    mb = [(s.t, s.rss_kb / 1024) for s in r.samples]
    if not mb:
        return {"verdict": "no samples"}
    loaded = [p for p in mb if p[0] <= args.duration + 0.5]  # not the sample after the end
    warm = next((p for p in loaded if p[0] >= args.warmup), loaded[-1])
    post = [p for p in loaded if p[0] >= warm[0]]
    slope = slope_per_s(post)
    end = loaded[-1]
    span = end[0] - warm[0]
    fitted = slope * span if slope is not None else 0.0
    growth = max(end[1] - warm[1], fitted)
    threshold = max(args.threshold_mb, warm[1] * args.threshold_pct / 100)
    churn_errors = sum(sum(c.errors.values()) + bool(c.burst_error) for c in r.churns)
    failed = int(r.pgbench.get("failed", 0)) + len(r.pgbench_errors)
    verdict = "RSS flat" if growth < threshold else "RSS grows"
    return {
        "rss_start_mb": mb[0][1], "rss_warm_mb": warm[1], "warm_t": warm[0],
        "rss_end_mb": end[1], "end_t": end[0], "rss_after_mb": mb[-1][1],
        "rss_max_mb": max(y for _, y in mb),
        "slope_mb_per_10min": slope * 600 if slope is not None else None,
        "growth_mb": growth, "threshold_mb": threshold, "post_warmup_samples": len(post),
        "cpu_s": r.samples[-1].cpu_s - r.samples[0].cpu_s,
        "fds_start": r.samples[0].fds, "fds_max": max(s.fds for s in r.samples),
        "fds_after": r.samples[-1].fds,
        "tps": r.pgbench.get("tps"), "transactions": r.pgbench.get("transactions"),
        "pgbench_failed": failed, "pgbench_exit": r.pgbench_exit,
        "churn_rounds": len(r.churns), "churn_errors": churn_errors,
        "verdict": verdict if r.pooler_alive else "pgtarn DIED",
    }  # fmt: skip


# --------------------------------------------------------------------------- report


def report(args: argparse.Namespace, versions: dict[str, str], r: SoakResult) -> None:
    s = r.summary
    script = "select-only (-S)" if args.select_only else "TPC-B-like"
    print(
        f"\n## Soak: pgbench {script}, {args.clients} clients, {args.duration} s through "
        f"pgtarn (transaction mode, pool_size {args.pool_size}, SCRAM); churn every "
        f"{args.churn_every} s: {args.churn_conns} psycopg connections with prepared "
        f"statements + pgbench {' '.join(BURST)}; {os.cpu_count()} CPUs"
    )
    print(", ".join(f"{k} {v}" for k, v in versions.items()) + "\n")
    post = s.get("post_warmup_samples", 0)
    print(markdown(["measure", "value"], [
        ["pgbench TPS (whole run)", fmt(s.get("tps"), ",.0f")],
        ["transactions", fmt(s.get("transactions"), ",.0f")],
        ["pgbench failed / error lines / exit",
         f"{s.get('pgbench_failed')} / {len(r.pgbench_errors)} / {s.get('pgbench_exit')}"],
        ["RSS at start (idle) MB", fmt(s.get("rss_start_mb"), ".1f")],
        [f"RSS at warm-up end ({fmt(s.get('warm_t'), '.0f')} s) MB",
         fmt(s.get("rss_warm_mb"), ".1f")],
        [f"RSS at end ({fmt(s.get('end_t'), '.0f')} s) MB", fmt(s.get("rss_end_mb"), ".1f")],
        ["RSS max MB", fmt(s.get("rss_max_mb"), ".1f")],
        [f"RSS slope MB/10 min ({post} samples after warm-up)",
         fmt(s.get("slope_mb_per_10min"), "+.2f")],
        ["growth after warm-up MB (threshold)",
         f"{fmt(s.get('growth_mb'), '+.2f')} ({fmt(s.get('threshold_mb'), '.1f')})"],
        ["pgtarn CPU s", fmt(s.get("cpu_s"), ".1f")],
        ["pgtarn open fds start / max / after", f"{s.get('fds_start')} / {s.get('fds_max')} / "
                                                f"{s.get('fds_after')}"],
        ["churn rounds / errors", f"{s.get('churn_rounds')} / {s.get('churn_errors')}"],
    ]))  # fmt: skip
    print()
    rows = []
    by_t = {round(p.t): p for p in r.progress}
    samples = [x for x in r.samples if x.t > 0]
    previous = r.samples[0] if r.samples else None
    for x in samples:
        p = by_t.get(round(x.t))
        churns = [c for c in r.churns if x.t - args.interval < c.t <= x.t]
        cpu = (x.cpu_s - previous.cpu_s) / (x.t - previous.t) * 100 if previous else None
        rows.append([
            f"{x.t:.0f}", fmt(p.tps if p else None, ",.0f"), fmt(p.lat_ms if p else None, ".1f"),
            str(p.failed) if p else "-", f"{x.rss_kb / 1024:.1f}", fmt(cpu, ".0f"), str(x.fds),
            "; ".join(f"{c.connections_ok} conns + burst {fmt(c.burst_tps, ',.0f')} tps in "
                      f"{c.seconds:.1f} s" for c in churns),
        ])  # fmt: skip
        previous = x
    print(markdown(["t s", "TPS", "lat ms", "failed", "RSS MB", "CPU %", "fds", "churn"], rows))
    for line in r.pgbench_errors[:10]:
        print(f"- pgbench: {line}")
    for c in r.churns:
        for detail, n in c.errors.items():
            print(f"- churn at {c.t:.0f} s: {n} x {detail}")
        if c.burst_error:
            print(f"- churn at {c.t:.0f} s: pgbench -M prepared: {c.burst_error}")
    for line, n in r.log_lines.items():
        print(f"- pgtarn log: {n:,} x {line}")
    print(f"\nverdict: {s.get('verdict')} (growth after warm-up "
          f"{fmt(s.get('growth_mb'), '+.1f')} MB, threshold {fmt(s.get('threshold_mb'), '.1f')} "
          f"MB; slope {fmt(s.get('slope_mb_per_10min'), '+.2f')} MB/10 min)")  # fmt: skip
    write_json(args, versions, **asdict(r))


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=int, default=600, metavar="S", help="pgbench -T (600)")
    p.add_argument("--clients", type=int, default=50, metavar="N", help="pgbench -c (50)")
    p.add_argument(
        "--select-only", action="store_true", help="pgbench -S instead of the TPC-B-like script"
    )
    p.add_argument("--pool-size", type=int, default=20, metavar="N", help="pool_size (20)")
    p.add_argument(
        "--interval",
        type=int,
        default=10,
        metavar="S",
        help="seconds between samples and pgbench -P reports (10)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        metavar="S",
        help="seconds of warm-up (60; a third of runs shorter than 180 s)",
    )
    p.add_argument(
        "--churn-every", type=int, default=30, metavar="S", help="seconds between churn rounds (30)"
    )
    p.add_argument(
        "--churn-conns",
        type=int,
        default=200,
        metavar="N",
        help="short-lived connections per churn round (200)",
    )
    p.add_argument(
        "--threshold-mb",
        type=float,
        default=5.0,
        metavar="MB",
        help="RSS growth after warm-up still called flat, in MB (5)",
    )
    p.add_argument(
        "--threshold-pct",
        type=float,
        default=5.0,
        metavar="PCT",
        help="... or in percent of the warm-up RSS, whichever is larger (5)",
    )
    p.add_argument("--json", metavar="PATH", help="also write all raw numbers as JSON to PATH")
    add_postgres_options(p)
    args = p.parse_args(argv)  # fmt: skip
    if args.duration < 2 * args.interval or args.interval < 1 or args.clients < 1:
        p.error("--duration must be at least two --interval; --interval and --clients >= 1")
    if args.warmup is None:
        args.warmup = 60 if args.duration >= 180 else args.duration // 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_process()
    workdir = make_workdir("soak", None)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.pool_size]}))
    children = Children()
    pooler: Pooler | None = None
    result = SoakResult()
    try:
        db.setup(scale=SCALE)
        verifier = db.scram_verifier()
        versions = {"postgres": db.version, "pgtarn": pgtarn.__version__,
                    "pgbench": version_of([db.tool("pgbench"), "--version"])}  # fmt: skip
        pooler = Pooler(
            "pgtarn",
            [sys.executable, "-m", "pgtarn"],
            workdir,
            db,
            None,
            settings={"default_pool_size": args.pool_size},
            secret=verifier,
        )
        pooler.start()
        soak(args, db, pooler, children, result)
        children.stop_all()
        pooler.stop()
        result.log_lines = log_summary(pooler.log_path)
        result.summary = summarize(args, result)
        report(args, versions, result)
        s = result.summary
        bad = (not result.pooler_alive or s.get("pgbench_failed") or s.get("churn_errors")
               or result.pgbench_exit != 0)  # fmt: skip
        return 1 if bad or s.get("verdict") != "RSS flat" else 0
    except (RuntimeError, KeyboardInterrupt) as exc:
        return ended(exc)
    finally:
        children.stop_all()
        if pooler is not None:
            pooler.stop()
        with contextlib.suppress(Exception):
            db.cleanup()
        remove_workdir(workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
