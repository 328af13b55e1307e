"""pgbench -S through pgtarn: a primary alone against a primary and its streaming replica.

Starts a primary and a standby (pg_basebackup -R), initialises pgbench's tables, and runs
pgbench -S through three pgtarn configurations, interleaved run by run:

- ``primary``: the primary alone (no split);
- ``split``: both servers, ``read_write_split = auto`` (reads on the replica and the primary);
- ``replica-only``: both servers, ``primary_reads = off`` (every read on the replica).

It prints the median TPS with its spread, pgtarn's CPU per 10,000 transactions, and where the
transactions ran (SHOW HOSTS' routed counts, or SHOW STATS_TOTALS without split). On one
small machine the servers share its cores: the numbers say what routing costs and where work
goes, not the throughput a second machine would add.

    python3 bench/replicas.py [--duration S] [--runs N] [--clients N]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import free_port, userlist_line
from tests.support.cluster import PrimaryCluster, StandbyCluster
from tests.support.process import PgtarnProcess

USER, PASSWORD, DB = "bench", "bench_pass", "bench"
SCALE = 10


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ran_on(
    proc: PgtarnProcess, primary: PrimaryCluster, standby: StandbyCluster
) -> tuple[int, int]:
    """Transactions routed so far to the primary and to the standby (SHOW HOSTS); without
    split, pgtarn's transaction count, all on the primary. (pg_stat_database's counts of
    a standby come late: an idle backend flushes them some seconds after its last query.)"""
    by_port = routed(proc)
    if by_port:
        return by_port.get(primary.port, 0), by_port.get(standby.port, 0)
    row = next(r for r in admin_rows(proc, "SHOW STATS_TOTALS") if r[0] == DB)
    return int(row[2]), 0


def routed(proc: PgtarnProcess) -> dict[int, int]:
    """port -> transactions routed, from SHOW HOSTS (empty without split)."""
    return {int(r[2]): int(r[-1]) for r in admin_rows(proc, "SHOW HOSTS")}


def admin_rows(proc: PgtarnProcess, command: str) -> list[list[str]]:
    """The rows of an admin console command (psql), each a list of its columns as text."""
    out = subprocess.run(
        ["psql", "-X", "-At", "-F", "|", proc.dsn(USER, PASSWORD, dbname="pgbouncer"),
         "-c", command],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line.split("|") for line in out.splitlines() if line]


def start_pgtarn(workdir: Path, entry: str) -> PgtarnProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (workdir / "userlist.txt").write_text(userlist_line(USER, PASSWORD) + "\n")
    ini = workdir / "pgtarn.ini"
    ini.write_text(f"""[databases]
{DB} = {entry}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir = {workdir}
auth_type = scram-sha-256
auth_file = {workdir / "userlist.txt"}
admin_users = {USER}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
logfile = {workdir / "pgtarn.log"}
""")
    return PgtarnProcess.launch(
        str(ini), host="127.0.0.1", port=port, workdir=str(workdir), socket_dir=str(workdir)
    )


def pgbench(proc: PgtarnProcess, clients: int, duration: int) -> float:
    out = subprocess.run(
        [
            "pgbench",
            "-n",
            "-S",
            "-c",
            str(clients),
            "-j",
            "2",
            "-T",
            str(duration),
            proc.dsn(USER, PASSWORD, dbname=DB),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"tps = ([\d.]+)", out)
    assert match, out
    return float(match.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--clients", type=int, default=20)
    args = p.parse_args()
    primary = PrimaryCluster()
    primary.start()
    standby = StandbyCluster(primary)
    procs: dict[str, PgtarnProcess] = {}
    try:
        primary.create_role(USER, PASSWORD)
        primary.psql(f"CREATE DATABASE {DB} OWNER {USER};")
        subprocess.run(
            ["pgbench", "-i", "-q", "-s", str(SCALE), primary.dsn(USER, PASSWORD, dbname=DB)],
            check=True,
            capture_output=True,
        )
        standby.start()
        hosts = f"host={primary.host},{standby.host} port={primary.port},{standby.port}"
        entries = {
            "primary": f"host={primary.host} port={primary.port} dbname={DB}",
            "split": f"{hosts} dbname={DB} read_write_split=auto",
            "replica-only": f"{hosts} dbname={DB} read_write_split=auto primary_reads=off",
        }
        work = Path(tempfile.mkdtemp(prefix="pgtarn-replicas-"))
        for name, entry in entries.items():
            procs[name] = start_pgtarn(work / name, entry)
            pgbench(procs[name], 2, 1)  # warm up: pools made, checks begun
        time.sleep(2)
        tps: dict[str, list[float]] = {name: [] for name in entries}
        cpu: dict[str, list[float]] = {name: [] for name in entries}
        where: dict[str, list[tuple[int, int]]] = {name: [] for name in entries}
        for run in range(args.runs):
            for name, proc in procs.items():
                before = ran_on(proc, primary, standby)
                cpu_before = cpu_seconds(proc.proc.pid)
                value = pgbench(proc, args.clients, args.duration)
                used = cpu_seconds(proc.proc.pid) - cpu_before
                after = ran_on(proc, primary, standby)
                tps[name].append(value)
                cpu[name].append(used / (value * args.duration) * 10_000)
                where[name].append((after[0] - before[0], after[1] - before[1]))
                print(f"run {run + 1} {name}: {value:,.0f} tps", flush=True)
        print(
            f"\npgbench -S, {args.clients} clients, {args.runs} x {args.duration} s, "
            f"scale {SCALE}, pool_size 20, one machine for all\n"
        )
        print(
            "| pgtarn | TPS median (min-max) | vs primary alone | CPU s / 10k tx "
            "| on primary | on replica |"
        )
        print("|---|---|---|---|---|---|")
        base = statistics.median(tps["primary"])
        for name in entries:
            on_primary = sum(w[0] for w in where[name])
            on_replica = sum(w[1] for w in where[name])
            total = max(1, on_primary + on_replica)
            print(
                f"| {name} | {statistics.median(tps[name]):,.0f} "
                f"({min(tps[name]):,.0f}-{max(tps[name]):,.0f}) "
                f"| {statistics.median(tps[name]) / base:.2f} "
                f"| {statistics.median(cpu[name]):.2f} "
                f"| {on_primary / total:.0%} | {on_replica / total:.0%} |"
            )
        for name in ("split", "replica-only"):
            print(f"SHOW HOSTS routed ({name}): {routed(procs[name])}")
    finally:
        for proc in procs.values():
            proc.stop()
        standby.cleanup()
        primary.cleanup()


if __name__ == "__main__":
    main()
