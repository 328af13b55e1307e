"""The relay of PostgreSQL's replies to the linked client, with or without prepared statements.

While linked, only ReadyForQuery, ParameterStatus and ErrorResponse are looked at (and, with
prepared statements, ParseComplete, BindComplete and CloseComplete); every chunk goes to the
client as it came, unless a message of it must be dropped or replaced. Replies to pgtarn's
own queries (SET of tracked parameters, resets, checks, hidden Parse) are swallowed.

A part of the server connection that holds no field of its own: one ServerRelay (RELAY)
serves every server, and each method takes the server it works for, so that following a
reply reads in this file alone and a test can drive it with any server.
"""

from __future__ import annotations

from typing import Final

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


class ServerRelay:
    """A logged-in server's replies on their way to its client (see the module docstring).

    The server is a ServerTransport, a concrete class, not a typing.Protocol: in the compiled
    build its fields are then read as a C struct's, at every reply."""

    __slots__ = ()

    def relay_whole_messages_before(self, server: ServerTransport, data: bytes) -> None:
        """The scanner refused a length in data: pass on what came before it, so the client
        stands at a message boundary and can be told why it loses its server."""
        client = server.client
        at = server.scanner.error_at
        if client is not None and server.statements is None and at >= 0:
            client.write(data[:at])
            server.scanner = MessageScanner(SERVER_RELAY_TYPES)  # at a boundary again

    def relay(self, server: ServerTransport, data: bytes) -> None:
        if not server.swallow and server.scanner.ends_at_ready(data):
            # The common case: a whole reply ending with ReadyForQuery, nothing before it
            # looked at.
            body = data[-1:]
            server.status = body
            client = server.client
            if client is not None:
                replacement = client.ready_for_query(server, body)
                client.write(data if replacement is None else data[:-RFQ_LEN] + replacement)
            return
        events = server.scanner.feed(data)
        start = 0
        for msg_type, body, end in events:
            if server.swallow:
                if self._swallowed(server, msg_type, body):
                    start = end
                continue
            if msg_type == READY_FOR_QUERY:
                server.status = body
                client = server.client
                if client is None:
                    start = end
                    continue
                replacement = client.ready_for_query(server, body)
                if replacement is None:
                    client.write(data[start:end] if start or end != len(data) else data)
                else:
                    client.write(data[start : end - RFQ_LEN] + replacement)
                start = end
            elif msg_type == PARAMETER_STATUS:
                self._parameter_status(server, body)
            elif msg_type == ERROR_RESPONSE:
                self._relayed_error(server, body)
            elif msg_type == NOTIFICATION_RESPONSE:
                replacement = self._own_notification(server, body)
                msg_start = end - 5 - len(body)
                if replacement is not None and msg_start >= start and server.client is not None:
                    # (one begun in an earlier chunk went out already: it stays as it is)
                    server.client.write(data[start:msg_start] + replacement)
                    start = end
            elif server.client is not None:  # a row or a result's end, while rows are read
                server.client.result_relayed(msg_type, body)
        if start < len(data) and not server.swallow and server.client is not None:
            server.client.write(data[start:] if start else data)

    def _relay_ready_reply(
        self, server: ServerTransport, data: bytes, body: bytes, statements: ServerStatements
    ) -> None:
        """relay_prepared's common case: a whole reply ending with ReadyForQuery (body: its
        status), nothing before it to rewrite."""
        server.status = body
        client = server.client
        code = statements.ready(body, None if client is None else client.statements)
        if code == READY_FORWARD and client is not None and not statements.expected:
            replacement = client.ready_for_query(server, body)
            client.write(data if replacement is None else data[:-RFQ_LEN] + replacement)
            return
        reply = data[:-RFQ_LEN] + self._after_ready(server, code, data[-RFQ_LEN:], body)
        if reply and client is not None:
            client.write(reply)

    def relay_prepared(self, server: ServerTransport, data: bytes) -> None:
        """relay, plus the bookkeeping of prepared statements: ParseComplete, BindComplete and
        CloseComplete answered or dropped, errors held back for a retry or replaced, batches
        of pgtarn's own swallowed.

        Messages the scanner watches are held back until complete, so that one can be dropped
        or replaced; one that began in an earlier chunk is rebuilt from its body.
        """
        scanner = server.scanner
        statements = server.statements
        assert statements is not None
        if not server.swallow and scanner.ends_at_ready(data):
            self._relay_ready_reply(server, data, data[-1:], statements)
            return
        events = scanner.feed(data)
        if (
            len(events) == 1
            and not server.swallow
            and not scanner.held
            and not scanner.released
            and events[0][0] == READY_FOR_QUERY
            and events[0][2] == len(data) >= RFQ_LEN
        ):
            # the same, after the rest of a message begun in an earlier chunk
            self._relay_ready_reply(server, data, events[0][1], statements)
            return
        out = bytearray(scanner.released if not server.swallow else b"")
        start = 0
        for msg_type, body, end in events:
            msg_start = end - 5 - len(body)
            piece = None
            if msg_start < 0:  # began in held-back bytes: rebuild it
                piece = build.message(bytes((msg_type,)), body)
                msg_start = start = end
            if msg_type in DESCRIPTION_TYPES:
                statements.description(msg_type, body, server.runtime.statement_cache)
            if server.swallow:
                if msg_type in (PARSE_COMPLETE, BIND_COMPLETE, CLOSE_COMPLETE):
                    statements.reply(msg_type)
                    continue
                if msg_type in DESCRIPTION_TYPES:
                    continue
                if server.swallow_syncs:  # a batch the statements track: hidden, or our Sync
                    if msg_type == READY_FOR_QUERY:
                        server.swallow_syncs -= 1
                        statements.ready(body, None)
                    elif msg_type == ERROR_RESPONSE:
                        statements.error(body, server.runtime.statement_cache)
                if self._swallowed(server, msg_type, body):
                    start = end
                    self.start_hidden(server)
                    if statements.resume:
                        self._checked(server, statements)
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
                client = server.client  # the link may end here
                code = statements.ready(body, None if client is None else client.statements)
                reply = data[:msg_start] + self._after_ready(server, code, data[msg_start:], body)
                if client is not None and reply:
                    client.write(reply)
                return
            out += data[start:msg_start]
            start = end
            message = piece if piece is not None else data[msg_start:end]
            if msg_type == READY_FOR_QUERY:
                client = server.client  # the link may end here
                code = statements.ready(body, None if client is None else client.statements)
                out += self._after_ready(server, code, message, body)
                if client is not None and out:
                    client.write(bytes(out))
                out.clear()
                continue
            if msg_type == ERROR_RESPONSE:
                action = statements.error(body, server.runtime.statement_cache)
                if action == ERROR_HIDE:
                    continue
                if action == ERROR_REPLACE:
                    message = build.message(b"E", statements.replacement)
                    if server.client is not None:
                        server.client.error_relayed()
                else:
                    self._relayed_error(server, body)
            elif msg_type == PARAMETER_STATUS:
                self._parameter_status(server, body)
            elif msg_type in ROW_TYPES and server.client is not None:  # while rows are read
                server.client.result_relayed(msg_type, body)
            out += message
        big_at = scanner.big_at
        if not server.swallow and server.client is not None:
            out += data[start : len(data) - scanner.held if big_at < 0 else big_at]
            if out:
                server.client.write(bytes(out))
        if big_at >= 0:  # a message too long to hold begins there: it goes in pieces
            header = scanner.big_start + data[big_at : big_at + 5]
            server.long_reply = LongReply(
                header, lambda msg_type, body: self._long_head(server, msg_type, body)
            )
            self.relay_long(server, scanner.big_start + data[big_at:])

    def relay_long(self, server: ServerTransport, data: bytes) -> None:
        """The bytes of a reply too long to hold (server/longreply.py), then what follows."""
        long_reply = server.long_reply
        assert long_reply is not None
        out, rest = long_reply.feed(data)
        client = server.client
        if out and client is not None:
            client.write(out)
        if long_reply.done:
            server.long_reply = None
            if rest:
                self.relay_prepared(server, rest)

    def _long_head(self, server: ServerTransport, msg_type: int, body: bytes) -> bytes | None:
        """A long ErrorResponse or DataRow, decided from the first HEAD_SIZE bytes of its body
        as relay_prepared decides a whole one: what the client gets in its place, or None
        to pass it on as it comes. Such an error is never held back for a retry (its client
        would need it whole if the retry did not happen)."""
        statements = server.statements
        assert statements is not None
        client = server.client
        if server.swallow:  # a reply to pgtarn's own query
            if msg_type == ERROR_RESPONSE:
                if server.swallow_syncs:
                    statements.error(body, server.runtime.statement_cache, False)
                self._swallowed(server, msg_type, body)
            return b""
        if msg_type != ERROR_RESPONSE:  # a DataRow, while rows are read
            if client is not None:
                client.result_relayed(msg_type, body)
            return None
        if statements.error(body, server.runtime.statement_cache, False) == ERROR_REPLACE:
            if client is not None:
                client.error_relayed()
            return build.message(b"E", statements.replacement)
        self._relayed_error(server, body)
        return None

    def _checked(self, server: ServerTransport, statements: ServerStatements) -> None:
        """pgtarn's check of a statement prepared afresh is answered: the client's parts held
        for it go now."""
        statements.resume = False
        if not statements.describing and server.scanner.watches(ROW_DESCRIPTION):
            self._watch(server, server.scanner.watches(DATA_ROW), False)
        client = server.client
        if client is not None:
            client.statements_checked()

    def watch_descriptions(self, server: ServerTransport) -> None:
        """Replies to a Describe of a statement are owed: read them (ServerStatements.
        description) until they came."""
        if not server.scanner.watches(ROW_DESCRIPTION):
            self._watch(server, server.scanner.watches(DATA_ROW), True)

    def _after_ready(
        self, server: ServerTransport, code: int, message: bytes, body: bytes
    ) -> bytes:
        """A ReadyForQuery of a prepared-statement server: what the client gets for it."""
        statements = server.statements
        assert statements is not None
        server.status = body
        if not statements.describing and server.scanner.watches(ROW_DESCRIPTION):
            self._watch(server, server.scanner.watches(DATA_ROW), False)
        if code == READY_RETRY:
            # The batch failed only because its statement's plan went stale: send it again.
            resend, statements.resend = statements.resend, b""
            server.write(resend)
            self.start_hidden(server)
            return b""
        client = server.client
        if client is None:
            return b""
        if code == READY_UNHIDE:  # no retry after all: the client gets the error
            message = build.message(b"E", statements.withheld) + message
            client.error_relayed()
        replacement = client.ready_for_query(server, body)
        self.start_hidden(server)
        if replacement is not None:
            return message[:-RFQ_LEN] + replacement
        return message

    def start_hidden(self, server: ServerTransport) -> None:
        """At a ReadyForQuery: if a batch of pgtarn's own comes next, swallow its replies."""
        statements = server.statements
        if not server.swallow and statements is not None and statements.take_hidden():
            server.swallow = 1
            server.swallow_syncs += 1

    def prepared_statements(self, server: ServerTransport) -> ServerStatements:
        """This server's statement bookkeeping (made on first use)."""
        if server.statements is None:
            config = server.runtime.config
            server.statements = ServerStatements(
                config.max_prepared_statements or CAPACITY_AFTER_OFF, server.pool.prepared_counters
            )
            # Made while linked and idle, so the scanner is between messages.
            rows = server.scanner.watches(DATA_ROW)
            server.scanner = MessageScanner(
                PREPARED_ROW_RELAY_TYPES if rows else PREPARED_RELAY_TYPES,
                config.max_packet_size,
                stream_over=config.client_message_buffer,
            )
        return server.statements

    def watch_rows(self, server: ServerTransport, on: bool) -> None:
        """The linked client reads the rows of a batch (on), or no longer: report DataRow
        and the ends of results to it (ready replies then go through feed, not the common
        case's shortcut)."""
        statements = server.statements
        self._watch(server, on, statements is not None and statements.describing > 0)

    def _watch(self, server: ServerTransport, rows: bool, descriptions: bool) -> None:
        """What the scanner reports: the relay's types, and DataRow and the ends of results
        (watch_rows), and ParameterDescription, RowDescription and NoData (a Describe of a
        statement owed, watch_descriptions) while they are wanted."""
        types = SERVER_RELAY_TYPES if server.statements is None else PREPARED_RELAY_TYPES
        if rows:
            types = types | ROW_TYPES
        if descriptions:
            types = types | DESCRIPTION_TYPES
        server.scanner.rewatch(types)

    def _swallowed(self, server: ServerTransport, msg_type: int, body: bytes) -> bool:
        """A reply to pgtarn's own query, not passed on; True at its ReadyForQuery."""
        if msg_type == READY_FOR_QUERY:
            server.status = body
            server.swallow -= 1
            if server.swallow == 0 and server.on_clean is not None:
                on_clean, server.on_clean = server.on_clean, None
                on_clean()
            return True
        if msg_type == PARAMETER_STATUS:
            self._parameter_status(server, body, hidden=True)
        elif msg_type == ERROR_RESPONSE:
            fields = parse_fields(body)
            log.warning("%r internal query failed: %s %s", server, fields.get("C"), fields.get("M"))
            server.internal_error = (fields.get("C", ""), fields.get("M", ""))
        return False

    def _relayed_error(self, server: ServerTransport, body: bytes) -> None:
        """An ErrorResponse passed to the client: its batch failed; remember a FATAL, the
        server's last word, as one its client saw (read while no client is linked, nobody saw
        it: a client lent the server before its end is read gets pgtarn's error then)."""
        client = server.client
        if client is None:
            return
        client.error_relayed()
        fields = parse_fields(body)
        if fields.get("S") in ("FATAL", "PANIC"):
            server.fatal = f"{fields.get('C', '')} {fields.get('M', '')}"

    def _own_notification(self, server: ServerTransport, body: bytes) -> bytes | None:
        """A NotificationResponse: one this server's backend sent itself carries the pid the
        client knows as its backend's (session mode), so that a client that skips its own
        notifications by pid still does; None: as it came."""
        client = server.client
        if (
            client is None
            or len(body) < 4
            or int.from_bytes(body[:4], "big") != server.backend_key[0]
        ):
            return None
        pid = client.notification_pid()
        return build.message(b"A", pid.to_bytes(4, "big") + body[4:]) if pid else None

    def _parameter_status(self, server: ServerTransport, body: bytes, hidden: bool = False) -> None:
        name, value = parse_parameter_status(body)
        if server.params.get(name) != value:
            server.params[name] = value
            server.params_met = None  # the clients' values may differ from this one now
        client = server.client
        if client is not None:
            client.parameter_changed(name, value, hidden)


#: The one relay of every server (it holds no field).
RELAY: Final = ServerRelay()
