"""The relay of PostgreSQL's replies to the linked client, with or without prepared statements.

While linked, only ReadyForQuery, ParameterStatus and ErrorResponse are looked at (and, with
prepared statements, ParseComplete, BindComplete and CloseComplete); every chunk goes to the
client as it came, unless a message of it must be dropped or replaced. Replies to pgtarn's
own queries (SET of tracked parameters, resets, checks, hidden Parse) are swallowed.
"""

from __future__ import annotations

from typing import Final, Self

from ..errors import PgtarnError
from ..pool.handoffs import lend_marked
from ..proto import build
from ..proto.framing import MessageScanner
from ..proto.messages import parse_fields, parse_parameter_status
from ..proto.msgtypes import (
    BIND_COMPLETE,
    CLOSE_COMPLETE,
    DATA_ROW,
    DESCRIPTION_TYPES,
    ERROR_RESPONSE,
    NOTIFICATION_RESPONSE,
    PARAMETER_STATUS,
    PARSE_COMPLETE,
    PREPARED_RELAY_TYPES,
    PREPARED_ROW_RELAY_TYPES,
    READY_FOR_QUERY,
    ROW_DESCRIPTION,
    ROW_TYPES,
    SERVER_RELAY_TYPES,
)
from ..session.prepared import (
    AS_PARSE_COMPLETE,
    ERROR_HIDE,
    ERROR_REPLACE,
    FORWARD,
    READY_FORWARD,
    READY_RETRY,
    READY_UNHIDE,
    ServerStatements,
)
from .longreply import LongReply
from .transport import ServerTransport, log

RFQ_LEN: Final = 6
#: How many statements a server keeps for clients that still follow them after
#: max_prepared_statements was set to 0 (they logged in before): PgBouncer's default.
CAPACITY_AFTER_OFF: Final = 200


class ServerRelay(ServerTransport):
    """Relaying a logged-in server's replies: the base of ServerConnection's commands."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        """PostgreSQL's bytes: to the login while it runs, then relayed."""
        self.in_read = True
        try:
            if self.login is not None:
                self.login.data_received(data)
            elif self.statements is None:
                self._relay(data)
            elif self.long_reply is None:
                self._relay_prepared(data)
            else:
                self._relay_long(data)
        except PgtarnError as error:
            log.warning("%r %s", self, error.message)
            self._relay_whole_messages_before(data)
            self.close(error.message)
        except BaseException:  # (a bug, which the loop reports: the read is over all the same)
            self.in_read = False
            if self.handoff_at:
                lend_marked(self.pool, self)
            raise
        self.in_read = False
        if self.handoff_at:  # released in this read to the clients waiting: lent now
            lend_marked(self.pool, self)

    def _relay_whole_messages_before(self, data: bytes) -> None:
        """The scanner refused a length in data: pass on what came before it, so the client
        stands at a message boundary and can be told why it loses its server."""
        client = self.client
        at = self.scanner.error_at
        if client is not None and self.statements is None and at >= 0:
            client.write(data[:at])
            self.scanner = MessageScanner(SERVER_RELAY_TYPES)  # at a boundary again

    def _relay(self: Self, data: bytes) -> None:
        if not self.swallow and self.scanner.ends_at_ready(data):
            # The common case: a whole reply ending with ReadyForQuery, nothing before it
            # looked at.
            body = data[-1:]
            self.status = body
            client = self.client
            if client is not None:
                replacement = client.ready_for_query(self, body)
                client.write(data if replacement is None else data[:-RFQ_LEN] + replacement)
            return
        events = self.scanner.feed(data)
        start = 0
        for msg_type, body, end in events:
            if self.swallow:
                if self._swallowed(msg_type, body):
                    start = end
                continue
            if msg_type == READY_FOR_QUERY:
                self.status = body
                client = self.client
                if client is None:
                    start = end
                    continue
                replacement = client.ready_for_query(self, body)
                if replacement is None:
                    client.write(data[start:end] if start or end != len(data) else data)
                else:
                    client.write(data[start : end - RFQ_LEN] + replacement)
                start = end
            elif msg_type == PARAMETER_STATUS:
                self._parameter_status(body)
            elif msg_type == ERROR_RESPONSE:
                self._relayed_error(body)
            elif msg_type == NOTIFICATION_RESPONSE:
                replacement = self._own_notification(body)
                msg_start = end - 5 - len(body)
                if replacement is not None and msg_start >= start and self.client is not None:
                    # (one begun in an earlier chunk went out already: it stays as it is)
                    self.client.write(data[start:msg_start] + replacement)
                    start = end
            elif self.client is not None:  # a row or a result's end, while rows are read
                self.client.result_relayed(msg_type, body)
        if start < len(data) and not self.swallow and self.client is not None:
            self.client.write(data[start:] if start else data)

    def _relay_ready_reply(self: Self, data: bytes, body: bytes, statements: ServerStatements
                           ) -> None:  # fmt: skip
        """_relay_prepared's common case: a whole reply ending with ReadyForQuery (body: its
        status), nothing before it to rewrite."""
        self.status = body
        client = self.client
        code = statements.ready(body, None if client is None else client.statements)
        if code == READY_FORWARD and client is not None and not statements.expected:
            replacement = client.ready_for_query(self, body)
            client.write(data if replacement is None else data[:-RFQ_LEN] + replacement)
            return
        reply = data[:-RFQ_LEN] + self._after_ready(code, data[-RFQ_LEN:], body)
        if reply and client is not None:
            client.write(reply)

    def _relay_prepared(self: Self, data: bytes) -> None:
        """_relay, plus the bookkeeping of prepared statements: ParseComplete, BindComplete and
        CloseComplete answered or dropped, errors held back for a retry or replaced, batches
        of pgtarn's own swallowed.

        Messages the scanner watches are held back until complete, so that one can be dropped
        or replaced; one that began in an earlier chunk is rebuilt from its body.
        """
        scanner = self.scanner
        statements = self.statements
        assert statements is not None
        if not self.swallow and scanner.ends_at_ready(data):
            self._relay_ready_reply(data, data[-1:], statements)
            return
        events = scanner.feed(data)
        if (
            len(events) == 1
            and not self.swallow
            and not scanner.held
            and not scanner.released
            and events[0][0] == READY_FOR_QUERY
            and events[0][2] == len(data) >= RFQ_LEN
        ):
            # the same, after the rest of a message begun in an earlier chunk
            self._relay_ready_reply(data, events[0][1], statements)
            return
        out = bytearray(scanner.released if not self.swallow else b"")
        start = 0
        for msg_type, body, end in events:
            msg_start = end - 5 - len(body)
            piece = None
            if msg_start < 0:  # began in held-back bytes: rebuild it
                piece = build.message(bytes((msg_type,)), body)
                msg_start = start = end
            if msg_type in DESCRIPTION_TYPES:
                statements.description(msg_type, body, self.runtime.statement_cache)
            if self.swallow:
                if msg_type in (PARSE_COMPLETE, BIND_COMPLETE, CLOSE_COMPLETE):
                    statements.reply(msg_type)
                    continue
                if msg_type in DESCRIPTION_TYPES:
                    continue
                if self.swallow_syncs:  # a batch the statements track: hidden, or our Sync
                    if msg_type == READY_FOR_QUERY:
                        self.swallow_syncs -= 1
                        statements.ready(body, None)
                    elif msg_type == ERROR_RESPONSE:
                        statements.error(body, self.runtime.statement_cache)
                if self._swallowed(msg_type, body):
                    start = end
                    self.start_hidden()
                    if statements.resume:
                        self._checked(statements)
                continue
            if msg_type in (PARSE_COMPLETE, BIND_COMPLETE, CLOSE_COMPLETE):
                action = statements.reply(msg_type)
                if action == FORWARD and piece is None:
                    continue
                out += data[start:msg_start]
                start = end
                if action == FORWARD:
                    out += piece or b""
                elif action == AS_PARSE_COMPLETE:
                    out += build.PARSE_COMPLETE
                continue
            if msg_type == READY_FOR_QUERY and start == 0 and not out and end == len(data) \
                    and piece is None:  # fmt: skip
                # Every message before it goes as it came (a BindComplete, the rows): the
                # chunk is sent in one slice, not copied into out and out copied again.
                client = self.client  # the link may end here
                code = statements.ready(body, None if client is None else client.statements)
                reply = data[:msg_start] + self._after_ready(code, data[msg_start:], body)
                if client is not None and reply:
                    client.write(reply)
                return
            out += data[start:msg_start]
            start = end
            message = piece if piece is not None else data[msg_start:end]
            if msg_type == READY_FOR_QUERY:
                client = self.client  # the link may end here
                code = statements.ready(body, None if client is None else client.statements)
                out += self._after_ready(code, message, body)
                if client is not None and out:
                    client.write(bytes(out))
                out.clear()
                continue
            if msg_type == ERROR_RESPONSE:
                action = statements.error(body, self.runtime.statement_cache)
                if action == ERROR_HIDE:
                    continue
                if action == ERROR_REPLACE:
                    message = build.message(b"E", statements.replacement)
                    if self.client is not None:
                        self.client.error_relayed()
                else:
                    self._relayed_error(body)
            elif msg_type == PARAMETER_STATUS:
                self._parameter_status(body)
            elif msg_type in ROW_TYPES and self.client is not None:  # while rows are read
                self.client.result_relayed(msg_type, body)
            out += message
        big_at = scanner.big_at
        if not self.swallow and self.client is not None:
            out += data[start : len(data) - scanner.held if big_at < 0 else big_at]
            if out:
                self.client.write(bytes(out))
        if big_at >= 0:  # a message too long to hold begins there: it goes in pieces
            self.long_reply = LongReply(scanner.big_start + data[big_at : big_at + 5],
                                        self._long_head)  # fmt: skip
            self._relay_long(scanner.big_start + data[big_at:])

    def _relay_long(self, data: bytes) -> None:
        """The bytes of a reply too long to hold (server/longreply.py), then what follows."""
        long_reply = self.long_reply
        assert long_reply is not None
        out, rest = long_reply.feed(data)
        client = self.client
        if out and client is not None:
            client.write(out)
        if long_reply.done:
            self.long_reply = None
            if rest:
                self._relay_prepared(rest)

    def _long_head(self, msg_type: int, body: bytes) -> bytes | None:
        """A long ErrorResponse or DataRow, decided from the first HEAD_SIZE bytes of its body
        as _relay_prepared decides a whole one: what the client gets in its place, or None
        to pass it on as it comes. Such an error is never held back for a retry (its client
        would need it whole if the retry did not happen)."""
        statements = self.statements
        assert statements is not None
        client = self.client
        if self.swallow:  # a reply to pgtarn's own query
            if msg_type == ERROR_RESPONSE:
                if self.swallow_syncs:
                    statements.error(body, self.runtime.statement_cache, False)
                self._swallowed(msg_type, body)
            return b""
        if msg_type != ERROR_RESPONSE:  # a DataRow, while rows are read
            if client is not None:
                client.result_relayed(msg_type, body)
            return None
        if statements.error(body, self.runtime.statement_cache, False) == ERROR_REPLACE:
            if client is not None:
                client.error_relayed()
            return build.message(b"E", statements.replacement)
        self._relayed_error(body)
        return None

    def _checked(self, statements: ServerStatements) -> None:
        """pgtarn's check of a statement prepared afresh is answered: the client's parts held
        for it go now."""
        statements.resume = False
        if not statements.describing and self.scanner.watches(ROW_DESCRIPTION):
            self._watch(self.scanner.watches(DATA_ROW), False)
        client = self.client
        if client is not None:
            client.statements_checked()

    def watch_descriptions(self) -> None:
        """Replies to a Describe of a statement are owed: read them (ServerStatements.
        description) until they came."""
        if not self.scanner.watches(ROW_DESCRIPTION):
            self._watch(self.scanner.watches(DATA_ROW), True)

    def _after_ready(self: Self, code: int, message: bytes, body: bytes) -> bytes:
        """A ReadyForQuery of a prepared-statement server: what the client gets for it."""
        statements = self.statements
        assert statements is not None
        self.status = body
        if not statements.describing and self.scanner.watches(ROW_DESCRIPTION):
            self._watch(self.scanner.watches(DATA_ROW), False)
        if code == READY_RETRY:
            # The batch failed only because its statement's plan went stale: send it again.
            resend, statements.resend = statements.resend, b""
            self.write(resend)
            self.start_hidden()
            return b""
        client = self.client
        if client is None:
            return b""
        if code == READY_UNHIDE:  # no retry after all: the client gets the error
            message = build.message(b"E", statements.withheld) + message
            client.error_relayed()
        replacement = client.ready_for_query(self, body)
        self.start_hidden()
        if replacement is not None:
            return message[:-RFQ_LEN] + replacement
        return message

    def start_hidden(self) -> None:
        """At a ReadyForQuery: if a batch of pgtarn's own comes next, swallow its replies."""
        statements = self.statements
        if not self.swallow and statements is not None and statements.take_hidden():
            self.swallow = 1
            self.swallow_syncs += 1

    def prepared_statements(self) -> ServerStatements:
        """This server's statement bookkeeping (made on first use)."""
        if self.statements is None:
            config = self.runtime.config
            self.statements = ServerStatements(
                config.max_prepared_statements or CAPACITY_AFTER_OFF, self.pool.prepared_counters
            )
            # Made while linked and idle, so the scanner is between messages.
            rows = self.scanner.watches(DATA_ROW)
            self.scanner = MessageScanner(
                PREPARED_ROW_RELAY_TYPES if rows else PREPARED_RELAY_TYPES,
                config.max_packet_size,
                stream_over=config.client_message_buffer,
            )
        return self.statements

    def watch_rows(self, on: bool) -> None:
        """The linked client reads the rows of a batch (on), or no longer: report DataRow
        and the ends of results to it (ready replies then go through feed, not the common
        case's shortcut)."""
        statements = self.statements
        self._watch(on, statements is not None and statements.describing > 0)

    def _watch(self, rows: bool, descriptions: bool) -> None:
        """What the scanner reports: the relay's types, and DataRow and the ends of results
        (watch_rows), and ParameterDescription, RowDescription and NoData (a Describe of a
        statement owed, watch_descriptions) while they are wanted."""
        types = SERVER_RELAY_TYPES if self.statements is None else PREPARED_RELAY_TYPES
        if rows:
            types = types | ROW_TYPES
        if descriptions:
            types = types | DESCRIPTION_TYPES
        self.scanner.rewatch(types)

    def _swallowed(self, msg_type: int, body: bytes) -> bool:
        """A reply to pgtarn's own query, not passed on; True at its ReadyForQuery."""
        if msg_type == READY_FOR_QUERY:
            self.status = body
            self.swallow -= 1
            if self.swallow == 0 and self.on_clean is not None:
                on_clean, self.on_clean = self.on_clean, None
                on_clean()
            return True
        if msg_type == PARAMETER_STATUS:
            self._parameter_status(body, hidden=True)
        elif msg_type == ERROR_RESPONSE:
            fields = parse_fields(body)
            log.warning("%r internal query failed: %s %s", self, fields.get("C"), fields.get("M"))
            self.internal_error = (fields.get("C", ""), fields.get("M", ""))
        return False

    def _relayed_error(self, body: bytes) -> None:
        """An ErrorResponse passed to the client: its batch failed; remember a FATAL, the
        server's last word, as one its client saw (read while no client is linked, nobody saw
        it: a client lent the server before its end is read gets pgtarn's error then)."""
        client = self.client
        if client is None:
            return
        client.error_relayed()
        fields = parse_fields(body)
        if fields.get("S") in ("FATAL", "PANIC"):
            self.fatal = f"{fields.get('C', '')} {fields.get('M', '')}"

    def _own_notification(self, body: bytes) -> bytes | None:
        """A NotificationResponse: one this server's backend sent itself carries the pid the
        client knows as its backend's (session mode), so that a client that skips its own
        notifications by pid still does; None: as it came."""
        client = self.client
        if (
            client is None
            or len(body) < 4
            or int.from_bytes(body[:4], "big") != self.backend_key[0]
        ):
            return None
        pid = client.notification_pid()
        return build.message(b"A", pid.to_bytes(4, "big") + body[4:]) if pid else None

    def _parameter_status(self, body: bytes, hidden: bool = False) -> None:
        name, value = parse_parameter_status(body)
        if self.params.get(name) != value:
            self.params[name] = value
            self.params_met = None  # the clients' values may differ from this one now
        client = self.client
        if client is not None:
            client.parameter_changed(name, value, hidden)

    # --- commands from the client side ----------------------------------------------------------
