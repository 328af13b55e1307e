"""Connect storm: N clients log in to a pooler (SCRAM-SHA-256) at once; count who got in.

Every client connects, logs in, runs `select 1` and then holds its connection until every
client has tried (succeeded, failed or timed out), so `max_client_conn` really is the ceiling;
then all close. Reported per pooler: accepted, refused (with SQLSTATE and message; pgtarn
should answer 53300 "no more connections allowed (max_client_conn)"), other errors, hangs (a
client with no answer within --timeout; must be 0), login latency percentiles (connect to
the first ReadyForQuery, accepted clients only), the storm's total time, the pooler's CPU
seconds and peak RSS (VmHWM), and the client processes' CPU seconds.

The PostgreSQL cluster stores SCRAM verifiers (password_encryption = scram-sha-256) and the
poolers' auth_file holds that verifier (not the password), so the pooler authenticates clients
with SCRAM and logs in to PostgreSQL by SCRAM passthrough.

Clients: `--client raw` (default) is a minimal protocol client written here (startup, SCRAM,
simple query) that computes PBKDF2 once per process and reuses it for every login with the
same salt, so the client side stays cheap; `--client asyncpg` uses asyncpg, which pays PBKDF2
(4096 iterations, about 1.2 ms of CPU) on every connection, as real drivers do. `--procs`
spreads the clients over several processes. Compare "client CPU s" with "total s" x procs to
see whether the client side was saturated.

    python3 bench/storm.py                                   # pgtarn, 5000 clients, limit 4000
    python3 bench/storm.py --clients 300 --max-client-conn 200 --targets pgtarn,pgbouncer
    python3 bench/storm.py --max-client-conn 10000 --json storm.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import multiprocessing
import multiprocessing.connection
import os
import re
import resource
import secrets
import signal
import statistics
import struct
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memory import proc_status_kb
from run import (
    BENCH_DB,
    BENCH_USER,
    Database,
    PgBouncerMissing,
    Pooler,
    add_pgbouncer_option,
    add_postgres_options,
    cpu_seconds,
    ended,
    find_pgbouncer,
    finish,
    fmt,
    log,
    make_workdir,
    markdown,
    postgres_account,
    prepare_process,
    version_of,
    write_json,
)

import pgtarn
from pgtarn.proto.msgtypes import AUTHENTICATION, ERROR_RESPONSE, READY_FOR_QUERY

POOLERS = ("pgtarn", "pgbouncer")
REFUSAL = "53300"  # what pgtarn sends past max_client_conn
OUTCOMES = ("ok", "refused", "error", "hang")


# --------------------------------------------------------------------------- a minimal client


class ServerError(Exception):
    """An ErrorResponse: severity, SQLSTATE and message."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.sqlstate = fields.get("C", "")
        self.message = fields.get("M", "")
        super().__init__(f"{fields.get('S', 'ERROR')} {self.sqlstate} {self.message}")


def _message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def _error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return fields


class Scram:
    """Client side of SCRAM-SHA-256 (RFC 5802/7677, no channel binding)."""

    def __init__(self, password: str, keys: dict[tuple[bytes, int], tuple[bytes, bytes]] | None):
        self.password = password.encode("utf-8")  # ASCII passwords: SASLprep is the identity
        self.keys = keys  # (salt, iterations) -> (ClientKey, ServerKey); None: no cache
        self.nonce = base64.b64encode(secrets.token_bytes(18)).decode("ascii")
        self.first_bare = f"n=,r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return b"n,," + self.first_bare.encode("ascii")

    def _client_server_keys(self, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
        cached = self.keys.get((salt, iterations)) if self.keys is not None else None
        if cached is None:
            salted = hashlib.pbkdf2_hmac("sha256", self.password, salt, iterations)
            cached = (hmac.digest(salted, b"Client Key", "sha256"),
                      hmac.digest(salted, b"Server Key", "sha256"))  # fmt: skip
            if self.keys is not None:
                self.keys[salt, iterations] = cached
        return cached

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("ascii")
        attrs = dict(item.split("=", 1) for item in text.split(","))
        if not attrs["r"].startswith(self.nonce):
            raise ConnectionError("SCRAM: the server's nonce does not extend ours")
        client_key, server_key = self._client_server_keys(
            base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self.first_bare},{text},{without_proof}".encode("ascii")
        signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = hmac.digest(server_key, auth_message, "sha256")
        return f"{without_proof},p={base64.b64encode(proof).decode('ascii')}".encode("ascii")

    def check(self, server_final: bytes) -> None:
        text = server_final.decode("ascii")
        if not text.startswith("v=") or base64.b64decode(text[2:]) != self.server_signature:
            raise ConnectionError(f"SCRAM: bad server signature {text!r}")


@dataclass(frozen=True)
class Target:
    """Where and as whom the clients log in."""

    host: str
    port: int
    user: str
    password: str
    dbname: str


class RawClient(asyncio.Protocol):
    """One connection (an asyncio.Protocol, cheaper than streams): SCRAM login, simple queries."""

    def __init__(self, target: Target, keys: dict[tuple[bytes, int], tuple[bytes, bytes]] | None,
                 application_name: str = "storm") -> None:  # fmt: skip
        self.target = target
        self.keys = keys
        self.application_name = application_name
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.scram: Scram | None = None
        self.waiter: asyncio.Future[None] | None = None  # the login's or query's end
        self.lost: asyncio.Future[None] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        assert self.transport is not None
        t = self.target
        params = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in (
            ("user", t.user), ("database", t.dbname),
            ("application_name", self.application_name)))  # fmt: skip
        payload = struct.pack("!I", 196608) + params + b"\0"
        self.transport.write(struct.pack("!I", len(payload) + 4) + payload)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        while len(buf) >= 5:
            (length,) = struct.unpack_from("!I", buf, 1)
            if len(buf) < length + 1:
                return
            kind, body = buf[0], bytes(buf[5 : length + 1])
            del buf[: length + 1]
            try:
                self._handle(kind, body)
            except Exception as exc:  # a protocol surprise fails this client only
                self._finish(exc)
                if self.transport is not None:
                    self.transport.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionResetError("the server closed the connection"))
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)

    # -- the protocol

    def _finish(self, exc: BaseException | None = None) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if exc is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(exc)

    def _handle(self, kind: int, body: bytes) -> None:
        assert self.transport is not None
        if kind == ERROR_RESPONSE:
            self._finish(ServerError(_error_fields(body)))
        elif kind == READY_FOR_QUERY:
            self._finish()
        elif kind == AUTHENTICATION:
            (code,) = struct.unpack_from("!I", body)
            if code == 10:  # SASL
                if b"SCRAM-SHA-256\0" not in body[4:]:
                    raise ConnectionError(f"no SCRAM-SHA-256 in {body[4:]!r}")
                self.scram = Scram(self.target.password, self.keys)
                first = self.scram.first()
                self.transport.write(_message(b"p", b"SCRAM-SHA-256\0" + struct.pack(
                    "!I", len(first)) + first))  # fmt: skip
            elif code == 11 and self.scram is not None:  # SASLContinue
                self.transport.write(_message(b"p", self.scram.final(body[4:])))
            elif code == 12 and self.scram is not None:  # SASLFinal
                self.scram.check(body[4:])
            elif code != 0:  # 0: AuthenticationOk; anything else is not SCRAM
                raise ConnectionError(f"unexpected authentication request {code}")

    async def login(self) -> None:
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.lost = loop.create_future()
        t = self.target
        await loop.create_connection(lambda: self, t.host, t.port)
        await self.waiter

    async def query(self, sql: str) -> None:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(_message(b"Q", sql.encode() + b"\0"))
        await self.waiter

    async def close(self) -> None:
        if self.transport is None or self.lost is None:
            return
        if not self.transport.is_closing():
            self.transport.write(_message(b"X", b""))
            self.transport.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.lost), 10)


class AsyncpgClient:
    """The same steps through asyncpg (PBKDF2 on every login, as drivers do)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn: Any = None

    async def login(self) -> None:
        import asyncpg  # type: ignore[import-untyped]

        t = self.target
        self.conn = await asyncpg.connect(
            host=t.host, port=t.port, user=t.user, password=t.password, database=t.dbname,
            ssl=False, timeout=3600, statement_cache_size=0,
            server_settings={"application_name": "storm"},
        )  # fmt: skip

    async def query(self, sql: str) -> None:
        await self.conn.execute(sql)  # no arguments: the simple query protocol

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close(timeout=10)


# --------------------------------------------------------------------------- client processes


@dataclass
class Outcome:
    """What happened to one client; times in seconds since the storm's start."""

    kind: str  # ok / refused / error / hang
    started: float
    login_s: float | None = None  # connect -> ReadyForQuery after authentication
    answered: float | None = None  # when the client's fate was known (since the start)
    detail: str = ""  # "SQLSTATE message" or "ExceptionType: message"


@dataclass
class WorkerReport:
    """One client process's outcomes and its CPU seconds from the start signal on."""

    outcomes: list[Outcome] = field(default_factory=list)
    cpu_s: float = 0.0
    cpu_tried_s: float = 0.0  # until every client had tried
    all_tried_at: float = 0.0


def _classify(exc: BaseException) -> tuple[str, str]:
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, ServerError) or sqlstate:
        message = getattr(exc, "message", None) or str(exc)
        kind = "refused" if sqlstate == REFUSAL or "max_client_conn" in message else "error"
        return kind, f"{sqlstate} {message}"
    return "error", f"{type(exc).__name__}: {exc}".strip()


async def _storm(pipe: multiprocessing.connection.Connection, clients: int, target: Target,
                 kind: str, cache: bool, timeout: float) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    keys: dict[tuple[bytes, int], tuple[bytes, bytes]] | None = {} if cache else None
    if cache:  # PBKDF2 once, off the clock: every login reuses the same salt
        warm = RawClient(target, keys)
        await warm.login()
        await warm.close()
    pipe.send("ready")
    start = await loop.run_in_executor(None, pipe.recv)  # the parent's monotonic start time
    usage0 = resource.getrusage(resource.RUSAGE_SELF)

    def cpu_since_start() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (usage.ru_utime + usage.ru_stime) - (usage0.ru_utime + usage0.ru_stime)

    release = asyncio.Event()
    tried = 0
    all_tried = asyncio.Event()
    report = WorkerReport()

    async def one() -> Outcome:
        nonlocal tried
        client: RawClient | AsyncpgClient = (
            AsyncpgClient(target) if kind == "asyncpg" else RawClient(target, keys)
        )
        t0 = time.monotonic()
        outcome = Outcome("ok", t0 - start)
        try:
            async with asyncio.timeout(timeout):
                await client.login()
                outcome.login_s = time.monotonic() - t0
                await client.query("select 1")
        except TimeoutError:
            outcome.kind, outcome.detail = "hang", f"no answer in {timeout:g} s"
        except Exception as exc:  # every failure is a result here
            outcome.kind, outcome.detail = _classify(exc)
        outcome.answered = time.monotonic() - start
        tried += 1
        if tried == clients:
            all_tried.set()
        try:
            if outcome.kind == "ok":
                await release.wait()  # hold the connection until everybody has tried
        finally:
            await client.close()
        return outcome

    tasks = [asyncio.create_task(one()) for _ in range(clients)]
    await all_tried.wait()
    report.all_tried_at = time.monotonic() - start
    report.cpu_tried_s = cpu_since_start()
    pipe.send("tried")
    await loop.run_in_executor(None, pipe.recv)  # "release"
    release.set()
    report.outcomes = list(await asyncio.gather(*tasks))
    report.cpu_s = cpu_since_start()
    pipe.send(report)


def worker(pipe: multiprocessing.connection.Connection, clients: int, target: Target,
           kind: str, cache: bool, timeout: float) -> None:  # fmt: skip
    """Entry point of one client process: waits for "go", storms, reports over `pipe`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_storm(pipe, clients, target, kind, cache, timeout))
    except Exception as exc:  # the parent reports it
        pipe.send(f"worker failed: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- one storm


@dataclass
class StormResult:
    """One storm against one pooler."""

    target: str
    clients: int
    max_client_conn: int
    procs: int
    client: str
    counts: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)  # "SQLSTATE message" -> clients
    errors: dict[str, int] = field(default_factory=dict)
    login_ms: dict[str, float] = field(default_factory=dict)  # p50/p90/p99/max, accepted only
    refusal_ms: dict[str, float] = field(default_factory=dict)  # connect -> refusal
    total_s: float | None = None  # start -> every client tried
    close_s: float | None = None  # release -> every client closed
    pooler_cpu_s: float | None = None  # over the whole storm, closes included
    pooler_peak_rss_kb: int | None = None  # VmHWM (the pooler is fresh for every storm)
    pooler_rss_held_kb: int | None = None  # VmRSS while every accepted client is connected
    pooler_fds_held: int | None = None
    pooler_rss_after_kb: int | None = None  # VmRSS a second after every client closed
    client_cpu_s: float | None = None  # all client processes, from the start signal on
    client_cpu_tried_s: float | None = None  # the same, until every client had tried
    pooler_alive: bool = True
    log_lines: dict[str, int] = field(default_factory=dict)  # pooler log: pattern -> count
    failure: str = ""


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {"p50": statistics.median(ordered), "p90": pick(0.90), "p99": pick(0.99),
            "max": ordered[-1]}  # fmt: skip


def log_summary(path: Path) -> dict[str, int]:
    """Pooler log lines that are not plain LOG/INFO, with numbers and addresses blanked."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if "Traceback" in line:
            found["Traceback (most recent call last)"] += 1
        elif re.search(r"\b(WARNING|ERROR|FATAL|CRITICAL|PANIC|Exception)\b", line):
            line = re.sub(r"^\S+ \S+ (\[\d+\] )?", "", line)  # timestamp, pid
            line = re.sub(r"0x[0-9a-f]+|\d+", "N", line)
            found[line[:200]] += 1
    return dict(found.most_common(20))


def run_storm(args: argparse.Namespace, pooler: Pooler) -> StormResult:
    res = StormResult(pooler.name, args.clients, args.max_client_conn, args.procs, args.client)
    target = Target("127.0.0.1", pooler.port, BENCH_USER, pooler.db.password, BENCH_DB)
    pid = pooler.pid
    ctx = multiprocessing.get_context("fork")
    shares = [args.clients // args.procs + (i < args.clients % args.procs)
              for i in range(args.procs)]  # fmt: skip
    pipes: list[multiprocessing.connection.Connection] = []
    procs: list[Any] = []
    try:
        for share in shares:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=worker,
                daemon=True,
                args=(theirs, share, target, args.client, not args.no_pbkdf2_cache, args.timeout),
            )
            proc.start()  # fmt: skip
            theirs.close()
            pipes.append(mine)
            procs.append(proc)
        for pipe in pipes:
            expect(pipe, "ready", 60)
        cpu0 = cpu_seconds(pid)
        start = time.monotonic()
        for pipe in pipes:
            pipe.send(start)
        log(f"{pooler.name}: {args.clients} clients storming (max_client_conn "
            f"{args.max_client_conn}) ...")  # fmt: skip
        deadline = start + args.timeout + 120
        waiting = list(pipes)
        peak_kb = 0  # VmHWM can lag behind VmRSS (per-thread RSS counters): sample too
        while waiting:  # watch the pooler while the clients try
            for ready in multiprocessing.connection.wait(waiting, timeout=0.2):
                assert isinstance(ready, multiprocessing.connection.Connection)
                expect(ready, "tried", 0)
                waiting.remove(ready)
            if pooler.proc is not None and pooler.proc.poll() is not None:
                res.pooler_alive = False
                break
            peak_kb = max(peak_kb, proc_status_kb(pid, "VmRSS"))
            if time.monotonic() > deadline:
                raise RuntimeError("client processes did not finish trying in time")
        if pooler.proc is not None and pooler.proc.poll() is None:
            res.pooler_rss_held_kb = proc_status_kb(pid, "VmRSS")
            peak_kb = max(peak_kb, res.pooler_rss_held_kb)
            res.pooler_fds_held = len(os.listdir(f"/proc/{pid}/fd"))
        released = time.monotonic()
        for pipe in pipes:
            pipe.send("release")
        reports: list[WorkerReport] = []
        for pipe in pipes:
            reports.append(expect(pipe, WorkerReport, 120))
        res.close_s = time.monotonic() - released
        for proc in procs:
            proc.join(10)
        time.sleep(1.0)
        if pooler.proc is not None and pooler.proc.poll() is None:
            res.pooler_cpu_s = cpu_seconds(pid) - cpu0
            res.pooler_peak_rss_kb = max(peak_kb, proc_status_kb(pid, "VmHWM"))
            res.pooler_rss_after_kb = proc_status_kb(pid, "VmRSS")
        else:
            res.pooler_alive = False
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    outcomes = [o for r in reports for o in r.outcomes]
    res.counts = {k: sum(o.kind == k for o in outcomes) for k in OUTCOMES}
    res.refusals = dict(Counter(o.detail for o in outcomes if o.kind == "refused"))
    res.errors = dict(Counter(o.detail for o in outcomes if o.kind in ("error", "hang")))
    res.login_ms = {
        k: v * 1000
        for k, v in percentiles(
            [o.login_s for o in outcomes if o.kind == "ok" and o.login_s is not None]
        ).items()
    }
    res.refusal_ms = {k: v * 1000 for k, v in percentiles(
        [o.answered - o.started for o in outcomes
         if o.kind == "refused" and o.answered is not None]).items()}  # fmt: skip
    res.total_s = max(r.all_tried_at for r in reports)
    res.client_cpu_s = sum(r.cpu_s for r in reports)
    res.client_cpu_tried_s = sum(r.cpu_tried_s for r in reports)
    return res


def expect(pipe: multiprocessing.connection.Connection, what: object, timeout: float) -> Any:
    """The next message of a client process, checked against `what` (a value or a type)."""
    if timeout and not pipe.poll(timeout):
        raise RuntimeError(f"a client process sent nothing in {timeout} s (waiting for {what})")
    try:
        msg = pipe.recv()
    except EOFError as exc:
        raise RuntimeError("a client process died") from exc
    if msg == what or (isinstance(what, type) and isinstance(msg, what)):
        return msg
    raise RuntimeError(f"client process: {msg}")


# --------------------------------------------------------------------------- report


def table(results: list[StormResult]) -> str:
    header = ["target", "clients", "max_client_conn", "accepted", "refused", "other errors",
              "hangs", "login ms p50/p90/p99/max", "total s", "pooler CPU s",
              "pooler peak RSS MB", "RSS held MB", "client CPU s storm/all"]  # fmt: skip
    rows = []
    for r in results:
        c = r.counts
        states = sorted({d.split(" ", 1)[0] for d in r.refusals})
        login = "/".join(fmt(r.login_ms.get(k), ".0f") for k in ("p50", "p90", "p99", "max"))
        rows.append([
            r.target + ("" if r.pooler_alive else " (DIED)"), f"{r.clients:,}",
            f"{r.max_client_conn:,}", f"{c.get('ok', 0):,}",
            f"{c.get('refused', 0):,}" + (f" ({', '.join(states)})" if states else ""),
            f"{c.get('error', 0):,}", f"{c.get('hang', 0):,}", login, fmt(r.total_s, ".2f"),
            fmt(r.pooler_cpu_s, ".2f"),
            fmt(r.pooler_peak_rss_kb / 1024 if r.pooler_peak_rss_kb else None, ".1f"),
            fmt(r.pooler_rss_held_kb / 1024 if r.pooler_rss_held_kb else None, ".1f"),
            f"{fmt(r.client_cpu_tried_s, '.2f')}/{fmt(r.client_cpu_s, '.2f')} "
            f"({r.procs} proc)",
        ])  # fmt: skip
    return markdown(header, rows)


def report(args: argparse.Namespace, versions: dict[str, str], results: list[StormResult],
           notes: list[str]) -> None:  # fmt: skip
    cache = "PBKDF2 cached per process" if not args.no_pbkdf2_cache else "PBKDF2 per login"
    client = "asyncpg (PBKDF2 per login)" if args.client == "asyncpg" else f"raw ({cache})"
    print(
        f"\n## Connect storm: {args.clients:,} clients at once, SCRAM-SHA-256, pool_size "
        f"{args.pool_size}, transaction mode; client {client}, {args.procs} process(es); "
        f"{os.cpu_count()} CPUs"
    )
    print(", ".join(f"{k} {v}" for k, v in versions.items()) + "\n")
    print(table(results))
    print(
        "\nlogin ms: connect to the first ReadyForQuery, accepted clients. total s: start to "
        "the last client's answer. pooler CPU s: user+system over the storm incl. closing. "
        "RSS held: VmRSS with every accepted client connected. client CPU s: the client "
        "processes' user+system until every client had tried / until all had closed."
    )
    for r in results:
        for detail, n in r.refusals.items():
            print(
                f"- {r.target}: refused {n:,} x `{detail}` (connect to refusal ms: "
                + "/".join(fmt(r.refusal_ms.get(k), ".0f") for k in ("p50", "p99", "max"))
                + " p50/p99/max)"
            )
        for detail, n in r.errors.items():
            print(f"- {r.target}: error {n:,} x `{detail}`")
        for line, n in r.log_lines.items():
            print(f"- {r.target} log: {n:,} x {line}")
        if r.failure:
            print(f"- {r.target}: FAILED: {r.failure}")
    for note in notes:
        print(f"note: {note}")
    write_json(args, versions, results=[asdict(r) for r in results])


def client_notes(r: StormResult, timeout: float) -> list[str]:
    notes = []
    busy, wall = r.client_cpu_tried_s or 0.0, r.total_s or 0.0
    if wall >= 1.0 and busy > 0.8 * wall * r.procs:
        notes.append(f"{r.target}: the client processes were busy {busy:.1f} CPU s of the "
                     f"storm's {wall:.1f} s x {r.procs} process(es): the client side may be the "
                     "bottleneck (try --procs 2" + (", or --client raw)" if r.client == "asyncpg"
                                                   else ")"))  # fmt: skip
    limit = min(r.clients, r.max_client_conn)
    if r.counts.get("ok", 0) > r.max_client_conn:
        notes.append(f"{r.target}: {r.counts['ok']} accepted, more than max_client_conn")
    elif r.counts.get("ok", 0) < limit:
        notes.append(f"{r.target}: only {r.counts.get('ok', 0)} of {limit} possible logins "
                     "succeeded")  # fmt: skip
    if r.counts.get("hang"):
        notes.append(f"{r.target}: {r.counts['hang']} clients HUNG (no answer in {timeout:g} s)")
    if r.target == "pgtarn" and any(not d.startswith(REFUSAL) for d in r.refusals):
        notes.append("pgtarn refused with something other than SQLSTATE 53300")
    return notes


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--clients", type=int, default=5000, metavar="N", help="clients connecting at once (5000)"
    )
    p.add_argument(
        "--max-client-conn",
        type=int,
        default=4000,
        metavar="N",
        help="the poolers' max_client_conn (4000)",
    )
    p.add_argument("--pool-size", type=int, default=20, metavar="N", help="default_pool_size (20)")
    p.add_argument(
        "--listen-backlog",
        type=int,
        metavar="N",
        help="the poolers' listen_backlog (default: theirs, 128)",
    )
    p.add_argument(
        "--targets",
        type=lambda t: t.split(","),
        default=["pgtarn"],
        metavar="LIST",
        help="any of pgtarn,pgbouncer (pgtarn)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="a client with no answer after S seconds counts as a hang (60)",
    )
    p.add_argument(
        "--client",
        choices=("raw", "asyncpg"),
        default="raw",
        help="the client implementation (raw)",
    )
    p.add_argument(
        "--no-pbkdf2-cache",
        action="store_true",
        help="raw client: compute PBKDF2 on every login, as drivers do",
    )
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        metavar="N",
        help="client processes to spread the clients over (1)",
    )
    p.add_argument("--json", metavar="PATH", help="also write all raw numbers as JSON to PATH")
    add_pgbouncer_option(p)
    add_postgres_options(p)
    args = p.parse_args(argv)  # fmt: skip
    if not args.targets or set(args.targets) - set(POOLERS):
        p.error(f"--targets: choose from {', '.join(POOLERS)}")
    if args.clients < 1 or args.procs < 1 or args.procs > args.clients:
        p.error("--clients and --procs must be positive, --procs at most --clients")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    need = max(args.clients, min(args.clients, args.max_client_conn)) + 100
    notes = prepare_process(need // args.procs, "the client processes")
    account = postgres_account()
    workdir = make_workdir("storm", account)
    # Database reads args.clients (a list, for its max_connections check): give it the pool's
    db = Database(argparse.Namespace(**{**vars(args), "clients": [args.pool_size]}))
    poolers: list[Pooler] = []
    results: list[StormResult] = []
    try:
        db.setup(scale=None)
        verifier = db.scram_verifier()
        settings: dict[str, object] = {
            "default_pool_size": args.pool_size,
            "max_client_conn": args.max_client_conn,
        }
        if args.listen_backlog:
            settings["listen_backlog"] = args.listen_backlog
        versions = {"postgres": db.version, "pgtarn": pgtarn.__version__}
        for name in args.targets:
            if name == "pgbouncer":
                try:
                    binary = find_pgbouncer(args.pgbouncer)
                except PgBouncerMissing as exc:
                    notes.append(str(exc))
                    continue
                versions["PgBouncer"] = version_of([binary, "-V"])
                command, acct = [binary], account
            else:
                command, acct = [sys.executable, "-m", "pgtarn"], None
            poolers.append(Pooler(name, command, workdir, db, acct, settings=settings,
                                  secret=verifier))  # fmt: skip
        for pooler in poolers:
            pooler.start()
            try:
                result = run_storm(args, pooler)
            except RuntimeError as exc:
                result = StormResult(pooler.name, args.clients, args.max_client_conn,
                                     args.procs, args.client, failure=str(exc))  # fmt: skip
            finally:
                pooler.stop()
            result.log_lines = log_summary(pooler.log_path)
            results.append(result)
            notes += client_notes(result, args.timeout)
            c = result.counts
            log(
                f"{pooler.name}: {c.get('ok', 0)} accepted, {c.get('refused', 0)} refused, "
                f"{c.get('error', 0)} errors, {c.get('hang', 0)} hangs {result.failure}"
            )
        report(args, versions, results, notes)
        bad = any(r.failure or r.counts.get("hang") or r.counts.get("error")
                  or not r.pooler_alive or r.counts.get("ok") != min(r.clients, r.max_client_conn)
                  for r in results)  # fmt: skip
        return 1 if bad else 0
    except (RuntimeError, KeyboardInterrupt) as exc:
        return ended(exc)
    finally:
        finish(poolers, db, workdir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
