"""Benchmark direct PostgreSQL, PgBouncer and pgtarn side by side with pgbench; print one table."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import pwd
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import PostgresNotFound, TempCluster, find_bindir, free_port, userlist_line
from memory import (
    Login,
    MemoryResult,
    check_login,
    measure_memory,
    proc_status_kb,
    process_tree,
)

import pgtarn
from pgtarn.errors import PgtarnError
from pgtarn.proto.build import quote_literal

PGBOUNCER = "/usr/sbin/pgbouncer"
BENCH_USER = "bench"
BENCH_DB = "bench"
SCALE = 10
MAX_CONNECTIONS = 700
READY_TIMEOUT = 15.0
TARGETS = ("direct", "pgbouncer", "pgtarn")
SET_ONCE_SCRIPT = Path(__file__).resolve().with_name("set_once.sql")
SELECT_1_SCRIPT = Path(__file__).resolve().with_name("select1.sql")
#: The pooler-bound workload's pool: PostgreSQL's cores, so that PostgreSQL is not the limit.
POOLER_BOUND_POOL = os.cpu_count() or 2


@dataclass(frozen=True)
class Workload:
    """pgbench arguments; `clients` empty means one case per --clients value."""

    name: str
    args: tuple[str, ...]
    clients: tuple[int, ...] = ()
    #: [pgbouncer] settings of the poolers for this workload
    settings: tuple[tuple[str, object], ...] = ()


WORKLOADS = [
    Workload("select-only", ("-S",)),
    Workload("select-only -C", ("-S", "-C"), clients=(50,)),  # a new connection per tx
    # PgBouncer before 1.21 (Debian's 1.18) does not support this: compare with direct too.
    Workload("select-only -M prepared", ("-S", "-M", "prepared"), clients=(100,)),
    # -S after a SET of search_path and statement_timeout in each client's first transaction
    Workload("set-once", ("-f", str(SET_ONCE_SCRIPT), "-D", "settings_done=0", "-s", str(SCALE))),
    # pooler-bound: the smallest statement, many clients, a pool of PostgreSQL's cores
    Workload(
        "select-1",
        ("-f", str(SELECT_1_SCRIPT)),
        clients=(200,),
        settings=(("default_pool_size", POOLER_BOUND_POOL),),
    ),
]


@dataclass(frozen=True)
class Case:
    """One workload at one client count."""

    label: str
    args: tuple[str, ...]
    clients: int
    settings: tuple[tuple[str, object], ...] = ()


@dataclass
class Result:
    """One pgbench run against one target."""

    run: int
    case: str
    clients: int
    target: str
    ok: bool = False
    error: str = ""
    tps: float | None = None
    conn_ms: float | None = None
    transactions: int | None = None
    failed_transactions: int | None = None
    cpu_s: float | None = None
    cpu_s_per_10k: float | None = None
    peak_rss_kb: int | None = None


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGSSLMODE="disable", PGGSSENCMODE="disable", **extra)
    return env


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes that are still there."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def postgres_account() -> pwd.struct_passwd | None:
    """The account that runs PostgreSQL's tools and PgBouncer when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        sys.exit("running as root needs a `postgres` system user for initdb and pgbouncer")


# --------------------------------------------------------------------------- PostgreSQL


class Database:
    """The PostgreSQL under test: a TempCluster, or an existing server (--pg-host)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cluster: TempCluster | None = None
        self.password = secrets.token_urlsafe(16)
        self.host: str = args.pg_host or "127.0.0.1"
        self.port: int = args.pg_port
        self.created: list[str] = []
        self.version = ""
        try:
            self.bindir: str | None = find_bindir()
        except PostgresNotFound:  # TempCluster() says so; with --pg-host, tools from PATH
            self.bindir = None

    def tool(self, name: str) -> str:
        if self.bindir and (Path(self.bindir) / name).is_file():
            return str(Path(self.bindir) / name)
        found = shutil.which(name)
        if not found:
            sys.exit(f"{name} not found; install PostgreSQL's client tools")
        return found

    def scram_verifier(self) -> str:
        """The bench role's SCRAM verifier, for an auth_file that needs no PBKDF2 per login."""
        verifier = self.sql(
            f"SELECT rolpassword FROM pg_authid WHERE rolname = '{BENCH_USER}'"
        ).strip()
        if not verifier.startswith("SCRAM-SHA-256$"):
            raise RuntimeError(f"role {BENCH_USER} has no SCRAM verifier: {verifier[:20]!r}")
        return verifier

    def sql(self, statement: str, dbname: str | None = None) -> str:
        if self.cluster is not None:
            return self.cluster.psql(statement, dbname=dbname or "postgres")
        env = clean_env()
        password = self.args.pg_password or os.environ.get("PGPASSWORD")
        if password:
            env["PGPASSWORD"] = password
        cmd = [self.tool("psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
               "-h", self.host, "-p", str(self.port), "-U", self.args.pg_user,
               "-d", dbname or self.args.pg_dbname, "-c", statement]  # fmt: skip
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise RuntimeError(f"psql failed: {res.stderr.strip()}\nSQL: {statement}")
        return res.stdout

    def setup(self, scale: int | None = SCALE, max_connections: int = MAX_CONNECTIONS) -> None:
        """Create role and database bench; `pgbench -i -s scale` unless scale is None.

        A temporary cluster gets `max_connections`; an existing server keeps its own.
        """
        if not self.args.pg_host:
            log("creating a temporary PostgreSQL cluster ...")
            self.cluster = TempCluster()
            self.cluster.start()
            self.cluster.psql(f"ALTER SYSTEM SET max_connections = {max_connections}")
            self.cluster.stop()
            self.cluster.start()
            self.host, self.port = self.cluster.host, self.cluster.port
        max_conn = int(self.sql("SHOW max_connections").strip())
        if max_conn < max(self.args.clients) + 25:
            log(f"warning: max_connections is {max_conn}; the direct runs may fail")
        self.version = self.sql("SHOW server_version").strip()
        exists = self.sql(
            f"SELECT 'role' FROM pg_roles WHERE rolname = '{BENCH_USER}' UNION ALL "
            f"SELECT 'database' FROM pg_database WHERE datname = '{BENCH_DB}'"
        ).split()
        if exists:  # only on an existing server: never touch what we did not create
            raise RuntimeError(
                f"{' and '.join(exists)} {BENCH_USER!r} already exist(s) on "
                f"{self.host}:{self.port}; drop them or use another server"
            )
        self.sql(
            f"SET password_encryption = 'scram-sha-256'; "
            f"CREATE ROLE {BENCH_USER} LOGIN PASSWORD {quote_literal(self.password)}"
        )
        self.created.append("role")
        self.sql(f"CREATE DATABASE {BENCH_DB} OWNER {BENCH_USER}")
        self.created.append("database")
        if scale is None:
            return
        log(f"pgbench -i -s {scale} ...")
        res = subprocess.run(
            [self.tool("pgbench"), "-i", "-q", "-s", str(scale), "-h", self.host,
             "-p", str(self.port), "-U", BENCH_USER, BENCH_DB],
            env=clean_env(PGPASSWORD=self.password), capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"pgbench -i failed: {res.stderr.strip()[-2000:]}")

    def cleanup(self) -> None:
        if self.cluster is not None:
            if self.args.keep:
                log(f"kept the cluster's directory: {self.cluster.keep()}")
            else:
                self.cluster.cleanup()
            return
        with contextlib.suppress(Exception):
            if "database" in self.created:
                self.sql(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
            if "role" in self.created:
                self.sql(f"DROP ROLE IF EXISTS {BENCH_USER}")


# --------------------------------------------------------------------------- poolers


class PgBouncerMissing(Exception):
    """No PgBouncer binary to compare against; the message says what is missing."""


def find_pgbouncer(path: str | None) -> str:
    """The PgBouncer binary to start: `path` (--pgbouncer), else the one on PATH, else
    Debian's. Nothing is ever installed: a missing binary is said, for the caller to skip."""
    if path is not None:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise PgBouncerMissing(f"--pgbouncer {path}: no executable file there")
        return os.path.abspath(path)
    found = shutil.which("pgbouncer") or (PGBOUNCER if os.access(PGBOUNCER, os.X_OK) else None)
    if found is None:
        raise PgBouncerMissing(
            "no pgbouncer on PATH (nor " + PGBOUNCER + "): PgBouncer skipped; build one "
            "(docs/benchmarks.md) and pass --pgbouncer PATH, or install your distribution's package"
        )
    return found


def pgbouncer_version(binary: str) -> str:
    """PgBouncer's version as `pgbouncer -V` prints it (1.25.2)."""
    return version_of([binary, "-V"])


def add_pgbouncer_option(p: argparse.ArgumentParser, *, repeat: bool = False) -> None:
    """--pgbouncer PATH, the binary to compare against (shared by the scripts that start it)."""
    more = "; again for another version (a column each, the first is the ratios' base)"
    p.add_argument(
        "--pgbouncer",
        metavar="PATH",
        action="append" if repeat else "store",
        help="the PgBouncer binary to compare against (default: pgbouncer on PATH, else "
        + PGBOUNCER
        + "; never installed by the bench)"
        + (more if repeat else ""),
    )


class Pooler:
    """PgBouncer or pgtarn on the same pgbouncer.ini settings; one fresh process per start()."""

    def __init__(self, name: str, command: list[str], workdir: Path, db: Database,
                 account: pwd.struct_passwd | None, *, settings: dict[str, object] | None = None,
                 secret: str | None = None, env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name = name
        self.env = env or {}  # over the bench's environment (another build's PYTHONPATH)
        self.command = command
        self.workdir = workdir
        self.db = db
        self.account = account  # run as this user (PgBouncer refuses root)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = workdir / f"{name}.log"
        self.settings = settings or {}  # [pgbouncer] settings over the defaults below
        self.secret = secret  # auth_file secret (e.g. a SCRAM verifier); default: the password

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def login(self) -> Login:
        return Login("127.0.0.1", self.port, BENCH_USER, self.db.password, BENCH_DB)

    def _write_config(self, extra: dict[str, object]) -> Path:
        userlist = self.workdir / "userlist.txt"
        secret = self.secret or self.db.password
        userlist.write_text(userlist_line(BENCH_USER, secret), encoding="utf-8")
        settings: dict[str, object] = {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": self.workdir,
            "auth_type": "scram-sha-256",
            "auth_file": userlist,
            "pool_mode": "transaction",
            "default_pool_size": 20,
            "max_client_conn": 10000,
            "server_tls_sslmode": "disable",
            "log_connections": 0,
            "log_disconnections": 0,
            **self.settings,
            **extra,
        }
        ini = self.workdir / f"{self.name}.ini"
        ini.write_text(
            "[databases]\n"
            f"{BENCH_DB} = host={self.db.host} port={self.db.port} dbname={BENCH_DB}\n\n"
            "[pgbouncer]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()),
            encoding="utf-8",
        )
        if self.account is not None:
            for path in (userlist, ini):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)
                path.chmod(0o600)
        return ini

    def start(self, settings: tuple[tuple[str, object], ...] = ()) -> None:
        self.port = free_port()
        ini = self._write_config(dict(settings))
        acct = self.account
        env = dict(os.environ, **self.env)
        if acct is not None:
            env.update(HOME=acct.pw_dir, USER=acct.pw_name, LOGNAME=acct.pw_name)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [*self.command, str(ini)], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                cwd=self.workdir, env=env, start_new_session=True,
                user=acct.pw_uid if acct else None, group=acct.pw_gid if acct else None,
                extra_groups=[] if acct else None,
            )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                check_login(self.login(), timeout=2.0)
                break
            except (OSError, PgtarnError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} not ready in {READY_TIMEOUT}s: {exc}\n"
                                       f"{self.tail()}") from exc  # fmt: skip
                time.sleep(0.1)
        comm = Path(f"/proc/{self.pid}/comm").read_text().strip()
        if self.name.startswith("pgbouncer") and comm != "pgbouncer":
            raise RuntimeError(f"pid {self.pid} is {comm!r}, not pgbouncer")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def warnings(self) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return sorted({re.sub(r"^.*?\[\d+\] ", "", line) for line in text.splitlines()
                       if "WARNING" in line or "file descriptor limit" in line})  # fmt: skip


# --------------------------------------------------------------------------- pgbench


PGBENCH_NUMBERS = {
    "tps": r"^tps = ([\d.]+)",
    "conn_ms": r"^(?:initial|average) connection time = ([\d.]+) ms",
    "transactions": r"^number of transactions actually processed: (\d+)",
    "failed": r"^number of failed transactions: (\d+)",
}


def parse_pgbench(out: str) -> dict[str, float]:
    found = {key: re.search(rx, out, re.M) for key, rx in PGBENCH_NUMBERS.items()}
    return {key: float(m.group(1)) for key, m in found.items() if m}


def run_case(db: Database, case: Case, target: str, pooler: Pooler | None, run: int,
             duration: int) -> Result:  # fmt: skip
    result = Result(run=run, case=case.label, clients=case.clients, target=target)
    host, port = (db.host, db.port) if pooler is None else ("127.0.0.1", pooler.port)
    cmd = [
        db.tool("pgbench"),
        "-n",
        *case.args,
        "-j",
        "2",
        "-T",
        str(duration),
        "-c",
        str(case.clients),
        "-h",
        host,
        "-p",
        str(port),
        "-U",
        BENCH_USER,
        BENCH_DB,
    ]
    # a pgtarn with workers: the supervisor and every worker (all started before the run)
    tree = process_tree(pooler.pid) if pooler else []
    cpu_before = tree_cpu_seconds(tree)
    try:
        res = subprocess.run(cmd, env=clean_env(PGPASSWORD=db.password), capture_output=True,
                             text=True, timeout=duration + 180)  # fmt: skip
        out, code = res.stdout + res.stderr, res.returncode
    except subprocess.TimeoutExpired:
        out, code = "pgbench timed out", -1
    if pooler is not None and pooler.proc is not None and pooler.proc.poll() is None:
        result.cpu_s = tree_cpu_seconds(tree) - cpu_before
        result.peak_rss_kb = sum(
            proc_status_kb(pid, "VmHWM") for pid in tree if os.path.exists(f"/proc/{pid}")
        )
    elif pooler is not None:
        out += f"\n{pooler.name} died (exit {pooler.proc and pooler.proc.returncode})"
        code = code or -1
    nums = parse_pgbench(out)
    result.tps = nums.get("tps")
    result.conn_ms = nums.get("conn_ms")
    result.transactions = int(nums["transactions"]) if "transactions" in nums else None
    result.failed_transactions = int(nums.get("failed", 0))
    if result.cpu_s is not None and result.transactions:
        result.cpu_s_per_10k = result.cpu_s / result.transactions * 10_000
    problems = [line.strip() for line in out.splitlines()
                if "error" in line.lower() or "aborted" in line.lower()]  # fmt: skip
    if problems or code != 0:
        first = problems[0] if problems else (out.strip().splitlines() or ["no output"])[-1]
        result.error = f"{first} (exit {code})"
    elif result.failed_transactions:
        result.error = f"{result.failed_transactions} failed transactions"
    elif result.tps is None:
        result.error = f"pgbench reported no tps ({result.transactions} transactions)"
    else:
        result.ok = True
    return result


def cases(clients: list[int], workloads: list[str]) -> list[Case]:
    return [Case(f"{w.name}, {n} clients", w.args, n, w.settings)
            for w in WORKLOADS if w.name in workloads
            for n in w.clients or clients]  # fmt: skip


# --------------------------------------------------------------------------- reporting


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def tps_table(results: list[Result], case_list: list[Case], targets: list[str],
              labels: dict[str, str]) -> str:  # fmt: skip
    header = ["workload", "target", "TPS median", "min-max", "pgtarn/PgBouncer", "vs direct",
              "CPU s/10k tx", "conn ms", "peak RSS MB", "errors"]  # fmt: skip
    tps_ok = {(c.label, t): [r.tps for r in results if r.case == c.label and r.target == t
                             and r.ok and r.tps is not None]
              for c in case_list for t in targets}  # fmt: skip
    medians = {key: statistics.median(tps) if tps else None for key, tps in tps_ok.items()}

    def ratio(label: str, target: str, other: str) -> str:
        mine, base = medians.get((label, target)), medians.get((label, other))
        return f"{mine / base:.2f}" if mine and base else "-"

    rows = []
    for case in case_list:
        for target in targets:
            runs = [r for r in results if r.case == case.label and r.target == target]
            good = [r for r in runs if r.ok]
            tps = tps_ok[case.label, target]
            cpu = [r.cpu_s_per_10k for r in good if r.cpu_s_per_10k is not None]
            conn = [r.conn_ms for r in good if r.conn_ms is not None]
            rss = [r.peak_rss_kb for r in runs if r.peak_rss_kb is not None]
            bad = len(runs) - len(good)
            rows.append([
                case.label, labels.get(target, target),
                fmt(medians[case.label, target]) if tps else "error",
                f"{min(tps):,.0f}-{max(tps):,.0f}" if tps else "-",
                ratio(case.label, target, "pgbouncer") if target.startswith("pgtarn") else "",
                ratio(case.label, target, "direct") if target != "direct" else "",
                fmt(statistics.median(cpu) if cpu else None, ".2f"),
                fmt(statistics.median(conn) if conn else None, ".1f"),
                fmt(max(rss) / 1024 if rss else None, ".1f"),
                f"{bad}/{len(runs)} failed" if bad else "",
            ])  # fmt: skip
    unused = set() if {"pgtarn", "pgbouncer"} <= set(targets) else {"pgtarn/PgBouncer"}
    if "direct" not in targets or len(targets) == 1:
        unused.add("vs direct")
    keep = [i for i, name in enumerate(header) if name not in unused]
    return markdown([header[i] for i in keep], [[row[i] for i in keep] for row in rows])


def memory_table(memory: dict[str, MemoryResult], levels: list[int],
                 labels: dict[str, str]) -> str:  # fmt: skip
    last = max(levels)
    header = ["pooler", "RSS 1 client MB", "PSS 1 client MB",
              *(f"KB/client @{n:,}" for n in levels), f"RSS @{last:,} MB", f"PSS @{last:,} MB",
              "error"]  # fmt: skip
    rows = []
    for name, m in memory.items():
        rows.append([labels.get(name, name), fmt(m.baseline_kb / 1024, ".1f"),
                     fmt(m.baseline_pss_kb / 1024, ".1f"),
                     *(fmt(m.kb_per_client.get(n), ".1f") for n in levels),
                     fmt(m.rss_kb[last] / 1024 if last in m.rss_kb else None, ".1f"),
                     fmt(m.pss_kb[last] / 1024 if last in m.pss_kb else None, ".1f"),
                     m.error])  # fmt: skip
    return markdown(header, rows)


def worker_steps(memory: dict[str, MemoryResult]) -> list[str]:
    """What each further worker adds to pgtarn's PSS with one client (workers = N vs the
    next smaller N measured; from 1 to 2 that includes the supervisor)."""
    pss = {}
    for name, m in memory.items():
        if m.baseline_pss_kb and (name == "pgtarn" or name.startswith("pgtarn-w")):
            pss[1 if name == "pgtarn" else int(name[8:])] = m.baseline_pss_kb / 1024
    steps = []
    for a, b in itertools.pairwise(sorted(pss)):
        added = pss[b] - pss[a]
        steps.append(f"PSS with one client, workers {a} -> {b}: +{added:.1f} MB "
                     f"({added / (b - a):.1f} MB per worker)")  # fmt: skip
    return steps


def process_table(memory: dict[str, MemoryResult], labels: dict[str, str]) -> str:
    """RSS and PSS of each process with one client: a supervisor and its workers apart."""
    rows = [[labels.get(name, name), p.role, fmt(p.rss_kb / 1024, ".1f"),
             fmt(p.pss_kb / 1024, ".1f")]
            for name, m in memory.items() for p in m.processes]  # fmt: skip
    return markdown(["pooler", "process", "RSS MB", "PSS MB"], rows)


# --------------------------------------------------------------------------- main


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_postgres_options(p: argparse.ArgumentParser) -> None:
    """--keep and the --pg-* options Database reads (shared with storm.py and soak.py)."""
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    g = p.add_argument_group(
        "use an existing PostgreSQL instead of a temporary cluster "
        "(creates and at the end drops role and database bench)"
    )
    g.add_argument("--pg-host")
    g.add_argument("--pg-port", type=int, default=5432, help="(5432)")
    g.add_argument("--pg-user", default="postgres", help="a superuser (postgres)")
    g.add_argument("--pg-password", help="(default: $PGPASSWORD)")
    g.add_argument("--pg-dbname", default="postgres", help="(postgres)")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration", type=int, metavar="S", help="seconds per pgbench run (10)")
    p.add_argument("--runs", type=int, metavar="N", help="runs of every workload (3)")
    p.add_argument(
        "--clients",
        type=int_list,
        metavar="LIST",
        help="client counts for select-only and set-once (10,100,500)",
    )
    p.add_argument(
        "--targets",
        type=lambda t: t.split(","),
        default=list(TARGETS),
        metavar="LIST",
        help="any of " + ",".join(TARGETS) + " (all)",
    )
    p.add_argument(
        "--workloads",
        type=lambda t: [w.strip() for w in t.split(",")],
        default=[w.name for w in WORKLOADS],
        metavar="LIST",
        help="any of: " + ", ".join(w.name for w in WORKLOADS) + " (all)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the idle-client memory run")
    p.add_argument(
        "--memory-clients",
        type=int_list,
        metavar="LIST",
        help="idle-client totals for the memory run (10,1000,5000)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="defaults for a smoke test: "
        "--duration 3 --runs 1 --clients 10,100 --memory-clients 10,200",
    )
    p.add_argument("--json", metavar="PATH", help="also write all raw numbers as JSON to PATH")
    p.add_argument(
        "--workers",
        type=int_list,
        default=[1],
        metavar="LIST",
        help="pgtarn's workers setting: one pgtarn target per value (1); "
        "pgtarn-wN is pgtarn with workers = N",
    )
    p.add_argument(
        "--pgtarn-build",
        action="append",
        default=[],
        metavar="DIR",
        help="another pgtarn build (a directory with the pgtarn package, e.g. made by "
        "`pip install --target DIR .`) as a further target pgtarn-bN after pgtarn, in the "
        "same interleaved runs: before/after a change in one sitting; repeatable",
    )
    add_pgbouncer_option(p, repeat=True)
    add_postgres_options(p)
    args = p.parse_args(argv)
    defaults = {"duration": (10, 3), "runs": (3, 1), "clients": ([10, 100, 500], [10, 100]),
                "memory_clients": ([10, 1000, 5000], [10, 200])}  # fmt: skip
    for key, (full, quick) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if set(args.workloads) - {w.name for w in WORKLOADS} or not args.workloads:
        p.error("--workloads: choose from " + ", ".join(w.name for w in WORKLOADS))
    unknown = {t for t in args.targets if not t.startswith("pgtarn-w")} - set(TARGETS)
    if unknown or not args.targets:
        p.error(f"--targets: choose from {', '.join(TARGETS)}")
    if not args.clients or not args.memory_clients or min(args.memory_clients) < 2:
        p.error("--clients needs a value; --memory-clients values must be at least 2")
    if not args.workers or min(args.workers) < 1:
        p.error("--workers: values of at least 1")
    if "pgtarn" in args.targets:  # pgtarn-wN after pgtarn, for each N > 1
        at = args.targets.index("pgtarn")
        if 1 not in args.workers:
            args.targets.remove("pgtarn")
            at -= 1
        for n in sorted(set(args.workers) - {1}):
            at += 1
            args.targets.insert(at, f"pgtarn-w{n}")
    for n, build in enumerate(args.pgtarn_build, 1):
        if not (Path(build) / "pgtarn" / "__init__.py").is_file():
            p.error(f"--pgtarn-build: no pgtarn package in {build}")
        args.targets.append(f"pgtarn-b{n}")
    return args


def pgtarn_build(env: dict[str, str] | None = None) -> str:
    """The pgtarn the runs start, as its --version says it ("0.1.0, compiled")."""
    out = subprocess.run(
        [sys.executable, "-m", "pgtarn", "--version"], capture_output=True, text=True,
        check=False, env=dict(os.environ, **(env or {})),
    ).stdout  # fmt: skip
    m = re.search(r"\(pgtarn ([^)]*)\)", out)
    return m.group(1) if m else pgtarn.__version__


def version_of(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    m = re.search(r"\d+(?:\.\d+)+", out)
    return m.group(0) if m else out.strip()


def tps_runs(args: argparse.Namespace, db: Database, poolers: dict[str, Pooler],
             case_list: list[Case]) -> list[Result]:  # fmt: skip
    """Every case against every target, interleaved: the target order rotates each run."""
    results: list[Result] = []
    for run in range(1, args.runs + 1):
        shift = (run - 1) % len(args.targets)
        order = args.targets[shift:] + args.targets[:shift]
        for case in case_list:
            for target in order:
                pooler = poolers.get(target)
                try:
                    if pooler is not None:
                        pooler.start(case.settings)
                    result = run_case(db, case, target, pooler, run, args.duration)
                except RuntimeError as exc:  # the pooler did not start
                    result = Result(run, case.label, case.clients, target, error=str(exc))
                finally:
                    if pooler is not None:
                        pooler.stop()
                results.append(result)
                outcome = f"{result.tps:,.0f} tps" if result.ok and result.tps else "ERROR"
                log(f"[run {run}/{args.runs}] {case.label:<32} {target:<9} {outcome} "
                    f"{result.error}")  # fmt: skip
    return results


def memory_runs(args: argparse.Namespace, poolers: dict[str, Pooler]) -> dict[str, MemoryResult]:
    """Each pooler fresh: one warm client, then idle clients up to each --memory-clients total.
    A pgtarn with workers is measured whole: the supervisor and each worker."""
    memory: dict[str, MemoryResult] = {}
    for name, pooler in poolers.items():
        processes = 1 + int(name[8:]) if name.startswith("pgtarn-w") else 1
        log(f"memory run: {name}, idle clients up to {max(args.memory_clients):,} ...")
        try:
            pooler.start()
            memory[name] = measure_memory(
                pooler.login(), pooler.pid, args.memory_clients, processes=processes
            )
        except RuntimeError as exc:
            memory[name] = MemoryResult(error=str(exc).splitlines()[0])
        finally:
            pooler.stop()
    return memory


def report(args: argparse.Namespace, db: Database, versions: dict[str, str],
           case_list: list[Case], results: list[Result], memory: dict[str, MemoryResult],
           notes: list[str], labels: dict[str, str]) -> None:  # fmt: skip
    where = "temporary cluster, fsync off" if db.cluster else f"{db.host}:{db.port}"
    print(
        f"\n## pgbench -j 2, {args.duration} s x {args.runs} run(s), targets interleaved; "
        f"PostgreSQL {versions['postgres']} ({where}), scale {SCALE}, {os.cpu_count()} CPUs"
    )
    print(", ".join(f"{k} {v}" for k, v in versions.items() if k != "postgres") + "\n")
    print(tps_table(results, case_list, args.targets, labels))
    print(
        "\nTPS: pgbench's tps (without initial connection time; with -C including the "
        "connections). conn ms: pgbench's initial connection time (with -C: average "
        "connection time).\nCPU s/10k tx: pooler process user+system CPU during the run per "
        "10,000 transactions. Peak RSS: pooler VmHWM, max over runs."
    )
    if any(c.label.startswith("set-once") for c in case_list):
        print(
            "\nset-once: PgBouncer does not keep a client's search_path and "
            "statement_timeout with the client: each SET stays on the server that ran it, "
            "and the clients that get that server later run with it. PgBouncer is faster "
            "here because it leaks the settings instead of setting them again on a client's "
            "next server."
        )
    for r in results:
        if not r.ok:
            print(f"- error: run {r.run}, {r.case}, {r.target}: {r.error}")
    if memory:
        print(
            "\n## Idle clients (SCRAM login + SELECT 1 each, then idle); KB/client = "
            "(RSS - RSS with 1 client) / clients added\n"
        )
        print(memory_table(memory, sorted(args.memory_clients), labels))
        print(
            "\nWith one client, each process: PSS counts a page shared by k processes as 1/k "
            "(a worker's share of what it has in common with the supervisor and the others)\n"
        )
        print(process_table(memory, labels))
        for line in worker_steps(memory):
            print(line)
    for note in notes:
        print(f"note: {note}")
    write_json(args, versions, runs=[asdict(r) for r in results],
               memory={k: asdict(v) for k, v in memory.items()})  # fmt: skip


def write_json(args: argparse.Namespace, versions: dict[str, str], **numbers: object) -> None:
    """With --json PATH: the run's settings (the password left out), the versions, the CPU
    count and the numbers, as JSON."""
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "pg_password"}
        data = {"settings": settings, "versions": versions, "cpus": os.cpu_count(), **numbers}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def prepare_process(need: int = 0, what: str = "") -> list[str]:
    """Every file descriptor the hard limit allows; SIGINT/SIGTERM end the run cleanly.
    Returned: a note if the hard limit is below the `need` descriptors of `what`."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for sig in (signal.SIGINT, signal.SIGTERM):  # not default_int_handler: asyncio.run would
        signal.signal(sig, interrupt)  # turn it into a task cancellation, which can get lost
    if hard >= need:
        return []
    return [f"the open file limit is {hard:,}; {what} need {need:,} (raise the hard limit: "
            "ulimit -Hn)"]  # fmt: skip


def make_workdir(name: str, account: pwd.struct_passwd | None) -> Path:
    """A fresh directory under /tmp, owned by the account the poolers run as (if any)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"pgtarn-{name}-", dir="/tmp"))
    if account is not None:
        os.chown(workdir, account.pw_uid, account.pw_gid)
    return workdir


def remove_workdir(workdir: Path, keep: bool) -> None:
    if keep:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def ended(exc: BaseException) -> int:
    """The exit code of a run that a RuntimeError (a ClusterError too: the setup failed) or
    an interrupt ended, said: 1 or 130."""
    if isinstance(exc, RuntimeError):
        log(f"error: {exc}")
        return 1
    log("interrupted")
    return 130


def finish(poolers: Iterable[Pooler | None], db: Database, workdir: Path, keep: bool) -> None:
    """The end of a run however it ended: the poolers stopped, the cluster cleaned up (the
    bench's database dropped, a temporary cluster removed), the work directory removed."""
    for pooler in poolers:
        if pooler is not None:
            pooler.stop()
    db.cleanup()
    remove_workdir(workdir, keep)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes = prepare_process(max(args.memory_clients) + 100, "the memory run's clients")
    account = postgres_account()
    workdir = make_workdir("bench", account)
    db = Database(args)
    poolers: dict[str, Pooler] = {}
    versions: dict[str, str] = {}
    labels: dict[str, str] = {}  # target -> its name in the tables (PgBouncer's version)
    try:
        if "pgbouncer" in args.targets:
            at = args.targets.index("pgbouncer")
            args.targets.remove("pgbouncer")
            for path in args.pgbouncer or [None]:
                try:
                    binary = find_pgbouncer(path)
                except PgBouncerMissing as exc:
                    if path is not None:  # asked for by name: no run without it
                        log(f"error: {exc}")
                        return 2
                    notes.append(str(exc))
                    log(str(exc))
                    continue
                # the first is "pgbouncer" (the ratios' base), others by their version
                name = "pgbouncer" if "pgbouncer" not in poolers else f"pgbouncer-{at}"
                poolers[name] = Pooler(name, [binary], workdir, db, account)
                versions[name] = pgbouncer_version(binary)
                labels[name] = f"pgbouncer {versions[name]}"
                args.targets.insert(at, name)
                at += 1
        command = [sys.executable, "-m", "pgtarn"]
        for target in args.targets:
            if target == "pgtarn":
                poolers[target] = Pooler(target, command, workdir, db, None)
            elif target.startswith("pgtarn-w"):
                poolers[target] = Pooler(
                    target, command, workdir, db, None, settings={"workers": int(target[8:])}
                )
            elif target.startswith("pgtarn-b"):
                build = str(Path(args.pgtarn_build[int(target[8:]) - 1]).resolve())
                env = {"PYTHONPATH": os.pathsep.join(
                    [build, *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
                poolers[target] = Pooler(target, command, workdir, db, None, env=env)
                versions[target] = pgtarn_build(env)
                labels[target] = f"pgtarn {Path(build).name} ({versions[target]})"
        db.setup()
        versions.update(postgres=db.version, pgtarn=pgtarn_build(),
                        pgbench=version_of([db.tool("pgbench"), "--version"]))  # fmt: skip
        case_list = cases(args.clients, args.workloads)
        results = tps_runs(args, db, poolers, case_list)
        memory = {} if args.no_memory else memory_runs(args, poolers)
        for pooler in poolers.values():
            notes += [f"{pooler.name} logged: {w}" for w in pooler.warnings()]
        report(args, db, versions, case_list, results, memory, notes, labels)
        return 1 if any(not r.ok for r in results) else 0
    except (RuntimeError, KeyboardInterrupt) as exc:  # includes ClusterError: setup failed
        return ended(exc)
    finally:
        finish(poolers.values(), db, workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
