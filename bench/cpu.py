"""Where a pooler's CPU goes per transaction under `pgbench -S`: user and system time, and
pgtarn's share by part (kernel, event loop, interpreter, relay, link, pool, statistics...).
With --connect, pgbench -C: a SCRAM login per transaction, so the figures are per login.

For each client count the poolers run in turn (PgBouncer, pgtarn, then bench/forwarder.py: a
byte forwarder on uvloop, the floor of any pooler built on Python and uvloop) on the same
cluster and settings as bench/run.py. CPU per transaction comes from /proc (utime, stime)
over the run. With `perf` installed, pgtarn is also sampled and its samples sorted into parts;
a compiled build names its functions (CPyDef_<module>___<Class>___<method>), so the pgtarn parts are
exact there, while a pure-Python build shows only the interpreter as a whole.

    python3 bench/cpu.py [--clients 10,100] [--duration 10] [--no-perf] [--top N] [--connect]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from run import (
    Database,
    PgBouncerMissing,
    Pooler,
    add_pgbouncer_option,
    add_postgres_options,
    clean_env,
    find_pgbouncer,
    int_list,
    log,
    make_workdir,
    pgbench_command,
    postgres_account,
    prepare_process,
    remove_workdir,
)

TICKS = os.sysconf("SC_CLK_TCK")
FORWARDER = Path(__file__).resolve().with_name("forwarder.py")
#: pgtarn's compiled functions by module, first match wins: (part, symbol pattern).
PARTS = [
    ("statistics", r"stats___"),
    ("pool", r"pool___|registry___"),
    ("link", r"link___"),
    ("framing", r"framing___|messages___"),
    ("session tracking", r"prepared___|framer___|tracking___|effects___|sqlnames___|listening___"),
    ("server relay", r"server___|relay___ServerRelay|transport___ServerTransport"),
    ("client relay", r"client___|relay___ClientRelay|transport___ClientTransport"),
]


def cpu_ticks(pid: int) -> tuple[int, int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12]), int(fields[7])  # utime, stime, minor faults


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the process so far."""
    fields = dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":\t" in line
    )
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def pgbench(db: Database, pooler: Pooler, clients: int, duration: int,
            connect: bool = False) -> subprocess.Popen[str]:  # fmt: skip
    login = pooler.login()
    per_login = ("-C",) if connect else ()
    return subprocess.Popen(
        pgbench_command(db, login.host, login.port, "-S", *per_login, "-c", str(clients),
                        "-j", "2", "-T", str(duration)),
        env=clean_env(PGPASSWORD=login.password), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)  # fmt: skip


def part_of(dso: str, symbol: str) -> str:
    if dso.startswith("[kernel"):
        return "kernel (system calls, TCP)"
    if "__mypyc" in dso or "CPyDef_" in symbol:
        for part, pattern in PARTS:
            if re.search(pattern, symbol):
                return f"pgtarn: {part}"
        return "pgtarn: other compiled code"
    if "uvloop" in dso or "loop.cpython" in dso:
        return "event loop (uvloop, libuv)"
    if "libpython" in dso or dso.startswith("python"):
        return "interpreter (objects, calls, Python code)"
    if "libc" in dso:
        return "libc"
    return "other: " + dso


def perf_parts(data: str, top: int) -> dict[str, float]:
    out = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            data,
            "--no-children",
            "--sort",
            "dso,symbol",
            "--stdio",
            "--percent-limit",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    shares: dict[str, float] = defaultdict(float)
    symbols: list[tuple[float, str, str]] = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*)$", line)
        if m:
            shares[part_of(m.group(2), m.group(3))] += float(m.group(1))
            symbols.append((float(m.group(1)), m.group(2), m.group(3).strip()))
    if top:
        print(f"\npgtarn's {top} busiest functions (% of samples):\n")
        for share, dso, symbol in sorted(symbols, reverse=True)[:top]:
            print(f"  {share:5.2f}%  {dso[:28]:28}  {symbol[:90]}")
    return shares


Measurement = tuple[float, float, float, tuple[float, ...], dict[str, float]]


def measure(db: Database, pooler: Pooler, clients: int, duration: int, perf: bool,
            top: int = 0, keep: str = "", connect: bool = False) -> Measurement:  # fmt: skip
    """One run: (tps, user us/tx, system us/tx, (voluntary, involuntary) context switches and
    minor page faults per tx, perf shares of pgtarn's samples)."""
    pooler.start()
    try:
        bench = pgbench(db, pooler, clients, duration, connect)
        time.sleep(1.0)  # past the connections
        before = cpu_ticks(pooler.pid)
        switches_before = context_switches(pooler.pid)
        started = time.monotonic()
        shares: dict[str, float] = {}
        if perf:
            data = keep or tempfile.mktemp(prefix="perf-", suffix=".data")
            graph = ["--call-graph", "dwarf,16384", "-F", "499"] if keep else ["-F", "999"]
            subprocess.run(
                [
                    "perf",
                    "record",
                    *graph,
                    "-q",
                    "-o",
                    data,
                    "-p",
                    str(pooler.pid),
                    "--",
                    "sleep",
                    str(duration - 3),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        else:
            time.sleep(duration - 3)
        after = cpu_ticks(pooler.pid)
        switches_after = context_switches(pooler.pid)
        elapsed = time.monotonic() - started
        output, _ = bench.communicate()
        if perf:
            shares = perf_parts(data, top)
            if not keep:
                Path(data).unlink(missing_ok=True)
    finally:
        pooler.stop()
    m = re.search(r"tps = ([\d.]+)", output)
    if not m:
        raise RuntimeError(f"pgbench failed:\n{output[-2000:]}")
    tps = float(m.group(1))
    tx = tps * elapsed
    user = (after[0] - before[0]) / TICKS / tx * 1e6
    system = (after[1] - before[1]) / TICKS / tx * 1e6
    switches = (
        *((a - b) / tx for a, b in zip(switches_after, switches_before, strict=True)),
        (after[2] - before[2]) / tx,
    )
    return tps, user, system, switches, shares


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int_list, default=[10, 100], metavar="LIST")
    p.add_argument("--duration", type=int, default=10, metavar="S")
    p.add_argument("--no-perf", action="store_true", help="skip the perf sampling of pgtarn")
    p.add_argument(
        "--connect",
        action="store_true",
        help="pgbench -C: a new connection (a SCRAM login) per transaction",
    )
    p.add_argument(
        "--top",
        type=int,
        default=0,
        metavar="N",
        help="also list pgtarn's N busiest functions from perf",
    )
    p.add_argument(
        "--perf-data",
        default="",
        metavar="PATH",
        help="record pgtarn with call graphs (for perf report) and keep it at PATH",
    )
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args()
    args.memory_clients = [2]
    prepare_process()
    perf = not args.no_perf and shutil.which("perf") is not None
    account = postgres_account()
    workdir = make_workdir("profile", account)
    db = Database(args)
    poolers = {
        "pgtarn": Pooler("pgtarn", [sys.executable, "-m", "pgtarn"], workdir, db, None),
        "forwarder": Pooler("forwarder", [sys.executable, str(FORWARDER)], workdir, db, None),
    }
    try:
        binary = find_pgbouncer(args.pgbouncer)
        poolers = {"pgbouncer": Pooler("pgbouncer", [binary], workdir, db, account), **poolers}
    except PgBouncerMissing as exc:
        log(str(exc))
    try:
        db.setup()
        version = subprocess.run(
            [sys.executable, "-m", "pgtarn", "--version"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        print(f"pgtarn: {version}")
        for clients in args.clients:
            rows = {}
            for name, pooler in poolers.items():
                rows[name] = measure(
                    db,
                    pooler,
                    clients,
                    args.duration,
                    perf and name == "pgtarn",
                    args.top,
                    args.perf_data and f"{args.perf_data}.{clients}",
                    args.connect,
                )
            mode = "-S -C" if args.connect else "-S"
            print(f"\n## pgbench {mode}, {clients} clients, {args.duration} s\n")
            print(
                "| pooler | TPS | user us/tx | system us/tx | total us/tx "
                "| context switches/tx: voluntary, involuntary | page faults/tx |"
            )
            print("|---|---|---|---|---|---|---|")
            for name, (tps, user, system, (vol, invol, faults), _) in rows.items():
                print(
                    f"| {name} | {tps:,.0f} | {user:.1f} | {system:.1f} | {user + system:.1f} "
                    f"| {vol:.2f}, {invol:.2f} | {faults:.3f} |"
                )
            tps, user, system, _, shares = rows["pgtarn"]
            if shares:
                total = sum(shares.values())
                print(
                    f"\npgtarn's CPU by part ({total:.0f}% of samples attributed), "
                    "us per transaction:\n"
                )
                print("| part | share | us/tx |")
                print("|---|---|---|")
                for part, share in sorted(shares.items(), key=lambda kv: -kv[1]):
                    if share >= 0.5:
                        us = share / total * (user + system)
                        print(f"| {part} | {share / total:.1%} | {us:.1f} |")
    finally:
        db.cleanup()
        remove_workdir(workdir, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
