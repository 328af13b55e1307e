"""Logins per second over TLS + SCRAM through pgtarn and PgBouncer (pgbench -C): one table."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import pwd
import re
import resource
import ssl
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from run import (
    BENCH_DB,
    BENCH_USER,
    SCALE,
    Database,
    PgBouncerMissing,
    Pooler,
    add_pgbouncer_option,
    add_postgres_options,
    clean_env,
    cpu_seconds,
    ended,
    find_pgbouncer,
    finish,
    fmt,
    log,
    make_workdir,
    markdown,
    parse_pgbench,
    postgres_account,
    prepare_process,
    version_of,
    write_json,
)
from storm import log_summary

import pgtarn

POOLERS = ("pgtarn", "pgbouncer")
PGBENCH_THREADS = 2
USAGE = """\
Every pgbench transaction (-C -S) is a new connection: TLS handshake, SCRAM login, one SELECT,
close; so pgbench's tps is logins per second. Variants: plaintext (the baseline), TLS, and TLS
with channel binding (SCRAM-SHA-256-PLUS, pgtarn only: PgBouncer 1.18 lacks it, one login
shows how it fails). Each run is a fresh pooler process; targets interleave.

  python3 bench/tls_logins.py                       # 8 clients, 3 runs of 10 s
  python3 bench/tls_logins.py --runs 5 --seconds 20 --json tls_logins.json
"""


@dataclass(frozen=True)
class Variant:
    """How pgbench connects: libpq settings appended to its connection string."""

    label: str
    libpq: str
    targets: tuple[str, ...] = POOLERS  # the others get one login that must fail


PLAINTEXT = Variant("plaintext", "sslmode=disable")
# channel_binding=disable: libpq's default (prefer) would use SCRAM-SHA-256-PLUS with pgtarn,
# which offers it, and plain SCRAM with PgBouncer, which does not: not the same login.
TLS = Variant("TLS", "sslmode=require channel_binding=disable")
TLS_PLUS = Variant("TLS + channel binding", "sslmode=require channel_binding=require",
                   targets=("pgtarn",))  # fmt: skip
VARIANTS = (PLAINTEXT, TLS, TLS_PLUS)


@dataclass
class Measurement:
    """One pgbench -C run of one variant against one pooler."""

    run: int
    variant: str
    target: str
    ok: bool = False
    error: str = ""
    logins_per_s: float | None = None  # pgbench's tps: one login per transaction with -C
    conn_ms: float | None = None  # pgbench's average connection time
    logins: int | None = None  # transactions actually processed
    pooler_cpu_s: float | None = None
    pgbench_cpu_s: float | None = None
    box_busy_pct: float | None = None  # all CPUs of the machine, during the run

    def per_1k_logins(self, cpu_s: float | None) -> float | None:
        return cpu_s / self.logins * 1000 if cpu_s is not None and self.logins else None


# --------------------------------------------------------------------------- certificates


def tls_settings(workdir: Path, account: pwd.struct_passwd | None) -> dict[str, object]:
    """The poolers' settings for TLS with the clients, on a certificate made for this run
    (make_certificates, into workdir/tls). `prefer`, not `require`: Pooler.start() checks
    readiness with a plaintext login, and a client asking for TLS gets it either way. No
    client_tls_ca_file: with one, both poolers ask clients for a certificate."""
    cert_file, key_file = make_certificates(workdir / "tls", account)
    return {
        "client_tls_sslmode": "prefer",
        "client_tls_cert_file": cert_file,
        "client_tls_key_file": key_file,
    }


def make_certificates(directory: Path, account: pwd.struct_passwd | None) -> tuple[Path, Path]:
    """A throwaway CA and a server certificate it signs for localhost and 127.0.0.1.

    Returns (certificate, key); both belong to `account` (PgBouncer runs as that user and
    must read its key). ca.crt is written too, for checking by hand with --keep.
    """
    directory.mkdir(mode=0o700, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=7))

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("pgtarn bench CA")).issuer_name(name("pgtarn bench CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid[0]).not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    server_key = ec.generate_private_key(ec.SECP256R1())
    hosts: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost")).issuer_name(ca_cert.subject)
        .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid[0]).not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(hosts), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    ca_path, cert_path, key_path = (directory / n for n in ("ca.crt", "server.crt", "server.key"))
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    cert_path.write_bytes(server_cert.public_bytes(pem))
    key_path.touch(mode=0o600)  # never readable by others, not even for a moment
    key_path.write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    if account is not None:
        for path in (directory, ca_path, cert_path, key_path):
            os.chown(path, account.pw_uid, account.pw_gid)
    return cert_path, key_path


# --------------------------------------------------------------------------- pgbench


def box_cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as fh:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, fh.readline().split()[1:9])
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return total - idle - iowait, total


def children_cpu_seconds() -> float:
    """User + system CPU of the waited-for children so far (pgbench, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def conninfo(pooler: Pooler, variant: Variant) -> str:
    """pgbench's/psql's database argument; the password goes in PGPASSWORD, never here."""
    return (f"host=127.0.0.1 port={pooler.port} user={BENCH_USER} dbname={BENCH_DB} "
            f"{variant.libpq}")  # fmt: skip


def pgbench_command(db: Database, pooler: Pooler, variant: Variant, clients: int,
                    limit: tuple[str, str]) -> list[str]:  # fmt: skip
    """pgbench -n -C -S; `limit` is ("-T", seconds) or ("-t", transactions per client)."""
    return [db.tool("pgbench"), "-n", "-C", "-S", *limit, "-c", str(clients),
            "-j", str(min(PGBENCH_THREADS, clients)), conninfo(pooler, variant)]  # fmt: skip


def first_problem(output: str) -> str:
    """pgbench's first error or abort line (its "pgbench: error: " prefix dropped)."""
    for line in output.splitlines():
        if "error" in line.lower() or "aborted" in line.lower():
            return re.sub(r"^pgbench: (?:error|fatal): ", "", line.strip())
    lines = output.strip().splitlines()
    return lines[-1] if lines else "no output"


def measure(db: Database, pooler: Pooler, variant: Variant, run: int,
            args: argparse.Namespace) -> Measurement:  # fmt: skip
    result = Measurement(run=run, variant=variant.label, target=pooler.name)
    cmd = pgbench_command(db, pooler, variant, args.clients, ("-T", str(args.seconds)))
    pooler_cpu_before, pgbench_cpu_before = cpu_seconds(pooler.pid), children_cpu_seconds()
    busy_before, total_before = box_cpu_ticks()
    try:
        res = subprocess.run(cmd, env=clean_env(PGPASSWORD=db.password), capture_output=True,
                             text=True, timeout=args.seconds + 120)  # fmt: skip
        output, code = res.stdout + res.stderr, res.returncode
    except subprocess.TimeoutExpired:
        output, code = "pgbench timed out", -1
    busy_after, total_after = box_cpu_ticks()
    result.pgbench_cpu_s = children_cpu_seconds() - pgbench_cpu_before
    if total_after > total_before:
        result.box_busy_pct = 100 * (busy_after - busy_before) / (total_after - total_before)
    assert pooler.proc is not None
    if pooler.proc.poll() is None:
        result.pooler_cpu_s = cpu_seconds(pooler.pid) - pooler_cpu_before
    else:
        output += f"\n{pooler.name} died (exit {pooler.proc.returncode})"
        code = code or -1
    numbers = parse_pgbench(output)
    result.logins_per_s = numbers.get("tps")
    result.conn_ms = numbers.get("conn_ms")
    result.logins = int(numbers["transactions"]) if "transactions" in numbers else None
    failed = int(numbers.get("failed", 0))
    if code != 0 or "error" in output.lower() or "aborted" in output.lower():
        result.error = f"{first_problem(output)} (exit {code})"
    elif failed:
        result.error = f"{failed} failed transactions"
    elif result.logins_per_s is None:
        result.error = f"pgbench reported no tps ({result.logins} transactions)"
    else:
        result.ok = True
    return result


def failing_login(db: Database, pooler: Pooler, variant: Variant) -> str:
    """One pgbench login that should fail: pgbench's error line, or what happened instead."""
    cmd = pgbench_command(db, pooler, variant, 1, ("-t", "1"))
    res = subprocess.run(cmd, env=clean_env(PGPASSWORD=db.password), capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    if res.returncode == 0:
        return "UNEXPECTEDLY LOGGED IN"
    return first_problem(res.stdout + res.stderr)


def negotiated_tls(db: Database, pooler: Pooler) -> str:
    """Protocol and cipher a libpq client gets from the pooler (psql's \\conninfo)."""
    res = subprocess.run([db.tool("psql"), "-X", "-c", r"\conninfo", conninfo(pooler, TLS)],
                         env=clean_env(PGPASSWORD=db.password), capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    found = re.search(r"SSL connection \((.*)\)", res.stdout)
    return found.group(1) if found else f"no TLS: {first_problem(res.stdout + res.stderr)}"


# --------------------------------------------------------------------------- runs


def probe(db: Database, poolers: dict[str, Pooler]) -> tuple[dict[str, str], dict[str, str]]:
    """Per pooler: the TLS it negotiates; per "variant, pooler" left out: how its login fails."""
    tls: dict[str, str] = {}
    refusals: dict[str, str] = {}
    for name, pooler in poolers.items():
        pooler.start()
        try:
            tls[name] = negotiated_tls(db, pooler)
            for variant in VARIANTS:
                if name not in variant.targets:
                    refusals[f"{variant.label}, {name}"] = failing_login(db, pooler, variant)
        finally:
            pooler.stop()
    return tls, refusals


def runs(args: argparse.Namespace, db: Database, poolers: dict[str, Pooler]) -> list[Measurement]:
    """Every variant against every pooler, a fresh process each; the first target alternates."""
    results: list[Measurement] = []
    names = list(poolers)
    for run in range(1, args.runs + 1):
        shift = (run - 1) % len(names)
        order = names[shift:] + names[:shift]
        for variant in VARIANTS:
            for name in order:
                if name not in variant.targets:
                    continue
                pooler = poolers[name]
                try:
                    pooler.start()
                    result = measure(db, pooler, variant, run, args)
                except RuntimeError as exc:  # the pooler did not start
                    result = Measurement(run, variant.label, name, error=str(exc))
                finally:
                    pooler.stop()
                results.append(result)
                outcome = (f"{result.logins_per_s:,.0f} logins/s" if result.ok
                           and result.logins_per_s else f"ERROR {result.error}")  # fmt: skip
                log(f"[run {run}/{args.runs}] {variant.label:<22} {name:<9} {outcome}")
    return results


# --------------------------------------------------------------------------- reporting


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: list[float], spec: str) -> str:
    return f"{format(min(values), spec)}-{format(max(values), spec)}" if values else "-"


def client_bound(results: list[Measurement], seconds: int) -> str | None:
    """A note when pgbench itself took most of the machine: then logins/s measure the client."""
    cpus = os.cpu_count() or 1
    shares = [r.pgbench_cpu_s / (seconds * cpus) for r in results
              if r.ok and r.pgbench_cpu_s is not None]  # fmt: skip
    share = median(shares)
    if share is None or share < 0.5:
        return None
    return (f"pgbench used a median {share:.0%} of all {cpus} CPUs (libpq's TLS handshake and "
            "SCRAM PBKDF2 on every login): logins/s are bounded by the client, compare the "
            "poolers by their CPU s/1k logins")  # fmt: skip


def table(results: list[Measurement], targets: list[str], refusals: dict[str, str]) -> str:
    header = ["variant", "target", "logins/s median", "min-max", "pgtarn/PgBouncer",
              "per-run ratios", "vs plaintext", "conn ms", "pooler CPU s/1k logins",
              "pgbench CPU s/1k logins", "box CPU busy %", "errors"]  # fmt: skip

    def good(variant: str, target: str) -> list[Measurement]:
        return [r for r in results if r.variant == variant and r.target == target and r.ok
                and r.logins_per_s is not None]  # fmt: skip

    def rates(variant: str, target: str) -> list[float]:
        return [r.logins_per_s for r in good(variant, target) if r.logins_per_s is not None]

    def per_run_ratios(variant: str) -> list[float]:
        mine = {r.run: r.logins_per_s for r in good(variant, "pgtarn")}
        theirs = {r.run: r.logins_per_s for r in good(variant, "pgbouncer")}
        return [m / t for run, m in mine.items() if m and (t := theirs.get(run))]

    rows = []
    for variant in VARIANTS:
        for target in targets:
            if target not in variant.targets:
                refusal = refusals.get(f"{variant.label}, {target}")
                rows.append([variant.label, target, "fails (below)" if refusal else "not run",
                             *["-"] * (len(header) - 3)])  # fmt: skip
                continue
            runs_here = [r for r in results if r.variant == variant.label and r.target == target]
            ok = good(variant.label, target)
            rate = median(rates(variant.label, target))
            pgbouncer = median(rates(variant.label, "pgbouncer"))
            plaintext = median(rates(PLAINTEXT.label, target))
            both = target == "pgtarn" and pgbouncer is not None
            pooler_cpu = [v for r in ok if (v := r.per_1k_logins(r.pooler_cpu_s)) is not None]
            client_cpu = [v for r in ok if (v := r.per_1k_logins(r.pgbench_cpu_s)) is not None]
            failed = len(runs_here) - len(ok)
            rows.append([
                variant.label, target, fmt(rate) if rate is not None else "error",
                spread(rates(variant.label, target), ",.0f"),
                f"{rate / pgbouncer:.2f}" if both and rate and pgbouncer else "",
                spread(per_run_ratios(variant.label), ".2f") if both else "",
                f"{rate / plaintext:.2f}" if variant != PLAINTEXT and rate and plaintext else "",
                fmt(median([r.conn_ms for r in ok if r.conn_ms is not None]), ".2f"),
                fmt(median(pooler_cpu), ".3f"), fmt(median(client_cpu), ".3f"),
                fmt(median([r.box_busy_pct for r in ok if r.box_busy_pct is not None]), ".0f"),
                f"{failed}/{len(runs_here)} failed" if failed else "",
            ])  # fmt: skip
    keep = [
        i
        for i, name in enumerate(header)
        if "pgbouncer" in targets or name not in ("pgtarn/PgBouncer", "per-run ratios")
    ]
    return markdown([header[i] for i in keep], [[row[i] for i in keep] for row in rows])


def report(args: argparse.Namespace, db: Database, versions: dict[str, str],
           tls: dict[str, str], refusals: dict[str, str], results: list[Measurement],
           logs: dict[str, dict[str, int]], notes: list[str]) -> None:  # fmt: skip
    where = "temporary cluster, fsync off" if db.cluster else f"{db.host}:{db.port}"
    threads = min(PGBENCH_THREADS, args.clients)
    print(
        f"\n## Logins/s over TLS + SCRAM: pgbench -n -C -S -c {args.clients} -j {threads} "
        f"-T {args.seconds}, {args.runs} run(s), targets interleaved; PostgreSQL "
        f"{versions['postgres']} ({where}); {os.cpu_count()} CPUs"
    )
    print(", ".join(f"{k} {v}" for k, v in versions.items() if k != "postgres"))
    print(
        "Poolers: transaction mode, auth_type = scram-sha-256 (auth_file: the SCRAM verifier), "
        "client_tls_sslmode = prefer, ECDSA P-256 certificate, server_tls_sslmode = disable"
    )
    for name, negotiated in tls.items():
        print(f"TLS negotiated by {name}: {negotiated}")
    print()
    print(table(results, list(tls), refusals))
    print(
        "\nlogins/s: pgbench's tps (with -C every transaction is a new connection: TLS "
        "handshake, SCRAM login, one SELECT, close). pgtarn/PgBouncer: ratio of the medians; "
        "per-run ratios: pgtarn / PgBouncer within each run. vs plaintext: median / the same "
        "pooler's plaintext median. conn ms: pgbench's average connection time. CPU s/1k "
        "logins: user+system CPU of the pooler process / of pgbench per 1,000 logins. box CPU "
        "busy: all CPUs of the machine, anything running on it included."
    )
    for what, line in refusals.items():
        print(f"- {what}: {line}")
    for r in results:
        if not r.ok:
            print(f"- error: run {r.run}, {r.variant}, {r.target}: {r.error}")
    for name, lines in logs.items():
        for line, count in lines.items():
            print(f"- {name}.log: {count:,} x {line}")
    for note in notes:
        print(f"note: {note}")
    write_json(args, versions, tls=tls, refusals=refusals,
               variants=[asdict(v) for v in VARIANTS], runs=[asdict(r) for r in results],
               pooler_logs=logs)  # fmt: skip


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--clients",
        type=int,
        default=8,
        metavar="N",
        help="concurrent pgbench clients, each reconnecting per transaction (8)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=3,
        metavar="N",
        help="runs of every variant against every pooler (3)",
    )
    p.add_argument(
        "--seconds", type=int, default=10, metavar="S", help="seconds per pgbench run (10)"
    )
    p.add_argument("--json", metavar="PATH", help="also write all raw numbers as JSON to PATH")
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args(argv)  # fmt: skip
    if args.clients < 1 or args.runs < 1 or args.seconds < 1:
        p.error("--clients, --runs and --seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_process()
    account = postgres_account()
    workdir = make_workdir("tls-logins", account)
    # Database reads args.clients as a list (its max_connections check)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.clients]}))
    poolers: dict[str, Pooler] = {}
    notes: list[str] = []
    try:
        settings = tls_settings(workdir, account)
        db.setup(scale=SCALE)
        # The verifier in auth_file (as storm.py): no PBKDF2 on the pooler, which PgBouncer
        # would run for every login given a plaintext password; PostgreSQL is reached by
        # SCRAM passthrough.
        verifier = db.scram_verifier()
        versions = {"postgres": db.version, "pgtarn": pgtarn.__version__,
                    "pgbench": version_of([db.tool("pgbench"), "--version"]),
                    "pgtarn's OpenSSL": ssl.OPENSSL_VERSION.removeprefix("OpenSSL ")}  # fmt: skip
        poolers["pgtarn"] = Pooler("pgtarn", [sys.executable, "-m", "pgtarn"], workdir, db,
                                   None, settings=settings, secret=verifier)  # fmt: skip
        try:
            binary = find_pgbouncer(args.pgbouncer)
        except PgBouncerMissing as exc:
            notes.append(str(exc))
        else:
            poolers["pgbouncer"] = Pooler("pgbouncer", [binary], workdir, db, account,
                                          settings=settings, secret=verifier)  # fmt: skip
            versions["PgBouncer"] = version_of([binary, "-V"])
            tls_line = re.search(
                r"^tls: (.*)$",
                subprocess.run([binary, "-V"], capture_output=True, text=True, check=False).stdout,
                re.M,
            )
            if tls_line:
                versions["PgBouncer's TLS"] = tls_line.group(1).strip()
        tls, refusals = probe(db, poolers)
        results = runs(args, db, poolers)
        logs = {name: log_summary(pooler.log_path) for name, pooler in poolers.items()}
        bound = client_bound(results, args.seconds)
        if bound:
            notes.append(bound)
        report(args, db, versions, tls, refusals, results, logs, notes)
        return 1 if any(not r.ok for r in results) else 0
    except (RuntimeError, KeyboardInterrupt) as exc:  # RuntimeError: a probe's pooler too
        return ended(exc)
    finally:
        finish(poolers.values(), db, workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
