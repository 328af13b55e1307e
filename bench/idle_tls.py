"""Many idle clients over TLS + SCRAM (10,000): each pooler's memory, time to connect, CPU.

Each client: TCP connect, SSLRequest, TLS handshake, SCRAM login, one SELECT 1, then idle.
Logins run --batch at a time from one asyncio process; the pooler's CPU is read from /proc
around the connecting (its user + system time, the one number the client's own speed does
not move), its RSS and PSS with one client and with all of them.

  python3 bench/idle_tls.py                        # 10,000 clients, pgtarn and PgBouncer
  python3 bench/idle_tls.py --clients 2000 --targets pgtarn --workers 2
"""

from __future__ import annotations

import argparse
import ssl
import sys

from memory import MemoryResult, measure_memory
from run import (
    Database,
    PgBouncerMissing,
    Pooler,
    add_pgbouncer_option,
    add_postgres_options,
    ended,
    find_pgbouncer,
    finish,
    fmt,
    log,
    make_workdir,
    markdown,
    pgbouncer_version,
    pgtarn_build,
    postgres_account,
    prepare_process,
)
from tls_logins import tls_settings

#: Descriptors the bench needs beyond one per client (its own files, the cluster's psql).
FD_MARGIN = 200


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--clients", type=int, default=10_000, help="idle clients (10000)")
    p.add_argument("--batch", type=int, default=200, help="logins at a time (200)")
    p.add_argument("--runs", type=int, default=1, help="fresh pooler runs per target (1)")
    p.add_argument("--targets", default="pgtarn,pgbouncer", help="(pgtarn,pgbouncer)")
    p.add_argument("--workers", type=int, default=1, help="pgtarn's workers setting (1)")
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if set(args.targets) - {"pgtarn", "pgbouncer"} or args.clients < 2 or args.workers < 1:
        p.error("--targets: pgtarn and/or pgbouncer; --clients >= 2; --workers >= 1")
    return args


def client_context() -> ssl.SSLContext:
    """TLS for the clients: encryption without verifying the bench's own certificate, as
    libpq's sslmode=require."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def table(results: dict[str, list[MemoryResult]], labels: dict[str, str], clients: int) -> str:
    header = ["pooler", "RSS 1 client MB", f"RSS @{clients:,} MB", f"PSS @{clients:,} MB",
              "KB/client", "connect all s", "pooler CPU s", "CPU ms/login", "error"]  # fmt: skip
    rows = []
    for name, runs in results.items():
        for m in runs:
            cpu = m.cpu_seconds.get(clients)
            rows.append([
                labels[name], fmt(m.baseline_kb / 1024, ".1f"),
                fmt(m.rss_kb[clients] / 1024 if clients in m.rss_kb else None, ".1f"),
                fmt(m.pss_kb[clients] / 1024 if clients in m.pss_kb else None, ".1f"),
                fmt(m.kb_per_client.get(clients), ".2f"), fmt(m.open_seconds.get(clients), ".1f"),
                fmt(cpu, ".2f"), fmt(cpu / (clients - 1) * 1000 if cpu else None, ".3f"),
                m.error,
            ])  # fmt: skip
    return markdown(header, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    short = prepare_process(args.clients + FD_MARGIN, f"{args.clients:,} clients")
    if short:
        log(f"error: {short[0]}")
        return 2
    account = postgres_account()
    workdir = make_workdir("idle-tls", account)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [1]}))
    poolers: dict[str, Pooler] = {}
    labels: dict[str, str] = {}
    results: dict[str, list[MemoryResult]] = {}
    try:
        # every client here asks for TLS (and fails if refused); the verifier in auth_file:
        # no PBKDF2 per login on either pooler (as storm.py and tls_logins.py)
        settings = {**tls_settings(workdir, account), "max_client_conn": args.clients + 100}
        db.setup(scale=None)
        verifier = db.scram_verifier()
        for name in args.targets:
            if name == "pgbouncer":
                try:
                    binary = find_pgbouncer(args.pgbouncer)
                except PgBouncerMissing as exc:
                    log(str(exc))
                    continue
                poolers[name] = Pooler(name, [binary], workdir, db, account,
                                       settings=settings, secret=verifier)  # fmt: skip
                labels[name] = f"pgbouncer {pgbouncer_version(binary)}"
            else:
                extra = {"workers": args.workers} if args.workers > 1 else {}
                command = [sys.executable, "-m", "pgtarn"]
                poolers[name] = Pooler(name, command, workdir, db, None,
                                       settings={**settings, **extra}, secret=verifier)  # fmt: skip
                labels[name] = f"pgtarn {pgtarn_build()}" + (
                    f", workers = {args.workers}" if args.workers > 1 else ""
                )
        for run in range(args.runs):
            for name, pooler in poolers.items():
                log(f"[run {run + 1}/{args.runs}] {name}: {args.clients:,} TLS + SCRAM clients")
                processes = 1 + args.workers if name == "pgtarn" and args.workers > 1 else 1
                try:
                    pooler.start()
                    result = measure_memory(pooler.login(), pooler.pid, [args.clients],
                                            args.batch, processes, client_context())  # fmt: skip
                except RuntimeError as exc:
                    result = MemoryResult(error=str(exc).splitlines()[0])
                finally:
                    pooler.stop()
                results.setdefault(name, []).append(result)
        print(f"\n## {args.clients:,} idle clients over TLS + SCRAM ({args.batch} logins at "
              f"a time), PostgreSQL {db.version}\n")  # fmt: skip
        print(table(results, labels, args.clients))
        print(
            "\nconnect all: from the first to the last of the clients' logins (client-bound on a "
            "small machine: the clients' TLS handshakes share its cores). Pooler CPU: its user "
            "+ system time meanwhile. KB/client: (RSS with all - RSS with one) / clients added."
        )
        return 1 if any(m.error for runs in results.values() for m in runs) else 0
    except (RuntimeError, KeyboardInterrupt) as exc:  # includes ClusterError: setup failed
        return ended(exc)
    finally:
        finish(poolers.values(), db, workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
