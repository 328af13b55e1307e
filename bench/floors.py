"""The floors under the performance targets: what the runtime and this machine cost a pooler
before pgtarn does any work of its own.

Three measurements, each printed as a markdown table:

- **Memory at start:** the VmRSS of a bare interpreter, then with asyncio imported (asyncio
  imports ssl, which loads and initialises OpenSSL: the line with ssl named as well shows
  nothing more), with uvloop, and with pgtarn's modules. Every pooler on CPython and uvloop
  starts above the uvloop line. Each interpreter (`--python` adds more) is measured as
  started and with -S, without the .pth files of its site-packages.
- **Memory per connection:** a process that accepts N idle TCP connections with a protocol
  that keeps only its transport, on uvloop and on asyncio's own loop. The clients live in
  another process, so the number is the event loop's share of one accepted connection.
- **`pgbench -S -M prepared` against direct PostgreSQL:** direct, then PgBouncer in session
  mode with a server per client (prepared statements work there and PgBouncer pools nothing),
  `bench/forwarder.py` (a server per client, no parsing) and pgtarn in transaction mode as
  `bench/run.py` runs it; rounds interleaved, medians and the ratio of each to direct.

    python3 bench/floors.py [--connections 5000] [--rounds 3] [--duration 8] [--clients 100]
                            [--skip-pgbench] [--python PATH ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import uvloop
from run import (
    BENCH_DB,
    BENCH_USER,
    Database,
    PgBouncerMissing,
    Pooler,
    add_pgbouncer_option,
    add_postgres_options,
    clean_env,
    find_pgbouncer,
    log,
    make_workdir,
    parse_pgbench,
    postgres_account,
    prepare_process,
    remove_workdir,
)

FORWARDER = Path(__file__).resolve().with_name("forwarder.py")
#: (what is loaded, the code that loads it)
STAGES = [
    ("bare interpreter", "pass"),
    ("asyncio", "import asyncio"),
    ("asyncio + ssl", "import asyncio, ssl"),
    ("asyncio + uvloop", "import asyncio, uvloop"),
    ("pgtarn's modules", "import pgtarn.app"),
]
NO_PTH = "import site, sys; sys.path += site.getsitepackages()\n"
READ_RSS = (
    "\nfor line in open('/proc/self/status'):\n"
    "    if line.startswith('VmRSS:'): print(line.split()[1])\n"
)


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise KeyError("VmRSS")


def startup_rss(python: str, no_pth: bool) -> list[tuple[str, int | None]]:
    """VmRSS in kB after each stage of STAGES, each in a fresh interpreter; no_pth: started
    with -S and given site-packages by hand, so that no .pth file runs (some import whole
    packages at every start)."""
    rows: list[tuple[str, int | None]] = []
    for label, code in STAGES:
        command = [python, "-S", "-c", NO_PTH + code + READ_RSS] if no_pth else \
            [python, "-c", code + READ_RSS]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        rows.append((label, int(out.stdout) if out.returncode == 0 else None))
    return rows


# --------------------------------------------------------------------------- per connection


class _Holder(asyncio.Protocol):
    """Keeps the transport and nothing else: the least a pooler keeps per client."""

    __slots__ = ("transport",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


async def _serve(count: int) -> None:
    loop = asyncio.get_running_loop()
    accepted = 0

    def factory() -> _Holder:
        nonlocal accepted
        accepted += 1
        return _Holder()

    server = await loop.create_server(factory, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(1.0)
    before = rss_kb()
    print(before, flush=True)  # the parent connects when it reads this
    while accepted < count:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    print(rss_kb(), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # until the parent is done


def serve(loop_name: str, count: int) -> None:
    """The child process of per_connection: accept count connections, report RSS."""
    if loop_name == "uvloop":
        uvloop.install()
    asyncio.run(_serve(count))


def per_connection(loop_name: str, count: int) -> float:
    """kB of the accepting process's RSS per idle connection."""
    command = [sys.executable, __file__, "--serve", loop_name, "--connections", str(count)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    clients: list[socket.socket] = []
    try:
        port = int(child.stdout.readline())
        before = int(child.stdout.readline())
        for _ in range(count):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        after = int(child.stdout.readline())
        return (after - before) / count
    finally:
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write("\n")
            child.stdin.flush()
        child.wait(30)
        for sock in clients:
            sock.close()


# --------------------------------------------------------------------------- -M prepared


def prepared_tps(db: Database, host: str, port: int, clients: int, duration: int) -> float:
    cmd = [
        db.tool("pgbench"),
        "-n",
        "-S",
        "-M",
        "prepared",
        "-j",
        "2",
        "-T",
        str(duration),
        "-c",
        str(clients),
        "-h",
        host,
        "-p",
        str(port),
        "-U",
        BENCH_USER,
        BENCH_DB,
    ]
    res = subprocess.run(cmd, env=clean_env(PGPASSWORD=db.password), capture_output=True,
                         text=True, timeout=duration + 120, check=False)  # fmt: skip
    numbers = parse_pgbench(res.stdout)
    if res.returncode != 0 or numbers.get("failed", 0):
        return 0.0  # a run with errors counts as nothing
    return numbers.get("tps", 0.0)


def prepared_ceiling(args: argparse.Namespace) -> dict[str, list[float]]:
    account = postgres_account()
    workdir = make_workdir("floors", account)
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.clients]}))
    poolers = {"forwarder (a server per client)":
               Pooler("forwarder", [sys.executable, str(FORWARDER)], workdir, db, None),
               "pgtarn (transaction mode, pool 20)":
               Pooler("pgtarn", [sys.executable, "-m", "pgtarn"], workdir, db, None)}  # fmt: skip
    settings: dict[str, tuple[tuple[str, object], ...]] = {}
    try:
        binary = find_pgbouncer(args.pgbouncer)
    except PgBouncerMissing as exc:
        log(str(exc))
    else:
        label = "PgBouncer (session mode, a server per client)"
        poolers = {label: Pooler("pgbouncer", [binary], workdir, db, account), **poolers}
        settings[label] = (("pool_mode", "session"), ("default_pool_size", args.clients + 10))
    tps: dict[str, list[float]] = {"direct": [], **{name: [] for name in poolers}}
    try:
        db.setup()
        for _ in range(args.rounds):
            tps["direct"].append(prepared_tps(db, db.host, db.port, args.clients, args.duration))
            for name, pooler in poolers.items():
                pooler.start(settings.get(name, ()))
                try:
                    tps[name].append(prepared_tps(db, "127.0.0.1", pooler.port, args.clients,
                                                  args.duration))  # fmt: skip
                finally:
                    pooler.stop()
    finally:
        for pooler in poolers.values():
            pooler.stop()
        db.cleanup()
        remove_workdir(workdir, keep=False)
    return tps


# --------------------------------------------------------------------------- report


def megabytes(kb: int | None) -> str:
    return "-" if kb is None else f"{kb / 1024:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=5000, metavar="N")
    p.add_argument("--rounds", type=int, default=3, metavar="N")
    p.add_argument("--duration", type=int, default=8, metavar="S")
    p.add_argument("--clients", type=int, default=100, metavar="N")
    p.add_argument("--skip-pgbench", action="store_true", help="only the memory floors")
    p.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PATH",
        help="interpreter(s) whose memory at start to measure (default: this one)",
    )
    p.add_argument("--serve", choices=["uvloop", "asyncio"], help=argparse.SUPPRESS)
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.connections)
        return 0
    short = prepare_process(2 * args.connections + 100, f"{args.connections} connections held")
    if short:
        sys.exit(short[0])
    pythons = args.python or [sys.executable]

    print("## Memory at start (VmRSS, MB)\n")
    heads = [f"{python}{' -S (no .pth)' if no_pth else ''}" for python in pythons
             for no_pth in (False, True)]  # fmt: skip
    print("| loaded | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    columns = [startup_rss(python, no_pth) for python in pythons for no_pth in (False, True)]
    for i, (label, _code) in enumerate(STAGES):
        cells = [megabytes(col[i][1]) for col in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")

    print(f"\n## Memory per idle connection, {args.connections:,} connections\n")
    print("| event loop | kB per connection |")
    print("|---|---|")
    for loop_name in ("uvloop", "asyncio"):
        print(f"| {loop_name} | {per_connection(loop_name, args.connections):.2f} |")

    if not args.skip_pgbench:
        started = time.monotonic()
        tps = prepared_ceiling(args)
        direct = statistics.median(tps["direct"])
        print(
            f"\n## pgbench -S -M prepared, {args.clients} clients, {args.duration} s x "
            f"{args.rounds} rounds, interleaved ({time.monotonic() - started:.0f} s)\n"
        )
        print("| target | TPS median | runs | ratio to direct |")
        print("|---|---|---|---|")
        for name, runs in tps.items():
            median = statistics.median(runs)
            ratio = f"{median / direct:.2f}" if direct else "-"
            print(f"| {name} | {median:,.0f} | {', '.join(f'{r:,.0f}' for r in runs)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
