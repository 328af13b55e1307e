"""User-space instructions per SCRAM login of each pooler, counted by callgrind, by function.

The login counterpart of bench/instructions.py: each pooler runs under callgrind twice, once
for N1 and once for N2 logins per client (pgbench -C, a new connection per transaction);
the difference of the two totals over the logins added is its work per login, start and
shutdown cancelling out. By default a transaction sends nothing (a script of one \\set), so
a login is the connection, the StartupMessage, the SCRAM exchange, the welcome and the
Terminate; --select adds one SELECT per login, as bench/run.py's churn case does.

The auth_file holds the password in plaintext, as in bench/run.py (--verifier: the role's
SCRAM verifier). Both poolers derive a verifier from a plaintext password once and keep it
(see docs/authentication.md), so no PBKDF2 is counted per login; the HMACs and hashes of the
exchange are (libcrypto), the floor of a login.

The breakdown: instructions per login by shared object (as bench/instructions.py), and, for
pgtarn, the inclusive count of the functions of a login worth naming (its compiled functions
and a few of the interpreter's), each the difference of the two runs over the logins added.
System calls run in the kernel and are not counted.

    python3 bench/login_instructions.py [--clients 4] [--logins 50,250] [--targets pgtarn]
    python3 bench/login_instructions.py --pgbouncer PATH --workers 2 --functions 40
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import callgrind
from callgrind import CallgrindPooler, instructions_by_part, parts_row, per_unit
from run import (
    Database,
    PgBouncerMissing,
    add_pgbouncer_option,
    add_postgres_options,
    find_pgbouncer,
    make_workdir,
    postgres_account,
    remove_workdir,
)

ROW = re.compile(r"\s*([\d,]+)\s+\([^)]*\)\s+(?:\S+:)?(.*?)\s*\[([^\]]+)\]\s*$")
#: Functions shown by name (inclusive counts): pgtarn's compiled ones, hashing, the
#: interpreter's entry from C into Python code (pure-Python modules a login runs), logging.
NAMED = re.compile(
    r"^CPyDef_|^CPyPy_|HMAC|SHA256_(Update|Final)|^_PyEval_EvalFrameDefault$|"
    r"^_PyObject_MakeTpCall$|^PyObject_Vectorcall|pbkdf2"
)
#: A pgbench transaction that sends nothing: with -C, a login and a Terminate.
LOGIN_ONLY_SCRIPT = "\\set x 1\n"


def profiles_of(pattern: Path) -> list[Path]:
    """The profile files of a run (one per process with --trace-children)."""
    return sorted(pattern.parent.glob(pattern.name.replace("%p", "*")))


def inclusive_by_function(profile: Path) -> Counter[str]:
    """Inclusive instructions per function of one callgrind profile."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", str(profile)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    counts: Counter[str] = Counter()
    for line in out.splitlines():
        m = ROW.match(line)
        if m and NAMED.search(m.group(2)):
            counts[m.group(2)] += int(m.group(1).replace(",", ""))
    return counts


def counted_run(pooler: CallgrindPooler, clients: int, logins: int, pattern: Path,
                select: bool, script: Path) -> tuple[int, Counter[str], Counter[str]]:  # fmt: skip
    """A fresh pooler under callgrind takes clients * logins logins; its total instructions,
    by part and by function (summed over its processes)."""
    work = ["-S"] if select else ["-f", str(script)]
    found = pooler.counted(["-C", *work], clients, logins)
    parts: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for profile in profiles_of(pattern):
        parts += instructions_by_part(profile)
        functions += inclusive_by_function(profile)
    return sum(found.values()), parts, functions


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    callgrind.add_runs_option(p, "logins", (50, 250), "logins")
    p.add_argument(
        "--targets",
        type=lambda t: t.split(","),
        default=["pgbouncer", "pgtarn"],
        metavar="LIST",
        help="pgbouncer, pgtarn (pgbouncer,pgtarn)",
    )
    p.add_argument("--workers", type=int, default=1, help="pgtarn's workers setting (1)")
    p.add_argument("--select", action="store_true", help="one SELECT per login (pgbench -S)")
    p.add_argument("--verifier", action="store_true", help="auth_file holds a SCRAM verifier")
    p.add_argument("--functions", type=int, default=30, help="pgtarn functions shown (30)")
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args()
    if not callgrind.prepare(ready_timeout=120.0):
        return 2
    args.memory_clients = [2]
    # one hash seed for both runs: with random ones, the start alone differs by a few million
    # instructions between them, which the logins added do not cancel
    os.environ.setdefault("PYTHONHASHSEED", "0")
    account = postgres_account()
    workdir = make_workdir("login-instructions", account)
    script = workdir / "login.sql"
    script.write_text(LOGIN_ONLY_SCRIPT, encoding="utf-8")
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.clients]}))
    commands: dict[str, tuple[list[str], pwd.struct_passwd | None]] = {}
    if "pgbouncer" in args.targets:
        try:
            commands["pgbouncer"] = ([find_pgbouncer(args.pgbouncer)], account)
        except PgBouncerMissing as exc:
            print(f"{exc}: pgtarn alone", file=sys.stderr)
    if "pgtarn" in args.targets:
        commands["pgtarn"] = ([sys.executable, "-m", "pgtarn"], None)
    first, second = args.logins
    added = args.clients * (second - first)
    rows: dict[str, tuple[float, dict[str, float], dict[str, float]]] = {}
    try:
        db.setup(scale=1 if args.select else None)
        secret = db.scram_verifier() if args.verifier else None
        for name, (command, owner) in commands.items():
            settings = {"workers": args.workers} if name == "pgtarn" and args.workers > 1 else {}
            runs = []
            for logins in (first, second):
                pattern = workdir / f"{name}.{logins}.%p.callgrind"
                # (not named "pgbouncer...": under valgrind its process is not called that)
                pooler = CallgrindPooler(
                    f"callgrind-{name}", command, pattern, workdir, db, owner,
                    children=True, settings=settings, secret=secret,
                )  # fmt: skip
                runs.append(counted_run(pooler, args.clients, logins, pattern, args.select,
                                        script))  # fmt: skip
            (total1, parts1, funcs1), (total2, parts2, funcs2) = runs
            rows[name] = (
                (total2 - total1) / added,
                per_unit(parts1, parts2, added),
                per_unit(funcs1, funcs2, added),
            )
            print(f"{name}: {rows[name][0]:,.0f} instructions per login", file=sys.stderr)
    finally:
        db.cleanup()
        remove_workdir(workdir, args.keep)
    base = rows.get("pgbouncer", (0.0, {}, {}))[0]
    what = "a login and one SELECT" if args.select else "a login and a Terminate"
    secret_kind = "a SCRAM verifier" if args.verifier else "a plaintext password"
    workers = f", workers = {args.workers}" if args.workers > 1 else ""
    print(
        f"\n## User-space instructions per SCRAM login ({what}; auth_file: {secret_kind}"
        f"{workers}; {args.clients} clients, runs of {first} and {second} logins each)\n"
    )
    print("| pooler | instructions/login | vs PgBouncer | by part |")
    print("|---|---|---|---|")
    for name, (per_login, per_part, _functions) in rows.items():
        print(parts_row(name, per_login, base, per_part))
    for name, (per_login, _parts, functions) in rows.items():
        top = sorted(functions.items(), key=lambda kv: -kv[1])[: args.functions]
        if not top:
            continue
        print(f"\n### {name}: inclusive instructions per login, by function\n")
        print("| function | instructions/login | share |")
        print("|---|---|---|")
        for function, count in top:
            print(f"| `{function}` | {count:,.0f} | {count / per_login:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
