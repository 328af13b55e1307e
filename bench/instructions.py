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

    python3 bench/instructions.py [--clients 10] [--transactions 200,1200]
"""

from __future__ import annotations

import argparse
import pwd
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import run
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
    postgres_account,
    prepare_process,
    remove_workdir,
)

FORWARDER = Path(__file__).resolve().with_name("forwarder.py")
COLLECTED = re.compile(r"==\d+== Collected : (\d+)")
#: Shared objects by the part of a pooler they are (first match wins).
OBJECTS = [
    ("pgtarn, compiled", r"__mypyc"),
    ("interpreter", r"libpython|^python"),
    ("event loop (uvloop, libuv)", r"^loop\.cpython"),
    ("libc", r"^libc\.so"),
    ("PgBouncer", r"^pgbouncer$"),
    ("libevent", r"^libevent"),
]


#: In a Python process: the functions that hand the GIL over (uvloop runs libuv without the
#: GIL and takes it back for each callback), a part of their own whatever object holds them.
GIL_PART = "GIL hand-offs"
GIL_FUNCTIONS = re.compile(
    r"take_gil|drop_gil|PyGILState_(Ensure|Release)|PyEval_(Save|Restore)"
    r"Thread|pthread_(mutex_lock|mutex_unlock|cond_signal|getspecific)"
)


def part_of(function: str, name: str, python: bool) -> str:
    """The part of a pooler that a function of the shared object called name is."""
    if python and GIL_FUNCTIONS.search(function):
        return GIL_PART
    for part, pattern in OBJECTS:
        if re.search(pattern, name):
            return part
    return "other"


def instructions_by_part(profile: Path) -> Counter[str]:
    """Instructions of a callgrind profile by part (OBJECTS, GIL_PART), from
    callgrind_annotate."""
    out = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100", str(profile)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = [
        (int(m.group(1).replace(",", "")), m.group(2), Path(m.group(3)).name)
        for m in (
            re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*?)\s*\[([^\]]+)\]\s*$", line)
            for line in out.splitlines()
        )
        if m
    ]
    python = any("libpython" in name for _, _, name in rows)
    parts: Counter[str] = Counter()
    for count, function, name in rows:
        parts[part_of(function, name, python)] += count
    return parts


def counted_run(db: Database, pooler: Pooler, clients: int, transactions: int,
                profile: Path) -> tuple[int, Counter[str]]:  # fmt: skip
    """A fresh pooler under callgrind serves pgbench -S; its total instructions and parts."""
    pooler.start()
    try:
        login = pooler.login()
        res = subprocess.run(
            [db.tool("pgbench"), "-S", "-n", "-c", str(clients), "-j", "2",
             "-t", str(transactions), "-h", login.host, "-p", str(login.port),
             "-U", login.user, login.dbname],
            env=clean_env(PGPASSWORD=login.password), capture_output=True, text=True,
            check=False)  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"pgbench through {pooler.name} failed:\n{res.stdout}{res.stderr}")
    finally:
        pooler.stop()
    found = COLLECTED.findall(pooler.log_path.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"no callgrind total in {pooler.log_path}:\n{pooler.tail()}")
    return int(found[-1]), instructions_by_part(profile)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument(
        "--transactions",
        type=int_list,
        default=[200, 1200],
        metavar="N1,N2",
        help="transactions per client of the two runs (200,1200)",
    )
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args()
    if len(args.transactions) != 2 or not 0 < args.transactions[0] < args.transactions[1]:
        p.error("--transactions takes two counts, the first one smaller: N1,N2")
    first, second = args.transactions
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    args.memory_clients = [2]
    prepare_process()
    run.READY_TIMEOUT = 120.0  # under callgrind pgtarn starts in seconds, more on a busy machine
    account = postgres_account()
    workdir = make_workdir("instructions", account)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.clients]}))
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
                pooler = Pooler(
                    f"callgrind-{name}",
                    ["valgrind", "--tool=callgrind", f"--callgrind-out-file={profile}", *command],
                    workdir,
                    db,
                    owner,
                )
                total, by_part = counted_run(db, pooler, args.clients, transactions, profile)
                totals.append(total)
                parts.append(by_part)
            added = args.clients * (second - first)
            rows[name] = (
                (totals[1] - totals[0]) / added,
                {part: (parts[1][part] - parts[0][part]) / added for part in parts[1]},
            )
            print(f"{name}: {rows[name][0]:,.0f} instructions per transaction", file=sys.stderr)
    finally:
        db.cleanup()
        remove_workdir(workdir, args.keep)
    base = rows.get("pgbouncer", (0.0, {}))[0]
    print(
        f"\n## User-space instructions per transaction, pgbench -S, {args.clients} clients "
        f"(callgrind; runs of {first} and {second} transactions per client)\n"
    )
    print("| pooler | instructions/tx | vs PgBouncer | by part |")
    print("|---|---|---|---|")
    for name, (per_tx, per_part) in rows.items():
        ratio = f"{per_tx / base:.2f}" if base else "-"
        shown = ", ".join(
            f"{part} {count:,.0f}"
            for part, count in sorted(per_part.items(), key=lambda kv: -kv[1])
            if count >= 50
        )
        print(f"| {name} | {per_tx:,.0f} | {ratio} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
