"""The health checker of a split database: one kept connection per host, one check per period.

Theory of operation. A HealthChecker serves one pool.hosts.HostSet. It keeps a connection of
its own to every host (logged in as the pool's servers are, named ``pgtarn health check``) and
sends each, every ``period``, CHECK_QUERY: in recovery or not, an LSN, a replay delay; the
HostSet makes roles, bans and lag of the answers. Any failure (no connection, a refused
login, the connection lost, an ErrorResponse, a malformed answer, no answer in time) fails the
check: the host is banned, and the HostSet's backoff says when it is tried again. A connection
lost between checks is opened again at once, so a server going away is seen within moments.

One task drives it: step() starts the checks that are due, fails those out of time, and says
when it must run again; the task sleeps until then or until stirred (an answer, a loss, a
wake). ``hosts.wake`` checks every host that is not banned now, at most once per SAMPLE_GAP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from typing import Any, cast

from ..config.settings import DatabaseEntry
from ..errors import PgtarnError, ProtocolViolation
from ..net.sockets import open_connection
from ..pool.hosts import SAMPLE_GAP, HostSet
from ..pool.pool import Pool
from ..proto import build
from ..proto.framing import MessageScanner
from ..proto.messages import parse_data_row, parse_fields
from ..proto.msgtypes import (
    ALL_TYPES,
    COMMAND_COMPLETE,
    DATA_ROW,
    ERROR_RESPONSE,
    READY_FOR_QUERY,
    ROW_DESCRIPTION,
    UNSOLICITED_TYPES,
)
from ..runtime import Runtime
from .login import OwnConnection, server_login_for

log = logging.getLogger("pgtarn.health")

APPLICATION_NAME = "pgtarn health check"
#: In recovery; the LSN (a replica's replay LSN, the primary's insert LSN); the replay delay in
#: seconds (0 once all WAL received is replayed; counted from the server's start when it has
#: replayed no transaction since). An insert LSN just past a page header (no record on the page
#: yet) loses the header: a caught-up replica's replay LSN stops at the page boundary.
CHECK_QUERY = (
    "SELECT r, (l - '0/0')::int8 - CASE WHEN r THEN 0"
    " WHEN (pg_walfile_name_offset(l)).file_offset = 40 THEN 40"
    " WHEN (l - '0/0')::int8 % current_setting('wal_block_size')::int8 = 24 THEN 24"
    " ELSE 0 END,"
    " CASE WHEN NOT r OR pg_last_wal_receive_lsn() IS NULL"
    " OR pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0"
    " ELSE extract(epoch FROM now() - coalesce(pg_last_xact_replay_timestamp(),"
    " pg_postmaster_start_time())) END::float8"
    " FROM (SELECT r, CASE WHEN r THEN coalesce(pg_last_wal_replay_lsn(), '0/0')"
    " ELSE pg_current_wal_insert_lsn() END AS l FROM pg_is_in_recovery() AS r) AS s"
)
_QUERY = build.query(CHECK_QUERY)


def parse_check_row(row: list[bytes | None]) -> tuple[bool, int, float]:
    """The check query's row as (in_recovery, lsn, lag_seconds); ValueError if malformed."""
    if len(row) != 3 or None in row:
        raise ValueError(f"expected 3 values, got {row!r}")
    flag, lsn_text, lag_text = cast(list[bytes], row)
    if flag not in (b"t", b"f"):
        raise ValueError(f"in recovery: {flag!r}")
    lsn = int(lsn_text)
    lag = float(lag_text)
    if lsn < 0 or not math.isfinite(lag) or lag < 0:
        raise ValueError(f"lsn {lsn_text!r}, lag {lag_text!r}")
    return flag == b"t", lsn, lag


class _Probe:
    """One host of the set: its connection (kept across checks) and the check under way."""

    __slots__ = ("conn", "db", "deadline", "index", "sent_at", "started", "urgent")

    def __init__(self, index: int, db: DatabaseEntry) -> None:
        self.index = index
        self.db = db  # the entry narrowed to this one host
        self.conn: _CheckConnection | None = None
        #: When the check under way began (0.0: none), when its Query went (0.0: not yet:
        #: connecting or logging in), and when it fails for lack of an answer.
        self.started = 0.0
        self.sent_at = 0.0
        self.deadline = 0.0
        #: The connection was lost between checks: check (reconnect) at once.
        self.urgent = False


class HealthChecker:
    """Checks every host of a HostSet each period on connections of its own."""

    def __init__(
        self, runtime: Runtime, hosts: HostSet, pool: Pool[Any], db: DatabaseEntry
    ) -> None:
        self.runtime = runtime
        self.hosts = hosts
        self.pool = pool
        self.probes = [
            _Probe(
                host.index,
                dataclasses.replace(
                    db,
                    host=host.host,
                    hosts=(),
                    port=host.port,
                    ports=(),
                    target_session_attrs=None,
                ),
            )
            for host in hosts.hosts
        ]
        #: A wake round asked for runs at this time (0.0: none asked); the last one ran then.
        self.wake_at = 0.0
        self.woken_at = -math.inf
        self.task: asyncio.Task[None] | None = None
        self.connecting: set[asyncio.Task[None]] = set()
        self.stirred = asyncio.Event()
        self.closed = False

    def __repr__(self) -> str:
        return f"<HealthChecker {self.hosts.name}>"

    def attach(self) -> None:
        """Take the HostSet's wake and tell (tests then drive step() themselves)."""
        self.hosts.wake = self.wake
        self.hosts.tell = self._tell

    def start(self) -> None:
        """Attach to the HostSet and run the checks (in the running event loop)."""
        self.attach()
        self.task = self.runtime.spawn(self._run())

    def close(self) -> None:
        """Stop checking; every connection is closed (Terminate sent)."""
        self.closed = True
        if self.hosts.wake == self.wake:
            self.hosts.wake = lambda: None
        for task in (self.task, *self.connecting):
            if task is not None:
                task.cancel()
        for probe in self.probes:
            conn, probe.conn = probe.conn, None
            if conn is not None:
                conn.close()

    def wake(self) -> None:
        """Check every host that is not banned now, or SAMPLE_GAP after the last wake."""
        if not self.wake_at and not self.closed:
            self.wake_at = max(self.hosts.clock(), self.woken_at + SAMPLE_GAP)
            self.stirred.set()

    def _tell(self, level: int, message: str) -> None:
        log.log(level, "%s", message)

    # --- the schedule ---------------------------------------------------------------------------

    async def _run(self) -> None:
        clock = self.hosts.clock
        while not self.closed:
            self.stirred.clear()
            delay = self.step(clock()) - clock()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stirred.wait(), delay)
            else:  # never spin, whatever the clock says
                await asyncio.sleep(0.001)

    def step(self, now: float) -> float:
        """Start the checks that are due, fail those out of time; when to step again."""
        if self.closed:
            return math.inf
        hosts = self.hosts
        woken = bool(self.wake_at) and now >= self.wake_at
        if woken:
            self.wake_at = 0.0
            self.woken_at = now
        next_at = now + hosts.period
        for probe in self.probes:
            if probe.started and now >= probe.deadline:
                self._time_out(probe)
            if not probe.started:
                due = now if probe.urgent else hosts.next_check(probe.index)
                if now >= due or (woken and not hosts.hosts[probe.index].banned(now)):
                    self._begin(probe, now)
                else:
                    next_at = min(next_at, due)
            if probe.started:
                next_at = min(next_at, probe.deadline)
        if self.wake_at:
            next_at = min(next_at, self.wake_at)
        return next_at

    def _connect_timeout(self) -> float:
        return self.runtime.config.server_connect_timeout or 15.0

    def _answer_timeout(self) -> float:
        return max(self._connect_timeout(), 2 * self.hosts.period)

    def _begin(self, probe: _Probe, now: float) -> None:
        probe.started = now
        probe.urgent = False
        conn = probe.conn
        if conn is not None and conn.ready:
            self._send(probe, conn)
            return
        if conn is not None:  # not logged in, yet no check was under way: start afresh
            conn.close()
        conn = probe.conn = _CheckConnection(self, probe)
        probe.sent_at = 0.0
        probe.deadline = now + self._connect_timeout()
        task = self.runtime.spawn(self._connect(conn))
        if task is not None:  # None: a test's spawn
            self.connecting.add(task)
            task.add_done_callback(self.connecting.discard)

    async def _connect(self, conn: _CheckConnection) -> None:
        timeout = self._connect_timeout()
        config = self.runtime.config
        try:
            await open_connection(conn.probe.db, lambda: conn, timeout, config.unix_socket_dir)
        except ConnectionRefusedError:
            conn.lost("connection refused")
        except TimeoutError:
            conn.lost(f"connect timeout ({timeout:g} s)")
        except OSError as exc:
            conn.lost(f"could not connect: {exc.strerror or exc}")

    def _send(self, probe: _Probe, conn: _CheckConnection) -> None:
        probe.sent_at = self.hosts.clock()
        probe.deadline = probe.sent_at + self._answer_timeout()
        conn.ask()

    def _time_out(self, probe: _Probe) -> None:
        if probe.sent_at:
            reason = f"no answer in {self._answer_timeout():g} s"
        else:
            reason = f"connect timeout ({self._connect_timeout():g} s)"
        conn, probe.conn = probe.conn, None
        if conn is not None:
            conn.close()
        self._fail(probe, reason)

    def _fail(self, probe: _Probe, reason: str) -> None:
        probe.started = probe.sent_at = 0.0
        self.stirred.set()
        self.hosts.check_failed(probe.index, reason)

    # --- the connections' reports ---------------------------------------------------------------

    def logged_in(self, conn: _CheckConnection) -> None:
        probe = conn.probe
        if conn is probe.conn and probe.started and not probe.sent_at:
            self._send(probe, conn)

    def answered(self, conn: _CheckConnection, row: list[bytes | None] | None, error: str) -> None:
        probe = conn.probe
        if conn is not probe.conn or not probe.sent_at:
            return
        if error:
            self._fail(probe, f"check failed: {error}")
            return
        try:
            in_recovery, lsn, lag = parse_check_row(row if row is not None else [])
        except ValueError as exc:
            self._fail(probe, f"malformed answer: {exc}")
            return
        sent_at = probe.sent_at
        probe.started = probe.sent_at = 0.0
        self.stirred.set()
        self.hosts.check_passed(probe.index, in_recovery, lsn, lag, sent_at)

    def lost(self, conn: _CheckConnection, reason: str) -> None:
        """conn is gone, or never was (connect, login, TLS failed; the stream broke)."""
        probe = conn.probe
        if conn is not probe.conn or self.closed:
            return
        probe.conn = None
        if probe.started or self.hosts.clock() - conn.ready_at < self.hosts.period:
            self._fail(probe, reason)  # a server that drops each new connection is banned
        else:
            probe.urgent = True
            self.stirred.set()


class _CheckConnection(OwnConnection):
    """One connection of a HealthChecker to one host: log in, then a check query at a time."""

    MALFORMED = (PgtarnError, ValueError)  # ValueError: a truncated message body

    def __init__(self, checker: HealthChecker, probe: _Probe) -> None:
        runtime = checker.runtime
        super().__init__(
            runtime,
            server_login_for(runtime, checker.pool, probe.db, APPLICATION_NAME),
            probe.db.host,
            MessageScanner(ALL_TYPES, runtime.config.max_packet_size),
        )
        self.checker = checker
        self.probe = probe
        self.ready_at = 0.0
        #: A check query is out; its row and error so far; a FATAL error's message.
        self.asking = False
        self.row: list[bytes | None] | None = None
        self.error = ""
        self.fatal = ""

    def _on_logged_in(self) -> None:
        self.ready_at = self.checker.hosts.clock()
        self.checker.logged_in(self)

    def _login_failed(self, error: PgtarnError) -> None:
        self.login = None
        self.close()
        self.checker.lost(self, f"login failed: {error.message}")

    def _tls_failed(self, exc: Exception) -> None:
        self.login = None
        self.closed = True
        self.checker.lost(self, f"TLS failed: {exc}")

    def ask(self) -> None:
        self.asking = True
        self.row = None
        self.error = ""
        if self.transport is not None and not self.closed:
            self.transport.write(_QUERY)

    def _malformed(self, error: PgtarnError) -> None:
        self.close()
        self.checker.lost(self, f"malformed answer: {error.message}")

    def _message(self, msg_type: int, body: bytes) -> None:
        if msg_type == ERROR_RESPONSE:  # of the check, or FATAL before a close
            fields = parse_fields(body)
            message = fields.get("M") or "error without message"
            if fields.get("S") in ("FATAL", "PANIC"):
                self.fatal = message
            if self.asking:
                self.error = self.error or message
            return
        if msg_type in UNSOLICITED_TYPES:  # between checks, or with an answer
            return
        if not self.asking:
            raise ProtocolViolation(f"unexpected message {chr(msg_type)!r}")
        if msg_type == DATA_ROW:  # one only
            if self.row is not None:
                raise ProtocolViolation("more than one row")
            self.row = parse_data_row(body)
        elif msg_type == READY_FOR_QUERY:  # the check is answered
            self.asking = False
            self.checker.answered(self, self.row, self.error)
        elif msg_type not in (ROW_DESCRIPTION, COMMAND_COMPLETE):  # nothing to read
            raise ProtocolViolation(f"unexpected message {chr(msg_type)!r}")

    def lost(self, reason: str) -> None:
        """The connect itself failed."""
        if not self.closed:
            self.closed = True
            self.checker.lost(self, reason)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        detail = self.fatal or (str(exc) if exc else "")
        self.checker.lost(self, f"connection lost: {detail}" if detail else "connection lost")

    def close(self) -> None:
        if not self.closed:
            self._shut()


def start_health(
    runtime: Runtime, hosts: HostSet, pool: Pool[Any], db: DatabaseEntry
) -> HealthChecker:
    """A running HealthChecker of hosts (the app's factory): call in the event loop."""
    checker = HealthChecker(runtime, hosts, pool, db)
    checker.start()
    return checker
