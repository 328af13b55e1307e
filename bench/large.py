"""Large client messages through each pooler: how far its memory (RSS) rises, beside PgBouncer's.

Clients send, all at once, a Bind with one large `bytea` parameter (psycopg, extended
protocol: `SELECT md5($1::bytea)`), then a simple Query with a large literal, then a SQL-level
`EXECUTE` of a prepared statement with a large literal argument, then a script naming a
prepared statement before and after a large literal; each answer is checked. For
each pooler (a fresh process, its pool warmed by one round of small queries), the table gives
its RSS before, how far its peak (VmHWM, reset before each workload) rose during each
workload, and how much more it held once the clients had gone.

    python3 bench/large.py [--clients 3] [--mb 100] [--targets pgbouncer,pgtarn]
                           [--pgbouncer PATH]

Memory, not time: the peak of a pooler that forwards a message in pieces does not depend on
the message's size; one that holds it whole rises by a multiple of it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import run
from memory import proc_status_kb
from run import (
    BENCH_DB,
    BENCH_USER,
    Database,
    PgBouncerMissing,
    Pooler,
    add_pgbouncer_option,
    add_postgres_options,
    find_pgbouncer,
    make_workdir,
    postgres_account,
    prepare_process,
    remove_workdir,
)

MB = 1024 * 1024


def reset_peak(pid: int) -> None:
    """Linux: the process's VmHWM starts again from its RSS now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")


def payload(index: int, size: int) -> bytes:
    return (hashlib.sha256(bytes([index])).hexdigest().encode() * (size // 64 + 1))[:size]


def at_once(count: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:  # (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def dsn(pooler: Pooler, db: Database) -> str:
    return (
        f"host=127.0.0.1 port={pooler.port} user={BENCH_USER} password={db.password} "
        f"dbname={BENCH_DB} sslmode=disable"
    )


def bind(conninfo: str, size: int) -> Callable[[int], None]:
    def work(index: int) -> None:
        data = payload(index, size)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT md5(%s::bytea)", (data,)).fetchone()
        if row != (hashlib.md5(data).hexdigest(),):
            raise RuntimeError(f"wrong answer to a Bind: {row}")

    return work


def query(conninfo: str, size: int) -> Callable[[int], None]:
    def work(index: int) -> None:
        data = payload(index, size)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute(b"SELECT md5('" + data + b"')").fetchone()  # simple Query
        if row != (hashlib.md5(data).hexdigest(),):
            raise RuntimeError(f"wrong answer to a Query: {row}")

    return work


def execute(conninfo: str, size: int) -> Callable[[int], None]:
    """A SQL-level prepared statement run with a large literal argument (simple Query, in
    a transaction block so that a pooler that does not follow prepared statements runs
    the EXECUTE on the server that prepared it)."""

    def work(index: int) -> None:
        data = payload(index, size)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("PREPARE big_md5(text) AS SELECT md5($1)")
            row = conn.execute(b"EXECUTE big_md5('" + data + b"')").fetchone()
            conn.execute("DEALLOCATE big_md5")
            conn.execute("COMMIT")
        if row != (hashlib.md5(data).hexdigest(),):
            raise RuntimeError(f"wrong answer to an EXECUTE: {row}")

    return work


def script(conninfo: str, size: int) -> Callable[[int], None]:
    """A script naming a SQL-level prepared statement before and after a large literal (one
    simple Query, in a transaction block as for execute)."""

    def work(index: int) -> None:
        data = payload(index, size)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("PREPARE plus(int) AS SELECT $1 + 1")
            cur = conn.execute(b"EXECUTE plus(1); SELECT md5('" + data + b"'); EXECUTE plus(2)")
            rows = list(cur.fetchall())
            while cur.nextset():
                if cur.description is not None:
                    rows.extend(cur.fetchall())
            conn.execute("DEALLOCATE plus")
            conn.execute("COMMIT")
        if rows != [(2,), (hashlib.md5(data).hexdigest(),), (3,)]:
            raise RuntimeError(f"wrong answer to a script: {rows}")

    return work


def measure(pooler: Pooler, db: Database, clients: int, size: int) -> list[str]:
    """One row of the table for pooler (started here, stopped after)."""
    pooler.start()
    try:
        conninfo = dsn(pooler, db)
        at_once(clients, lambda _i: psycopg.connect(conninfo, autocommit=True).close())
        start = proc_status_kb(pooler.pid, "VmRSS")
        rises = []
        for workload in (bind, query, execute, script):
            reset_peak(pooler.pid)
            run.log(f"{pooler.name}: {workload.__name__} x {clients}, {size // MB} MB each")
            at_once(clients, workload(conninfo, size))
            rises.append(proc_status_kb(pooler.pid, "VmHWM") - start)
        held = (proc_status_kb(pooler.pid, "VmRSS")) - start
    finally:
        pooler.stop()
    mb = [f"{value / 1024:,.1f}" for value in (start, *rises, held)]
    return [pooler.name, *mb]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3, help="clients at once (3)")
    parser.add_argument("--mb", type=int, default=100, help="MB in each message (100)")
    parser.add_argument("--targets", default="pgbouncer,pgtarn", help="pgbouncer,pgtarn")
    add_postgres_options(parser)
    add_pgbouncer_option(parser)
    args = parser.parse_args(argv)
    args.clients = [args.clients]  # (Database reads a list)
    prepare_process()
    account = postgres_account()
    workdir = make_workdir("large", account)
    db = Database(args)
    poolers: list[Pooler] = []
    for target in args.targets.split(","):
        if target == "pgbouncer":
            try:
                binary = find_pgbouncer(args.pgbouncer)
            except PgBouncerMissing as exc:
                run.log(str(exc))
                continue
            poolers.append(Pooler("pgbouncer", [binary], workdir, db, account))
        elif target == "pgtarn":
            poolers.append(Pooler("pgtarn", [sys.executable, "-m", "pgtarn"], workdir, db, None))
    try:
        db.setup(scale=None)
        rows = [measure(pooler, db, args.clients[0], args.mb * MB) for pooler in poolers]
    finally:
        for pooler in poolers:
            pooler.stop()
        db.cleanup()
        remove_workdir(workdir, args.keep)
    mb = args.mb
    header = ["pooler", "RSS before (MB)", f"peak rise, Bind {mb} MB x {args.clients[0]}",
              f"peak rise, Query {mb} MB x {args.clients[0]}",
              f"peak rise, EXECUTE {mb} MB x {args.clients[0]}",
              f"peak rise, script {mb} MB x {args.clients[0]}", "held after"]  # fmt: skip
    print(run.markdown(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
