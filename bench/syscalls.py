"""System calls per transaction of each pooler under `pgbench -S`, by kind, counted by perf.

The kernel is much of a pooler's CPU (bench/cpu.py), and what it does there is the system
calls the pooler makes: a count of them per transaction, by kind, says where a pooler
asks the kernel for more than PgBouncer does (a send per message where one would do, a read
that finds nothing, a watch changed and changed back) whatever the interpreter costs.

Each pooler (PgBouncer, pgtarn) runs as the child of `perf stat`, which counts the
syscalls:sys_enter_* tracepoints of the process and its threads in the kernel, without
stopping it (strace would slow it down enough to change how many messages each loop turn
finds). It runs twice with the same clients, serving N1 and then N2 transactions in all;
the difference of the two counts, over the transactions added, is per transaction: the
start, the logins and the shutdown cancel out. PgBouncer runs as the `postgres` account, as
in bench/run.py. Counts move a little with timing (a loop turn finds one message or two), far
less than CPU time on a shared machine. Below the counts, each pooler's user and system CPU
per transaction over the same runs (from /proc: a timing, which that machine moves) says how
much of its CPU is the kernel's.

    python3 bench/syscalls.py [--clients 10,100] [--transactions 5000,25000] [--pgbouncer PATH]
                              [--workload select-only|select-1]

`--workload select-1` is bench/run.py's pooler-bound case: `SELECT 1` and a pool of
PostgreSQL's cores (run it with `--clients 200`).

Needs perf with access to tracepoints (root, or kernel.perf_event_paranoid = -1).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from run import (
    WORKLOADS,
    Database,
    PgBouncerMissing,
    Pooler,
    Workload,
    add_pgbouncer_option,
    add_postgres_options,
    clean_env,
    ended,
    find_pgbouncer,
    int_list,
    log,
    make_workdir,
    pgbouncer_version,
    pgtarn_build,
    postgres_account,
    prepare_process,
    remove_workdir,
)

#: The system calls counted one by one (those a pooler's transaction may make); the rest are
#: counted together as "other" (all of them: raw_syscalls:sys_enter).
KINDS = (
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl", "poll", "select",
    "recvfrom", "sendto", "recvmsg", "sendmsg", "read", "write", "readv", "writev",
    "getsockopt", "setsockopt", "fcntl", "ioctl", "futex", "getpid", "clock_gettime",
    "gettimeofday", "accept4", "close", "mmap", "munmap", "brk", "madvise",
)  # fmt: skip
TOTAL = "raw_syscalls:sys_enter"
#: The kernel entries that are not system calls, counted beside them: a context switch per
#: sleep in epoll_wait, and a page fault per page of memory first touched.
ENTRIES = ("context-switches", "page-faults")
#: The pooler's CPU time (user, system) from /proc at the end of each run, in µs per
#: transaction: a timing, which a shared machine moves, shown below the counts to say how
#: much of the CPU is the kernel's.
TIMES = ("user CPU, us", "system CPU, us")
TICKS = os.sysconf("SC_CLK_TCK")
#: Kinds shown in the table below this many calls per transaction go to "other".
SHOWN = 0.01


def available_kinds() -> list[str]:
    """KINDS that this kernel has a tracepoint for (perf refuses an unknown event)."""
    out = subprocess.run(
        ["perf", "list", "tracepoint"], capture_output=True, text=True, check=False
    ).stdout
    known = set(re.findall(r"syscalls:sys_enter_(\w+)", out))
    return [kind for kind in KINDS if kind in known]


def perf_command(kinds: list[str], out: Path, command: list[str]) -> list[str]:
    """command under `perf stat`, its counts written to out."""
    events = ",".join([TOTAL, *ENTRIES, *(f"syscalls:sys_enter_{kind}" for kind in kinds)])
    return ["perf", "stat", "-x,", "-o", str(out), "-e", events, "--", *command]


def read_counts(out: Path) -> Counter[str]:
    """perf stat's CSV: the count of each kind, and "total"."""
    counts: Counter[str] = Counter()
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) < 3 or line.startswith("#"):
            continue
        value, event = fields[0], fields[2]
        if not value.isdigit():
            raise RuntimeError(f"perf counted nothing for {event}: {line}")
        counts["total" if event == TOTAL else event.rsplit("sys_enter_", 1)[-1]] = int(value)
    return counts


def counted_pids(pooler: Pooler) -> list[int]:
    """The pooler's processes: perf's children."""
    return [int(pid) for pid in Path(f"/proc/{pooler.pid}/task/{pooler.pid}/children")
            .read_text().split()]  # fmt: skip


def cpu_times(pids: list[int]) -> dict[str, float]:
    """TIMES of the processes pids so far, in µs (utime and stime of /proc/PID/stat)."""
    times = dict.fromkeys(TIMES, 0.0)
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        for name, field in zip(TIMES, (fields[11], fields[12]), strict=True):
            times[name] += int(field) * 1e6 / TICKS
    return times


def stop_counted(pooler: Pooler) -> None:
    """End the pooler (perf's child), then perf, which writes its counts as its child exits.
    (A signal to perf itself would end it without them.)"""
    assert pooler.proc is not None
    for child in counted_pids(pooler):
        os.kill(child, signal.SIGTERM)
    try:
        pooler.proc.wait(30)
    except subprocess.TimeoutExpired:
        pooler.stop()


def counted_run(db: Database, pooler: Pooler, workload: Workload, clients: int,
                transactions: int, out: Path) -> dict[str, float]:  # fmt: skip
    """A fresh pooler under perf serves the workload's pgbench for `transactions` in all; its
    counts."""
    out.unlink(missing_ok=True)
    pooler.start(workload.settings)
    try:
        login = pooler.login()
        res = subprocess.run(
            [db.tool("pgbench"), *workload.args, "-n", "-c", str(clients), "-j", "2",
             "-t", str(transactions // clients), "-h", login.host, "-p", str(login.port),
             "-U", login.user, login.dbname],
            env=clean_env(PGPASSWORD=login.password), capture_output=True, text=True,
            check=False)  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"pgbench through {pooler.name} failed:\n{res.stdout}{res.stderr}")
        times = cpu_times(counted_pids(pooler))
    finally:
        stop_counted(pooler)
    if not out.exists():
        raise RuntimeError(f"perf wrote no counts for {pooler.name}:\n{pooler.tail()}")
    return {**read_counts(out), **times}


def per_transaction(db: Database, pooler: Pooler, workload: Workload, clients: int,
                    totals: list[int], out: Path) -> dict[str, float]:  # fmt: skip
    """System calls per transaction by kind: the difference of two runs over the added."""
    first, second = (counted_run(db, pooler, workload, clients, n, out) for n in totals)
    added = (totals[1] // clients - totals[0] // clients) * clients
    per = {kind: (second[kind] - first[kind]) / added for kind in second}
    entries = {entry: per.pop(entry) for entry in (*ENTRIES, *TIMES)}
    per["other"] = per.pop("total") - sum(per.values())
    return {**per, **entries}


def calls(per: dict[str, float]) -> float:
    """All system calls per transaction (the other kernel entries left out)."""
    return sum(count for kind, count in per.items() if kind not in (*ENTRIES, *TIMES))


def number(value: float) -> str:
    """A count per transaction, 0.00 for the small negative ones two runs' noise gives."""
    return f"{max(value, 0.0):.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int_list, default=[10, 100], metavar="LIST")
    p.add_argument(
        "--transactions",
        type=int_list,
        default=[5000, 25000],
        metavar="N1,N2",
        help="transactions in all of the two runs (5000,25000)",
    )
    p.add_argument(
        "--workload",
        choices=[w.name for w in WORKLOADS if w.name in ("select-only", "select-1")],
        default="select-only",
        help="bench/run.py's workload: pgbench -S, or SELECT 1 with a pool of the cores",
    )
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args()
    workload = next(w for w in WORKLOADS if w.name == args.workload)
    if len(args.transactions) != 2 or not 0 < args.transactions[0] < args.transactions[1]:
        p.error("--transactions takes two counts, the first one smaller: N1,N2")
    if shutil.which("perf") is None:
        print("perf is not installed (apt-get install linux-perf)", file=sys.stderr)
        return 2
    kinds = available_kinds()
    if not kinds:
        print(
            "perf lists no syscalls tracepoints (root, or perf_event_paranoid -1)", file=sys.stderr
        )
        return 2
    args.memory_clients = [2]
    prepare_process()
    account = postgres_account()
    workdir = make_workdir("syscalls", account)
    db = Database(args)
    commands: dict[str, list[str]] = {}
    names = {"pgtarn": f"pgtarn {pgtarn_build()}"}
    try:
        binary = find_pgbouncer(args.pgbouncer)
        names["pgbouncer"] = f"PgBouncer {pgbouncer_version(binary)}"
        # PgBouncer refuses root: perf (root, for its tracepoints) starts it as the account
        commands["pgbouncer"] = [binary]
        if account is not None:
            commands["pgbouncer"] = [
                "setpriv",
                f"--reuid={account.pw_uid}",
                f"--regid={account.pw_gid}",
                "--clear-groups",
                binary,
            ]
    except PgBouncerMissing as exc:
        log(str(exc))
    commands["pgtarn"] = [sys.executable, "-m", "pgtarn"]
    columns: dict[tuple[str, int], dict[str, float]] = {}
    try:
        db.setup()
        for clients in args.clients:
            for name, command in commands.items():
                out = workdir / f"{name}.perf"
                pooler = Pooler(f"syscalls-{name}", perf_command(kinds, out, command), workdir,
                                db, None)  # fmt: skip
                columns[name, clients] = per = per_transaction(
                    db, pooler, workload, clients, args.transactions, out
                )
                log(f"{name}, {clients} clients: {calls(per):.2f} system calls per tx")
    except (RuntimeError, KeyboardInterrupt) as exc:
        return ended(exc)
    finally:
        db.cleanup()
        remove_workdir(workdir, args.keep)
    print(
        f"\n## System calls per transaction, {workload.name} (perf stat; runs of "
        f"{args.transactions[0]} and {args.transactions[1]} transactions)\n"
    )
    heads = list(columns)
    print("| system call | " + " | ".join(f"{names[n]}, {c} clients" for n, c in heads) + " |")
    print("|---|" + "---|" * len(heads))
    shown = [k for k in kinds if any(col.get(k, 0) >= SHOWN for col in columns.values())]
    for col in columns.values():  # the kinds too rare to show are counted in "other"
        col["other"] += sum(col[kind] for kind in kinds if kind not in shown)
    for kind in [*shown, "other"]:
        print(f"| {kind} | " + " | ".join(number(columns[h].get(kind, 0)) for h in heads) + " |")
    print("| **all** | " + " | ".join(f"**{calls(columns[h]):.2f}**" for h in heads) + " |")
    for entry in (*ENTRIES, *TIMES):  # (not system calls: below the total)
        print(f"| ({entry}) | " + " | ".join(number(columns[h][entry]) for h in heads) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
