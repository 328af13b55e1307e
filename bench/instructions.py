"""User-space instructions per transaction of each pooler under `pgbench -S`, counted by callgrind.

CPU time on a shared machine moves by 5-10% between runs (bench/cpu.py); an instruction count
does not. Each pooler (PgBouncer, pgtarn, bench/forwarder.py) runs under valgrind's callgrind
twice with the same clients, once for N1 and once for N2 transactions per client; the
difference of the two totals, over the transactions added, is its user-space work per
transaction: start, logins and shutdown cancel out. System calls run in the kernel and are not
counted (bench/cpu.py reports them as system time). A breakdown by shared object says where
the instructions went: the interpreter, uvloop, libc, pgtarn's compiled code, and in a Python
process the hand-offs of the GIL around uvloop's callbacks, counted apart.

Under callgrind a pooler runs 20 to 50 times slower, so the clients wait on it and the
batching of messages per read is not what it is at full speed; the count is a measure of work
per transaction, not a prediction of CPU time.

With --prepared, pgbench -S -M prepared: each transaction a Bind and Execute of a statement
the client prepared once (protocol-level prepared statements, max_prepared_statements).

    python3 bench/instructions.py [--clients 10] [--transactions 200,1200] [--prepared]
"""

from __future__ import annotations

import argparse
import pwd
import sys
from pathlib import Path

import callgrind
from callgrind import CallgrindPooler, instructions_by_part, parts_row, per_unit
from run import (
    Database,
    PgBouncerMissing,
    add_pgbouncer_option,
    add_postgres_options,
    find_pgbouncer,
    log,
    make_workdir,
    postgres_account,
    remove_workdir,
)

FORWARDER = Path(__file__).resolve().with_name("forwarder.py")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--prepared", action="store_true", help="pgbench -M prepared")
    callgrind.add_runs_option(p, "transactions", (200, 1200), "transactions")
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args()
    first, second = args.transactions
    if not callgrind.prepare(ready_timeout=120.0):
        return 2
    args.memory_clients = [2]
    account = postgres_account()
    workdir = make_workdir("instructions", account)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.clients]}))
    options = ["-S", "-M", "prepared"] if args.prepared else ["-S"]
    commands: dict[str, tuple[list[str], pwd.struct_passwd | None]] = {
        "pgtarn": ([sys.executable, "-m", "pgtarn"], None),
        "forwarder": ([sys.executable, str(FORWARDER)], None),
    }
    try:
        commands = {"pgbouncer": ([find_pgbouncer(args.pgbouncer)], account), **commands}
    except PgBouncerMissing as exc:
        log(str(exc))
    rows: dict[str, tuple[float, dict[str, float]]] = {}
    try:
        db.setup()
        for name, (command, owner) in commands.items():
            totals, parts = [], []
            for transactions in (first, second):
                profile = workdir / f"{name}.{transactions}.callgrind"
                # (not named "pgbouncer": under valgrind its process is not called that)
                pooler = CallgrindPooler(f"callgrind-{name}", command, profile, workdir, db, owner)
                totals.append(sum(pooler.counted(options, args.clients, transactions).values()))
                parts.append(instructions_by_part(profile))
            added = args.clients * (second - first)
            rows[name] = ((totals[1] - totals[0]) / added, per_unit(parts[0], parts[1], added))
            print(f"{name}: {rows[name][0]:,.0f} instructions per transaction", file=sys.stderr)
    finally:
        db.cleanup()
        remove_workdir(workdir, args.keep)
    base = rows.get("pgbouncer", (0.0, {}))[0]
    print(
        f"\n## User-space instructions per transaction, pgbench {' '.join(options)}, "
        f"{args.clients} clients "
        f"(callgrind; runs of {first} and {second} transactions per client)\n"
    )
    print("| pooler | instructions/tx | vs PgBouncer | by part |")
    print("|---|---|---|---|")
    for name, (per_tx, per_part) in rows.items():
        print(parts_row(name, per_tx, base, per_part))
    return 0


if __name__ == "__main__":
    sys.exit(main())
