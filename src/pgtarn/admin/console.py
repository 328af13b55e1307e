"""One admin console session: read commands from a logged-in client, run them, answer.

The console speaks the simple query protocol, as PgBouncer's, and also the extended one
without parameters (so psycopg's default cursors and pgJDBC work). Commands that wait
(PAUSE, WAIT_CLOSE) run as a task; the session reads nothing more until they end.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Protocol

from .. import __version__
from ..errors import PgtarnError, ProtocolViolation
from ..proto import build
from ..proto.framing import MessageScanner
from ..proto.msgtypes import (
    ALL_TYPES,
    BIND,
    CLOSE,
    DESCRIBE,
    EXECUTE,
    FLUSH,
    PARSE,
    QUERY,
    SYNC,
    TERMINATE,
)
from ..runtime import Runtime
from . import commands, fanout
from .merge import MERGED
from .result import AdminError, Outcome, Result, notice
from .show import SHOW_TABLES
from .tables import Table

log = logging.getLogger("pgtarn.admin")

#: The parameters a console login is welcomed with, and the one a client may set itself.
PARAMETERS = {
    "server_version": f"{__version__}/pgtarn",
    "client_encoding": "UTF8",
    "server_encoding": "UTF8",
    "DateStyle": "ISO",
    "TimeZone": "GMT",
    "standard_conforming_strings": "on",
    "integer_datetimes": "on",
    "is_superuser": "on",
}
TRACKED = ("application_name",)
RFQ = build.ready_for_query(b"I")
#: Bounds: the longest message, messages read ahead of a running command (reading pauses
#: past it), named statements of one session.
MAX_MESSAGE = 1 << 20
MAX_QUEUED = 64
MAX_STATEMENTS = 100
#: A command word and an optional argument, as PgBouncer: `word ["quoted" | word] [;]`.
_COMMAND = re.compile(r'\s*(\w+)(?:\s+("(?:[^"]|"")*"|[\w.\-]+))?\s*;?\s*', re.ASCII)
_SET = re.compile(
    r"""\s*set\s+(\w+)\s*(?:=|\s+to\s+)\s*('(?:[^']|'')*'|"(?:[^"]|"")*"|[^\s;']+)\s*;?\s*""",
    re.ASCII | re.IGNORECASE,
)
#: Session settings a driver may ask for: SHOW answers them, SET is accepted and ignored.
FAKE_PARAMETERS = {
    "client_encoding": "UTF8",
    "default_transaction_isolation": "read committed",
    "standard_conforming_strings": "on",
    "datestyle": "ISO",
    "timezone": "GMT",
    "extra_float_digits": "2",
}
HELP = (
    "\n\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION"
    "\n\tSHOW LISTS|STATE|PREPARED_STATEMENTS|LISTENERS|SOCKETS|ACTIVE_SOCKETS|PEERS|PEER_POOLS"
    "\n\tSHOW HOSTS|MEM|DNS_HOSTS|DNS_ZONES"
    "\n\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS"
    "\n\tSET key = arg\n\tRELOAD\n\tPAUSE [<db>]\n\tRESUME [<db>]\n\tDISABLE <db>"
    "\n\tENABLE <db>\n\tRECONNECT [<db>]\n\tRENEW_STATEMENTS [<db>]"
    "\n\tKILL [<db>]\n\tKILL_CLIENT <client_id>"
    "\n\tSUSPEND\n\tSHUTDOWN\n\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS\n\tWAIT_CLOSE [<db>]"
)


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        return word[1:-1].replace(word[0] * 2, word[0])
    return word


class AdminClient(Protocol):
    """What a session needs of the client connection it answers."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def write(self, data: bytes) -> None: ...

    def close(self, error: PgtarnError | None = None) -> None: ...


class AdminSession:
    """The admin console as one client sees it."""

    def __init__(self, client: AdminClient, runtime: Runtime, admin: bool) -> None:
        self.client = client
        self.runtime = runtime
        #: admin_users may run everything; stats_users only SHOW.
        self.admin = admin
        self.scanner = MessageScanner(ALL_TYPES, MAX_MESSAGE)
        self.queue: deque[tuple[int, bytes]] = deque()
        #: A command that waits (PAUSE, WAIT_CLOSE) is running: later messages queue.
        self.task: asyncio.Task[None] | None = None
        #: The client does not read its replies fast enough: answer nothing more for now.
        self.write_blocked = False
        self.reading_paused = False
        #: Extended protocol: statement texts, portals, and whether to skip to the Sync.
        self.statements: dict[bytes, str] = {}
        self.portals: dict[bytes, tuple[str, Result | None]] = {}
        self.skipping = False
        # counted as PgBouncer counts its console: a login, a transaction per command
        runtime.admin_stats.client_logins += 1

    # --- messages in ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.task is not None

    def feed(self, data: bytes) -> None:
        for msg_type, body, _end in self.scanner.feed(data):
            self.queue.append((msg_type, body))
        self._run_queue()

    def closed(self) -> None:
        """The client is gone: a command still waiting is abandoned."""
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()
            self.task = None

    def writable(self, writable: bool) -> None:
        """Flow control from the client's transport (pause_writing / resume_writing)."""
        self.write_blocked = not writable
        if writable:
            self._run_queue()

    def _run_queue(self) -> None:
        while self.queue and not self.busy and not self.write_blocked:
            msg_type, body = self.queue.popleft()
            if msg_type == TERMINATE:
                self.client.close()
                return
            if self.skipping and msg_type != SYNC:
                continue
            try:
                if msg_type == QUERY:
                    self._simple_query(body.rstrip(b"\x00").decode("utf-8", "replace"))
                else:
                    self._extended(msg_type, body)
            except (ValueError, IndexError):
                self.client.close(ProtocolViolation("bad packet for the admin console"))
                self.closed()
                return
            except AdminError as error:
                self._write(build.error_response(error.sqlstate, error.message, "ERROR"))
                if msg_type == QUERY:
                    self._write(RFQ)
                else:
                    self.skipping = True
        # read ahead a bounded number of messages while a command runs or replies wait
        transport = self.client.transport
        if transport is None or transport.is_closing():
            return
        if len(self.queue) > MAX_QUEUED and not self.reading_paused:
            transport.pause_reading()
            self.reading_paused = True
        elif len(self.queue) <= MAX_QUEUED and self.reading_paused:
            transport.resume_reading()
            self.reading_paused = False

    def _write(self, data: bytes) -> None:
        transport = self.client.transport
        if transport is not None and not transport.is_closing():
            self.client.write(data)

    def _counted(self) -> None:
        """A command: one query and one transaction of the "pgbouncer" database."""
        stats = self.runtime.admin_stats
        stats.query.observe(0.0)
        stats.xact.observe(0.0)

    def _simple_query(self, query: str) -> None:
        self._counted()
        if not query.strip().strip(";").strip():
            self._write(build.message(b"I") + RFQ)
            return
        self._finish(self.run(query), describe=True, then=RFQ)

    def _finish(self, outcome: Outcome, describe: bool, then: bytes) -> None:
        """Send a command's result now, or when its task ends."""
        if outcome is None:
            return
        if isinstance(outcome, Result):
            self._write(self._encode(outcome, describe) + then)
            return

        async def wait() -> None:
            try:
                result = await outcome
                self._write(self._encode(result, describe) + then)
            except AdminError as error:
                self._write(build.error_response(error.sqlstate, error.message, "ERROR") + then)
            self.task = None
            self._run_queue()

        self.task = self.runtime.spawn(wait())

    @staticmethod
    def _encode(result: Result, describe: bool) -> bytes:
        out = bytearray(b"".join(result.notices))
        table = result.table
        if table is not None:
            if describe:
                out += build.row_description(table.columns)
            for row in table.rows:
                out += build.data_row([None if v is None else str(v) for v in row])
        out += build.command_complete(result.tag)
        return bytes(out)

    # --- the extended protocol, without parameters ---------------------------------------------

    def _extended(self, msg_type: int, body: bytes) -> None:
        if msg_type == PARSE:  # name, query, parameter types
            name, rest = body.split(b"\x00", 1)
            text, rest = rest.split(b"\x00", 1)
            if int.from_bytes(rest[:2], "big"):
                raise AdminError("the admin console takes no parameters")
            if name not in self.statements and len(self.statements) >= MAX_STATEMENTS:
                raise AdminError(f"too many prepared statements (at most {MAX_STATEMENTS})")
            self.statements[name] = text.decode("utf-8", "replace")
            self._write(build.PARSE_COMPLETE)
        elif msg_type == BIND:  # portal, statement, formats, parameters
            portal, rest = body.split(b"\x00", 1)
            name, rest = rest.split(b"\x00", 1)
            formats = int.from_bytes(rest[:2], "big")
            if int.from_bytes(rest[2 + 2 * formats : 4 + 2 * formats], "big"):
                raise AdminError("the admin console takes no parameters")
            if name not in self.statements:
                raise AdminError(
                    f'prepared statement "{name.decode(errors="replace")}" does not exist'
                )
            self.portals[portal] = (self.statements[name], None)
            self._write(build.BIND_COMPLETE)
        elif msg_type == DESCRIBE:
            kind, name = body[:1], body[1:].rstrip(b"\x00")
            if kind == b"S":
                query = self.statements.get(name)
                if query is None:
                    raise AdminError("prepared statement does not exist")
                self._write(build.NO_PARAMETERS)
                result = self._describe(query)
            else:
                if name not in self.portals:
                    raise AdminError("portal does not exist")
                query = self.portals[name][0]
                result = self._describe(query)
                # workers = N: Execute gathers the rows; Describe gave this worker's columns
                self.portals[name] = (query, result if self.runtime.coordinator is None else None)
            self._write(
                build.row_description(result.table.columns)
                if result is not None and result.table is not None
                else build.NO_DATA
            )
        elif msg_type == EXECUTE:
            portal = body.split(b"\x00", 1)[0]
            if portal not in self.portals:
                raise AdminError("portal does not exist")
            query, described = self.portals[portal]
            self._counted()
            self._finish(
                described if described is not None else self.run(query), describe=False, then=b""
            )
        elif msg_type == CLOSE:
            kind, name = body[:1], body[1:].rstrip(b"\x00")
            if kind == b"S":
                self.statements.pop(name, None)
            else:
                self.portals.pop(name, None)
            self._write(build.CLOSE_COMPLETE)
        elif msg_type == SYNC:
            self.skipping = False
            self.portals.clear()
            self._write(RFQ)
        elif msg_type == FLUSH:
            return
        else:
            raise AdminError(f"unsupported message type for the admin console: {chr(msg_type)!r}")

    def _describe(self, query: str) -> Result | None:
        """A read-only command's result, computed at Describe to give its columns."""
        match = _COMMAND.fullmatch(query)
        if match is None or match.group(1).lower() not in ("show", "select"):
            return None
        outcome = self.run(query, local=True)
        return outcome if isinstance(outcome, Result) else None

    # --- commands ------------------------------------------------------------------------------

    def run(self, query: str, local: bool = False) -> Outcome:
        """Run a command; local: a SHOW answers with this worker's own rows (Describe)."""
        set_match = _SET.fullmatch(query)
        if set_match is not None:
            return self._set(set_match.group(1), _unquote(set_match.group(2)))
        match = _COMMAND.fullmatch(query)
        if match is None:
            raise AdminError(f"invalid command '{query}', use SHOW HELP;")
        word = match.group(1).lower()
        arg = _unquote(match.group(2)) if match.group(2) else None
        if word in ("show", "select"):
            return self._show(query, arg, local)
        if not self.admin:
            raise AdminError("admin access needed", sqlstate="42501")
        handler: Callable[[Runtime, str | None], Outcome] | None = commands.COMMANDS.get(word)
        if handler is None:
            raise AdminError(f"invalid command '{query}', use SHOW HELP;")
        if self.runtime.config.log_pooler_errors or self.runtime.config.verbose:
            log.info("%r admin command: %s", self.client, word.upper())
        coordinator = self.runtime.coordinator
        if coordinator is not None:
            return fanout.command(self.runtime, coordinator, word, arg)
        return handler(self.runtime, arg)

    def _show(self, query: str, arg: str | None, local: bool = False) -> Outcome:
        if arg is None:
            raise AdminError(f"invalid command '{query}', use SHOW HELP;")
        what = arg.lower()
        if what == "help":
            return Result("SHOW", notices=[notice("Console usage", HELP)])
        builder = SHOW_TABLES.get(what)
        if builder is not None:
            if what == "prepared_statements" and not self.admin:
                # query texts of every client: not for a monitoring account
                raise AdminError("admin access needed", sqlstate="42501")
            coordinator = self.runtime.coordinator
            if coordinator is not None and what in MERGED:
                if local:
                    return Result("SHOW", fanout.local_view(self.runtime, coordinator, what))
                return fanout.show(self.runtime, coordinator, what)
            return Result("SHOW", builder(self.runtime))
        if what in FAKE_PARAMETERS:
            return Result("SHOW", Table([(what, 25)], [[FAKE_PARAMETERS[what]]]))
        raise AdminError(f"invalid command '{query}', use SHOW HELP;")

    def _set(self, key: str, value: str) -> Outcome:
        if key.lower() in FAKE_PARAMETERS:
            return Result("SET", notices=[notice("SET ignored")])
        if not self.admin:
            raise AdminError("admin access needed", sqlstate="42501")
        if self.runtime.coordinator is not None:
            return fanout.set_setting(self.runtime.coordinator, key, value)
        return commands.set_setting(self.runtime, key, value)
