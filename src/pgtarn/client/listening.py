"""ClientListen: a pooled client's LISTEN state, its replies to LISTEN and its notifications.

In transaction and statement mode a Query made only of LISTEN and UNLISTEN does not go to a
server (the next client of that server would get the notifications): tracking.py queues it
in ``answers`` with how many ReadyForQuery the client is owed before its reply. The reply
(CommandComplete for each statement, then ReadyForQuery) goes out in its place in the
stream: at once when nothing is owed, else right after the ReadyForQuery before it. Its
effects go through the session tracker like any batch, so a LISTEN in a transaction block
counts from COMMIT and is forgotten at ROLLBACK.

The channels committed go to the pool's ChannelBoard, whose listener connection LISTENs to
them; this object is what the board holds (a pool.channels.Subscriber). Until the listener
connection has confirmed a new channel, the client's last ReadyForQuery is withheld and
what the client sends meanwhile waits (as for a server), so a NOTIFY committed after the
client saw its LISTEN succeed always reaches it.

Notifications go out at once when the client is idle and unlinked, else right after the
next ReadyForQuery with status idle (PostgreSQL, too, delivers none inside a transaction
block), and never while the pool is paused. At most listen_queue_size wait; past that the
client is closed.

A client has one of these from its first LISTEN, reply owed or notification (its
connection's _listen_made): most clients never listen, and thousands of idle ones then hold
none of its fields. It sees its connection through interfaces.ListenClient.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any, Final

from ..errors import PgtarnError
from ..pool.channels import LOST_MESSAGE
from ..proto import build
from ..proto.msgtypes import (
    BIND,
    CLOSE,
    DESCRIBE,
    EXECUTE,
    FLUSH,
    NOTIFICATION_RESPONSE,
    PARSE,
    STATEMENT_MESSAGES,
    SYNC,
)
from ..server.connection import ServerConnection
from ..session.effects import SUBSCRIBE, Parsed, as_subscriptions, parse_text
from ..views.states import ClientState
from .interfaces import ListenClient
from .parsers import effects_of

log = logging.getLogger("pgtarn.client")

#: Shared by every client that listens to nothing (an empty frozenset is not a singleton).
NO_CHANNELS: frozenset[str] = frozenset()
READY: Final = {status: build.ready_for_query(status) for status in (b"I", b"T", b"E")}
RFQ_LEN: Final = 6
LISTEN_COMPLETE: Final = build.command_complete("LISTEN")
UNLISTEN_COMPLETE: Final = build.command_complete("UNLISTEN")
#: A LISTEN in a failed transaction block, as PostgreSQL answers any statement there.
ABORTED = build.error_response(
    "25P02", "current transaction is aborted, commands ignored until end of transaction block"
)
LOST_NOTICE = build.error_response("01000", LOST_MESSAGE, "WARNING", notice=True)
#: Seconds a client closed at listen_queue_size has to read what was sent before its error.
FLUSH_GRACE: Final = 15.0
#: A batch pgtarn may answer, cut across reads, is held back up to this many bytes (a driver's
#: LISTEN batch is a few hundred).
LOCAL_BATCH_MAX: Final = 8192
#: A batch of pgtarn's to answer: its length, its effects, its replies, whether a Sync ends
#: it (else a Flush), and the client's statements of LISTEN after it (None: not whole yet).
LocalBatch = tuple[int, Parsed | None, bytes, bool, dict[bytes, Parsed] | None]
_NOT_WHOLE: Final[LocalBatch] = (0, None, b"", False, None)
_LISTEN_WORDS: Final = (b"listen", b"unlisten")


def _completions(parsed: Parsed) -> bytes:
    return b"".join(
        [
            LISTEN_COMPLETE if effect[0] == SUBSCRIBE else UNLISTEN_COMPLETE
            for effect in parsed.effects
        ]
    )


def _looks_like_listen(data: bytes) -> bool:
    """Whether the Parse at data's start has a text that begins with LISTEN or UNLISTEN."""
    name_end = data.find(b"\x00", 5)
    return name_end > 0 and data[name_end + 1 : name_end + 17].lstrip().lower().startswith(
        _LISTEN_WORDS
    )


class ClientListen:
    """A tracked client's LISTEN state and what acts on it (see the module docstring)."""

    __slots__ = (
        "answers",
        "client",
        "held_batch",
        "local_statements",
        "notify_queue",
        "subscribed",
        "wait",
        "withheld",
    )

    def __init__(self, client: ListenClient) -> None:
        #: Some of its channels are not confirmed by the listener connection yet.
        self.wait = False
        self.client = client
        #: LISTEN/UNLISTEN batches answered by pgtarn: [ReadyForQuery owed before its reply,
        #: its subscriptions, its replies (None: a CommandComplete per subscription), whether
        #: a ReadyForQuery ends it], oldest first.
        self.answers: list[list[Any]] = []
        #: Its statements of LISTEN/UNLISTEN that pgtarn answers (extended protocol), by name.
        self.local_statements: dict[bytes, Parsed] | None = None
        #: The channels the pool's board has for this client (wait: some not confirmed yet).
        self.subscribed = NO_CHANNELS
        #: The ReadyForQuery withheld until they are (b"": none).
        self.withheld = b""
        #: The start of an extended-protocol batch pgtarn may answer (LISTEN), not whole yet:
        #: the relay puts it before the next chunk (local_batches).
        self.held_batch = b""
        #: Notifications waiting to go out.
        self.notify_queue: list[bytes] = []

    def holds_anything(self) -> bool:
        """Something owed, held, queued or subscribed (a takeover waits for none)."""
        return bool(
            self.answers
            or self.local_statements
            or self.subscribed
            or self.withheld
            or self.held_batch
            or self.notify_queue
        )

    # --- replies to LISTEN and UNLISTEN -------------------------------------------------------

    def answer_now(self) -> None:
        """The relay counted a Query answered here: reply now if nothing is owed before it."""
        answers = self.answers
        if not answers or answers[0][0] > 0 or self.withheld:
            return
        client = self.client
        server = client.server
        status = server.status if server is not None else b"I"
        out = self.answers_due(status)
        if client.state is ClientState.READY:
            client.write(self.after_reply(out, status))

    def ready_for_query(self, server: ServerConnection, status: bytes) -> bytes:
        """Its connection's ready_for_query while it listens (ListenClient.listening): the
        LISTEN replies due after this ReadyForQuery, then the link may end, then
        notifications (or the ReadyForQuery is withheld for the listener connection).
        Returns what goes to the client in the ReadyForQuery's place (b"": nothing)."""
        client = self.client
        out = READY[status]
        answers = self.answers
        if answers:
            for entry in answers:
                entry[0] -= 1
            out += self.answers_due(status)
            if client.state is not ClientState.READY:
                return b""
        if not client.expected and client._link_ends(server, status) == b"":
            return b""
        out = self.after_reply(out, status)
        client.listening = self.wait or bool(self.answers or self.notify_queue)
        return out

    def answers_due(self, status: bytes) -> bytes:
        """The replies due now that a ReadyForQuery with status went to the client."""
        answers = self.answers
        out = b""
        while answers and answers[0][0] <= 0:
            _remaining, parsed, replies, synced = answers.pop(0)
            if synced:
                for entry in answers:  # its reply ends with a ReadyForQuery too
                    entry[0] -= 1
            out += self._answer(parsed, replies, status, synced)
        return out

    def _answer(
        self, parsed: Parsed | None, replies: bytes | None, status: bytes, synced: bool
    ) -> bytes:
        """The reply to one batch answered here: replies (None: a CommandComplete for each
        effect of parsed), then ReadyForQuery (synced); in a failed block, its error."""
        client = self.client
        session = client._session_made()  # (a reply owed here came with the session's change)
        if status == b"E":
            session.error()
            replies = ABORTED
        elif replies is None:
            assert parsed is not None
            replies = _completions(parsed)
        if not synced:  # Flush: the replies so far, the batch goes on
            return replies
        reply = replies + READY[status]
        client.expected -= 1
        if session.pending:
            client._session_ready(status)
        return reply

    def after_reply(self, out: bytes, status: bytes) -> bytes:
        """out, which ends with a ReadyForQuery of status, as it goes to the client: its
        ReadyForQuery withheld while the listener connection has not confirmed a new channel
        (the client owed nothing more), or notifications after it."""
        if not out.endswith(READY[status]):
            return out  # a batch that goes on (Flush), or nothing
        if self.wait and not self.client.expected:
            # what the client sends now waits (ClientLink.server_now)
            self.withheld = out[-RFQ_LEN:]
            return out[:-RFQ_LEN]
        if self.notify_queue and status == b"I" and not self._delivery_held():
            out += self._take_notifications()
        return out

    # --- the extended protocol: a batch of a LISTEN statement alone --------------------------

    def local_batches(self, data: bytes) -> bytes:
        """The chunk after the batches at its start that pgtarn answers itself: a statement
        of LISTEN/UNLISTEN only, parsed, described, bound, executed or closed, up to Sync
        (as asyncpg's add_listener sends it). Anything else in a batch goes to the server
        as before. A batch not whole in the chunk (TCP may cut it anywhere) waits for the
        rest in held_batch, up to LOCAL_BATCH_MAX bytes; a longer one is no driver's LISTEN
        and goes on."""
        client = self.client
        session = client.session
        if not client.tracked or (session is not None and session.state.channels):
            return data  # not tracked; or its LISTENs run on its server: pinned
        while data and data[0] in STATEMENT_MESSAGES:
            batch = local_batch(data, self.local_statements)
            if batch is None:
                break
            used, parsed, replies, synced, known = batch
            if not used:  # all pgtarn's to answer so far, but not whole
                if len(data) > LOCAL_BATCH_MAX:
                    break
                self.held_batch = data
                return b""
            self.local_statements = known
            if parsed is not None:
                client._session_made().add(parsed, client.expected, client._status_now())
            self.answers.append([client.expected, parsed, replies, synced])
            client.listening = True
            if synced:
                client.expected += 1
            self.answer_now()
            data = data[used:]
        if self.local_statements and data:
            self.local_statements.pop(b"", None)  # a Query or Parse would replace it
        return data

    # --- the session's channels ------------------------------------------------------------

    def subscribe(self, channels: frozenset[str]) -> None:
        """The board gets this client's committed channels."""
        pool = self.client.pool
        if pool is None or pool.board is None or channels == self.subscribed:
            self.subscribed = channels
            return
        confirmed = pool.board.update(self, self.subscribed, channels, monotonic())
        self.subscribed = channels
        self.wait = not confirmed
        self.client.listening = True

    def listener_confirmed(self, warning: str) -> None:
        """The listener connection LISTENs to every channel of ours (or, warning, will not
        soon): send the withheld ReadyForQuery and what waited behind it."""
        self.wait = False
        notice = build.error_response("01000", warning, "WARNING", notice=True) if warning else b""
        if not self.withheld:
            if notice:
                self._push(notice)
            return
        client = self.client
        if client.state is not ClientState.READY:
            return
        out = notice + self.withheld
        self.withheld = b""
        if self.answers and self.answers[0][0] <= 0:  # LISTENs sent meanwhile
            out += self.answers_due(b"I")
        client.write(self.after_reply(out, b"I"))
        if not self.withheld:
            client._send_pending()

    def stop(self) -> None:
        """The client is gone: out of the board; what it did not get is dropped."""
        pool = self.client.pool
        if pool is None or pool.board is None:
            return
        board = pool.board
        board.waiters.pop(self, None)
        if self.subscribed:
            board.update(self, self.subscribed, NO_CHANNELS, monotonic())
            self.subscribed = NO_CHANNELS
        queue = self.notify_queue
        if queue:
            board.queued -= len(queue)
            board.dropped += sum(1 for message in queue if message[0] == NOTIFICATION_RESPONSE)
            queue.clear()

    # --- notifications ------------------------------------------------------------------------

    def notify(self, message: bytes) -> None:
        """A NotificationResponse for one of our channels (from the board)."""
        if self.client.state is ClientState.READY:
            self._push(message)

    def listener_lost(self) -> None:
        """The listener connection was lost: notifications sent meanwhile are gone."""
        if self.client.state is ClientState.READY:
            self._push(LOST_NOTICE)

    def _push(self, message: bytes) -> None:
        """Send message now if the client is idle and unlinked, else queue it (bounded)."""
        client = self.client
        pool = client.pool
        assert pool is not None and pool.board is not None
        board = pool.board
        queue = self.notify_queue
        if not queue and self._idle_unlinked():
            client.write(message)
            if message[0] == NOTIFICATION_RESPONSE:
                board.delivered += 1
            return
        limit = client.runtime.config.listen_queue_size
        if len(queue) >= limit:
            board.queued -= len(queue)
            board.dropped += 1 + sum(1 for held in queue if held[0] == NOTIFICATION_RESPONSE)
            queue.clear()
            log.warning(
                "%r more than listen_queue_size (%d) notifications waiting: closed", client, limit
            )
            error = PgtarnError(
                f"notification queue full: more than listen_queue_size ({limit})"
                " notifications are waiting for this client",
                sqlstate="53400",
                severity="FATAL",
            )
            if client.server is None and not client.expected:
                # idle: what its socket holds goes first, then the error, for a while
                client.close_flushing(error, FLUSH_GRACE)
            else:
                client._close_after(client.server, error)
            return
        queue.append(message)
        client.listening = True
        board.queued += 1

    def _idle_unlinked(self) -> bool:
        """Between messages of its stream: no server, nothing owed, nothing withheld."""
        client = self.client
        return (
            client.server is None
            and not client.expected
            and not self.withheld
            and not client.pending
            and not client.write_paused
            and client.state is ClientState.READY
            and not self._delivery_held()
        )

    def _delivery_held(self) -> bool:
        """PAUSE or SUSPEND hold notifications; RESUME releases them."""
        client = self.client
        pool = client.pool
        return pool is None or pool.paused or client.runtime.suspended

    def _take_notifications(self) -> bytes:
        """What waited in the queue, counted as delivered."""
        pool = self.client.pool
        assert pool is not None and pool.board is not None
        queue = self.notify_queue
        board = pool.board
        board.queued -= len(queue)
        board.delivered += sum(1 for message in queue if message[0] == NOTIFICATION_RESPONSE)
        out = b"".join(queue)
        queue.clear()
        return out

    def release_notifications(self) -> None:
        """Delivery may go on (RESUME, the socket drained): send what waited, if idle."""
        if self.notify_queue and self._idle_unlinked():
            self.client.write(self._take_notifications())


def local_batch(data: bytes, statements: dict[bytes, Parsed] | None) -> LocalBatch | None:
    """The batch at data's start if pgtarn answers it (statements: the client's statements
    of LISTEN so far); None if not; a length of 0 when what data holds of it is pgtarn's to
    answer but the batch goes on past it."""
    if data[0] == PARSE:
        if not _looks_like_listen(data):
            return None
    elif not statements:
        return None
    known = dict(statements) if statements else {}
    portals: dict[bytes, Parsed] = {}
    effects: list[Any] = []
    executed = 0
    replies = b""
    at = 0
    size = len(data)
    while at + 5 <= size:
        msg_type = data[at]
        end = at + 1 + int.from_bytes(data[at + 1 : at + 5], "big")
        if end < at + 5:
            return None
        if end > size:
            return _NOT_WHOLE
        body = data[at + 5 : end]
        if msg_type == PARSE:  # name, text, parameter types (none)
            name, sql = parse_text(body)
            subscriptions = as_subscriptions(effects_of(sql))
            if subscriptions is None or body[-2:] != b"\x00\x00":
                return None
            known[name] = subscriptions
            replies += build.PARSE_COMPLETE
        elif msg_type == BIND:  # portal, statement, no parameters
            portal_end = body.find(b"\x00")
            name = body[portal_end + 1 : body.find(b"\x00", portal_end + 1)]
            if name not in known:
                return None
            portals[body[:portal_end]] = known[name]
            replies += build.BIND_COMPLETE
        elif msg_type == DESCRIBE:
            name = body[1:-1]
            if name not in (known if body[:1] == b"S" else portals):
                return None
            replies += (build.NO_PARAMETERS if body[:1] == b"S" else b"") + build.NO_DATA
        elif msg_type == EXECUTE:
            parsed = portals.get(body[: body.find(b"\x00")])
            if parsed is None:
                return None
            effects += parsed.effects
            executed += parsed.statements
            replies += _completions(parsed)
        elif msg_type == CLOSE:
            name = body[1:-1]
            (known if body[:1] == b"S" else portals).pop(name, None)
            replies += build.CLOSE_COMPLETE
        elif msg_type in (SYNC, FLUSH):  # (Flush: replies now, no ReadyForQuery)
            return (
                end,
                Parsed(effects, executed) if executed else None,
                replies,
                msg_type == SYNC,
                known,
            )
        else:
            return None
        at = end
    return _NOT_WHOLE
