"""What a second worker costs: user-space instructions per transaction and per login, by process.

pgtarn with `workers = 1` and `workers = N` serves pgbench under valgrind's callgrind with
--trace-children, so that the supervisor and every worker are counted; as in
bench/instructions.py, two runs of N1 and N2 transactions per client and the difference of
their totals over the transactions added, so that start, logins and shutdown cancel out.
Two workloads: `-S` (the steady state, one login per client) and `-S -C` (a new connection
and a SCRAM login per transaction, against a stored SCRAM verifier unless --plain-password).

Then, without valgrind, the supervisor's control-channel traffic under each workload:
`strace -c` of its sendto/sendmsg (messages it sends: one call each) and recvfrom/recvmsg
(reads, each one or more messages from a worker); the supervisor has no other sockets in
use, so every such call is the channel's.

    PYTHONPATH=<compiled build> python3 bench/workers.py [--workers 1,2] [--clients 10]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import callgrind
from callgrind import CallgrindPooler, instructions_by_part, per_unit, pgbench
from run import (
    Database,
    Pooler,
    add_postgres_options,
    int_list,
    make_workdir,
    remove_workdir,
)

STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")
CHANNEL_CALLS = ("sendto", "sendmsg", "recvfrom", "recvmsg")
#: pgtarn with its workers started afresh (`python -m pgtarn --worker`) instead of forked:
#: valgrind before 3.20 does not know pidfd_open, which a forked worker is watched through. The
#: work per transaction and per login is the same code either way.
UNFORKED = (
    "import os, runpy; del os.pidfd_open; "
    "runpy.run_module('pgtarn', run_name='__main__', alter_sys=True)"
)


def counted_run(pooler: CallgrindPooler, workload: list[str], clients: int, transactions: int,
                profiles: Path) -> dict[str, int]:  # fmt: skip
    """A fresh pgtarn (and its workers) under callgrind serves pgbench; instructions by
    process role (supervisor, workers) and by part."""
    found = pooler.counted(workload, clients, transactions)
    supervisor = pooler.pid
    if supervisor not in found:
        raise RuntimeError(f"no callgrind total for pid {supervisor}:\n{pooler.tail()}")
    counts: Counter[str] = Counter()
    for pid, total in found.items():
        role = "supervisor" if pid == supervisor and len(found) > 1 else "workers"
        counts[role] += total
        for part, count in instructions_by_part(profiles / f"callgrind.{pid}").items():
            counts[f"{role}: {part}"] += count
    counts["total"] = sum(found.values())
    return dict(counts)


def per_transaction(db: Database, workdir: Path, workers: int, workload: list[str],
                    clients: int, first: int, second: int,
                    secret: str | None) -> dict[str, float]:  # fmt: skip
    totals = []
    for transactions in (first, second):
        profiles = workdir / f"w{workers}-{'C' if '-C' in workload else 'S'}-{transactions}"
        profiles.mkdir()
        pooler = CallgrindPooler(
            f"pgtarn-w{workers}", [sys.executable, "-c", UNFORKED],
            profiles / "callgrind.%p", workdir, db, None, children=True,
            settings={"workers": workers}, secret=secret,
        )  # fmt: skip
        totals.append(counted_run(pooler, workload, clients, transactions, profiles))
    return per_unit(totals[0], totals[1], clients * (second - first))


def channel_calls(
    db: Database,
    workdir: Path,
    workers: int,
    workload: list[str],
    clients: int,
    transactions: int,
    secret: str | None,
) -> dict[str, int]:
    """The supervisor's socket calls (strace -c) while pgbench runs the workload."""
    pooler = Pooler(f"pgtarn-w{workers}-strace", [sys.executable, "-m", "pgtarn"], workdir, db,
                    None, settings={"workers": workers}, secret=secret)  # fmt: skip
    pooler.start()
    summary = workdir / f"strace-w{workers}-{'C' if '-C' in workload else 'S'}.txt"
    tracer = subprocess.Popen(
        ["strace", "-c", "-o", str(summary), "-e", "trace=" + ",".join(CHANNEL_CALLS),
         "-p", str(pooler.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(1.0)  # strace attached
        pgbench(pooler, workload, clients, transactions)
        time.sleep(0.5)  # the last clients' goodbyes
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        pooler.stop()
    calls: dict[str, int] = dict.fromkeys(CHANNEL_CALLS, 0)
    for line in summary.read_text().splitlines():
        m = STRACE_ROW.match(line)
        if m and m.group(2) in calls:
            calls[m.group(2)] = int(m.group(1))
    return calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int_list, default=[1, 2], metavar="LIST")
    p.add_argument("--clients", type=int, default=10)
    callgrind.add_runs_option(p, "transactions", (200, 5200), "-S transactions")
    callgrind.add_runs_option(p, "logins", (10, 160), "-S -C transactions (a login each)")
    p.add_argument(
        "--plain-password",
        action="store_true",
        help="auth_file holds the password (a PBKDF2 per login), not the verifier",
    )
    p.add_argument("--no-strace", action="store_true", help="skip the channel count")
    add_postgres_options(p)
    args = p.parse_args()
    if not callgrind.prepare(ready_timeout=180.0):
        return 2
    workdir = make_workdir("workers", None)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.clients]}))
    workloads = {"tx": (["-S"], args.transactions), "login": (["-S", "-C"], args.logins)}
    rows: dict[tuple[int, str], dict[str, float]] = {}
    calls: dict[tuple[int, str], tuple[int, dict[str, int]]] = {}
    try:
        db.setup()
        secret = None if args.plain_password else db.scram_verifier()
        for name, (workload, (first, second)) in workloads.items():
            for workers in args.workers:
                rows[workers, name] = per_transaction(
                    db, workdir, workers, workload, args.clients, first, second, secret
                )
                print(f"workers = {workers}, {name}: {rows[workers, name]['total']:,.0f} "
                      "instructions", file=sys.stderr)  # fmt: skip
                if workers > 1 and not args.no_strace:
                    count = args.clients * second
                    calls[workers, name] = (
                        count,
                        channel_calls(db, workdir, workers, workload, args.clients, second,
                                      secret),
                    )  # fmt: skip
    finally:
        db.cleanup()
        remove_workdir(workdir, args.keep)
    login_kind = "plain password (PBKDF2)" if args.plain_password else "SCRAM verifier"
    print(f"\n## User-space instructions, pgtarn workers = {args.workers}, pgbench -S, "
          f"{args.clients} clients (callgrind --trace-children; tx: runs of "
          f"{args.transactions[0]} and {args.transactions[1]} per client; login: -C, runs of "
          f"{args.logins[0]} and {args.logins[1]}, auth_file with the {login_kind})\n")  # fmt: skip
    print("| workers | per tx | per -C tx (a login each) | tx: supervisor | login: supervisor |")
    print("|---|---|---|---|---|")
    base = rows.get((1, "tx"), {}).get("total"), rows.get((1, "login"), {}).get("total")
    for workers in args.workers:
        tx, login = rows[workers, "tx"], rows[workers, "login"]
        ratios = [
            f" ({value / b:.2f}x)" if b and workers != 1 else ""
            for value, b in ((tx["total"], base[0]), (login["total"], base[1]))
        ]
        print(
            f"| {workers} | {tx['total']:,.0f}{ratios[0]} | {login['total']:,.0f}{ratios[1]} "
            f"| {tx.get('supervisor', 0):,.0f} | {login.get('supervisor', 0):,.0f} |"
        )
    print("\nBy part (per tx / per -C tx):")
    for (workers, name), row in rows.items():
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(row.items(), key=lambda kv: -kv[1])
                          if ": " in k and v >= 50)  # fmt: skip
        print(f"- workers = {workers}, {name}: {parts}")
    if calls:
        print("\nSupervisor socket calls (strace -c, no valgrind) per transaction:")
        for (workers, name), (count, found) in calls.items():
            shown = ", ".join(f"{k} {v / count:.3f}" for k, v in found.items() if v)
            print(f"- workers = {workers}, {name} ({count} transactions): {shown or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
