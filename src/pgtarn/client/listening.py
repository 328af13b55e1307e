"""LISTEN and UNLISTEN answered by pgtarn for a pooled client, and its notifications delivered.

In transaction and statement mode a Query made only of LISTEN and UNLISTEN does not go to a
server (the next client of that server would get the notifications): tracking.py queues it
in ``answers`` with how many ReadyForQuery the client is owed before its reply. The reply
(CommandComplete for each statement, then ReadyForQuery) goes out in its place in the
stream: at once when nothing is owed, else right after the ReadyForQuery before it. Its
effects go through the session tracker like any batch, so a LISTEN in a transaction block
counts from COMMIT and is forgotten at ROLLBACK.

The channels committed go to the pool's ChannelBoard, whose listener connection LISTENs to
them. Until it has confirmed a new channel, the client's last ReadyForQuery is withheld and
what the client sends meanwhile waits (as for a server), so a NOTIFY committed after the
client saw its LISTEN succeed always reaches it.

Notifications go out at once when the client is idle and unlinked, else right after the
next ReadyForQuery with status idle (PostgreSQL, too, delivers none inside a transaction
block), and never while the pool is paused. At most listen_queue_size wait; past that the
client is closed.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any, Final

from ..errors import PgtarnError
from ..net.sending import SEND_NEVER
from ..pool.channels import LOST_MESSAGE
from ..proto import build
from ..server.connection import ServerConnection
from ..session.effects import SUBSCRIBE, Parsed, as_subscriptions, parse_text
from ..states import ClientState
from .extras import NO_CHANNELS
from .tracking import ClientTracking, effects_of

log = logging.getLogger("pgtarn.client")

READY: Final = {status: build.ready_for_query(status) for status in (b"I", b"T", b"E")}
RFQ_LEN: Final = 6
LISTEN_COMPLETE: Final = build.command_complete("LISTEN")
UNLISTEN_COMPLETE: Final = build.command_complete("UNLISTEN")
#: A LISTEN in a failed transaction block, as PostgreSQL answers any statement there.
ABORTED = build.error_response(
    "25P02", "current transaction is aborted, commands ignored until end of transaction block")
LOST_NOTICE = build.error_response("01000", LOST_MESSAGE, "WARNING", notice=True)
NOTIFICATION: Final = 0x41
#: Seconds a client closed at listen_queue_size has to read what was sent before its error.
FLUSH_GRACE: Final = 15.0
PARSE_COMPLETE: Final = build.message(b"1")
BIND_COMPLETE: Final = build.message(b"2")
CLOSE_COMPLETE: Final = build.message(b"3")
NO_DATA: Final = build.message(b"n")
NO_PARAMETERS: Final = build.message(b"t", b"\x00\x00")
#: The messages a batch pgtarn answers may start with: Parse, Bind, Describe, Close.
LOCAL_STARTS: Final = frozenset(b"PBDC")
#: A batch pgtarn may answer, cut across reads, is held back up to this many bytes (a driver's
#: LISTEN batch is a few hundred).
LOCAL_BATCH_MAX: Final = 8192
_NOT_WHOLE: Final[tuple[int, Parsed | None, bytes, bool]] = (0, None, b"", False)
_LISTEN_WORDS: Final = (b"listen", b"unlisten")


def _completions(parsed: Parsed) -> bytes:
    return b"".join([LISTEN_COMPLETE if effect[0] == SUBSCRIBE else UNLISTEN_COMPLETE
                     for effect in parsed.effects])


def _looks_like_listen(data: bytes) -> bool:
    """Whether the Parse at data's start has a text that begins with LISTEN or UNLISTEN."""
    name_end = data.find(b"\x00", 5)
    return name_end > 0 and data[name_end + 1 : name_end + 17].lstrip().lower().startswith(
        _LISTEN_WORDS)


class ClientListening(ClientTracking):
    """LISTEN answered here, notifications delivered (see the module docstring)."""

    __slots__ = ()

    # --- replies to LISTEN and UNLISTEN -------------------------------------------------------

    def _answer_now(self) -> None:
        """The relay counted a Query answered here: reply now if nothing is owed before it."""
        listen = self.listen
        if listen is None:
            return
        answers = listen.answers
        if not answers or answers[0][0] > 0 or listen.withheld:
            return
        server = self.server
        status = server.status if server is not None else b"I"
        out = self._answers_due(status)
        if self.state is ClientState.READY:
            self.write(self._after_reply(out, status))

    def _reply_here(self, replies: bytes) -> None:
        """A reply pgtarn makes itself while the client owes nothing (a refusal), with its
        ReadyForQuery: now, or after a withheld ReadyForQuery."""
        listen = self.listen
        if listen is None or not listen.withheld:
            self.write(replies + READY[b"I"])
            return
        self._owe_answer([0, None, replies, True])
        self.listening = True
        self.expected += 1

    def _answers_due(self, status: bytes) -> bytes:
        """The replies due now that a ReadyForQuery with status went to the client."""
        answers = self._listen_made().answers
        out = b""
        while answers and answers[0][0] <= 0:
            _remaining, parsed, replies, synced = answers.pop(0)
            if synced:
                for entry in answers:  # its reply ends with a ReadyForQuery too
                    entry[0] -= 1
            out += self._answer(parsed, replies, status, synced)
        return out

    def _answer(self, parsed: Parsed | None, replies: bytes | None, status: bytes,
                synced: bool) -> bytes:
        """The reply to one batch answered here: replies (None: a CommandComplete for each
        effect of parsed), then ReadyForQuery (synced); in a failed block, its error."""
        session = self._session_made()  # (a reply owed here came with the session's change)
        if status == b"E":
            session.error()
            replies = ABORTED
        elif replies is None:
            assert parsed is not None
            replies = _completions(parsed)
        if not synced:  # Flush: the replies so far, the batch goes on
            return replies
        reply = replies + READY[status]
        self.expected -= 1
        if session.pending:
            self._session_ready(status)
        return reply

    def _after_reply(self, out: bytes, status: bytes) -> bytes:
        """out, which ends with a ReadyForQuery of status, as it goes to the client: its
        ReadyForQuery withheld while the listener connection has not confirmed a new channel
        (the client owed nothing more), or notifications after it."""
        if not out.endswith(READY[status]):
            return out  # a batch that goes on (Flush), or nothing
        if self.listen_wait and not self.expected:
            # what the client sends now waits (_server_now)
            self._listen_made().withheld = out[-RFQ_LEN:]
            return out[:-RFQ_LEN]
        listen = self.listen
        if listen is not None and listen.notify_queue and status == b"I" \
                and not self._delivery_held():
            out += self._take_notifications()
        return out

    # --- the extended protocol: a batch of a LISTEN statement alone --------------------------

    def _local_batches(self, data: bytes) -> bytes:
        """The chunk after the batches at its start that pgtarn answers itself: a statement
        of LISTEN/UNLISTEN only, parsed, described, bound, executed or closed, up to Sync
        (as asyncpg's add_listener sends it). Anything else in a batch goes to the server
        as before. A batch not whole in the chunk (TCP may cut it anywhere) waits for the
        rest in held_batch, up to LOCAL_BATCH_MAX bytes; a longer one is no driver's LISTEN
        and goes on."""
        session = self.session
        if not self.tracked or (session is not None and session.state.channels):
            return data  # not tracked; or its LISTENs run on its server: pinned
        while data and data[0] in LOCAL_STARTS:
            batch = self._local_batch(data)
            if batch is None:
                break
            used, parsed, replies, synced = batch
            if not used:  # all pgtarn's to answer so far, but not whole
                if len(data) > LOCAL_BATCH_MAX:
                    break
                self._listen_made().held_batch = data
                return b""
            if parsed is not None:
                self._session_made().add(parsed, self.expected, self._status_now())
            self._owe_answer([self.expected, parsed, replies, synced])
            self.listening = True
            if synced:
                self.expected += 1
            self._answer_now()
            data = data[used:]
        listen = self.listen
        if listen is not None and listen.local_statements and data:
            listen.local_statements.pop(b"", None)  # a Query or Parse would replace it
        return data

    def _local_batch(self, data: bytes) -> tuple[int, Parsed | None, bytes, bool] | None:
        """The length of the batch at data's start, its effects, its replies and whether it
        ends with a Sync (else a Flush), if pgtarn answers it; None if not; a length of 0
        when what data holds of it is pgtarn's to answer but the batch goes on past it."""
        listen = self.listen
        statements = None if listen is None else listen.local_statements
        if data[0] == 0x50:
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
            if msg_type == 0x50:  # Parse: name, text, parameter types (none)
                name, sql = parse_text(body)
                subscriptions = as_subscriptions(effects_of(sql))
                if subscriptions is None or body[-2:] != b"\x00\x00":
                    return None
                known[name] = subscriptions
                replies += PARSE_COMPLETE
            elif msg_type == 0x42:  # Bind: portal, statement, no parameters
                portal_end = body.find(b"\x00")
                name = body[portal_end + 1 : body.find(b"\x00", portal_end + 1)]
                if name not in known:
                    return None
                portals[body[:portal_end]] = known[name]
                replies += BIND_COMPLETE
            elif msg_type == 0x44:  # Describe
                name = body[1:-1]
                if name not in (known if body[:1] == b"S" else portals):
                    return None
                replies += (NO_PARAMETERS if body[:1] == b"S" else b"") + NO_DATA
            elif msg_type == 0x45:  # Execute
                parsed = portals.get(body[: body.find(b"\x00")])
                if parsed is None:
                    return None
                effects += parsed.effects
                executed += parsed.statements
                replies += _completions(parsed)
            elif msg_type == 0x43:  # Close
                name = body[1:-1]
                (known if body[:1] == b"S" else portals).pop(name, None)
                replies += CLOSE_COMPLETE
            elif msg_type in (0x53, 0x48):  # Sync, or Flush (replies now, no ReadyForQuery)
                self._listen_made().local_statements = known
                return (end, Parsed(effects, executed) if executed else None, replies,
                        msg_type == 0x53)
            else:
                return None
            at = end
        return _NOT_WHOLE

    def _send_pending(self) -> None:
        """Bytes that waited behind a withheld ReadyForQuery: to a server now (link.py)."""
        raise NotImplementedError

    # --- the session's channels ------------------------------------------------------------

    def _session_ready(self, status: bytes) -> bool:
        if not super()._session_ready(status):
            return False
        session = self.session
        assert session is not None
        committed = session.state.committed_subscriptions()
        if committed is not self.subscribed:
            self._subscribe(committed)
        return True

    def _subscribe(self, channels: frozenset[str]) -> None:
        """The board gets this client's committed channels."""
        pool = self.pool
        listen = self.listen
        if listen is None:
            if not channels:  # none before, none now (and no state made for it)
                return
            listen = self._listen_made()
        if pool is None or pool.board is None or channels == listen.subscribed:
            listen.subscribed = channels
            return
        confirmed = pool.board.update(self, listen.subscribed, channels, monotonic())
        listen.subscribed = channels
        self.listen_wait = not confirmed
        self.listening = True

    def listener_confirmed(self, warning: str) -> None:
        """The listener connection LISTENs to every channel of ours (or, warning, will not
        soon): send the withheld ReadyForQuery and what waited behind it."""
        self.listen_wait = False
        notice = build.error_response("01000", warning, "WARNING", notice=True) if warning \
            else b""
        listen = self.listen
        if listen is None or not listen.withheld:
            if notice:
                self._push(notice)
            return
        if self.state is not ClientState.READY:
            return
        out = notice + listen.withheld
        listen.withheld = b""
        if listen.answers and listen.answers[0][0] <= 0:  # LISTENs sent meanwhile
            out += self._answers_due(b"I")
        self.write(self._after_reply(out, b"I"))
        if not listen.withheld:
            self._send_pending()

    def _stop_listening(self) -> None:
        """The client is gone: out of the board; what it did not get is dropped."""
        pool = self.pool
        if pool is None or pool.board is None:
            return
        board = pool.board
        board.waiters.pop(self, None)
        listen = self.listen
        if listen is None:
            return
        if listen.subscribed:
            board.update(self, listen.subscribed, NO_CHANNELS, monotonic())
            listen.subscribed = NO_CHANNELS
        queue = listen.notify_queue
        if queue:
            board.queued -= len(queue)
            board.dropped += sum(1 for message in queue if message[0] == NOTIFICATION)
            queue.clear()

    def leave_containers(self) -> None:
        super().leave_containers()
        self._stop_listening()

    # --- notifications ------------------------------------------------------------------------

    def notify(self, message: bytes) -> None:
        """A NotificationResponse for one of our channels (from the board)."""
        if self.state is ClientState.READY:
            self._push(message)

    def listener_lost(self) -> None:
        """The listener connection was lost: notifications sent meanwhile are gone."""
        if self.state is ClientState.READY:
            self._push(LOST_NOTICE)

    def _push(self, message: bytes) -> None:
        """Send message now if the client is idle and unlinked, else queue it (bounded)."""
        pool = self.pool
        assert pool is not None and pool.board is not None
        board = pool.board
        queue = self._listen_made().notify_queue
        if not queue and self._idle_unlinked():
            self.write(message)
            if message[0] == NOTIFICATION:
                board.delivered += 1
            return
        limit = self.runtime.config.listen_queue_size
        if len(queue) >= limit:
            board.queued -= len(queue)
            board.dropped += 1 + sum(1 for held in queue if held[0] == NOTIFICATION)
            queue.clear()
            log.warning("%r more than listen_queue_size (%d) notifications waiting: closed",
                        self, limit)
            error = PgtarnError(
                f"notification queue full: more than listen_queue_size ({limit})"
                " notifications are waiting for this client", sqlstate="53400",
                severity="FATAL")
            if self.server is None and not self.expected:
                # idle: what its socket holds goes first, then the error, for a while
                self.close_flushing(error, FLUSH_GRACE)
            else:
                self._close_after(self.server, error)
            return
        queue.append(message)
        self.listening = True
        board.queued += 1

    def _idle_unlinked(self) -> bool:
        """Between messages of its stream: no server, nothing owed, nothing withheld."""
        return (self.server is None and not self.expected and not self.withheld
                and not self.pending and not self.write_paused
                and self.state is ClientState.READY and not self._delivery_held())

    def _delivery_held(self) -> bool:
        """PAUSE or SUSPEND hold notifications; RESUME releases them."""
        pool = self.pool
        return pool is None or pool.paused or self.runtime.suspended

    def _take_notifications(self) -> bytes:
        """What waited in the queue, counted as delivered."""
        listen = self.listen
        assert listen is not None and self.pool is not None and self.pool.board is not None
        queue = listen.notify_queue
        board = self.pool.board
        board.queued -= len(queue)
        board.delivered += sum(1 for message in queue if message[0] == NOTIFICATION)
        out = b"".join(queue)
        queue.clear()
        return out

    def release_notifications(self) -> None:
        """Delivery may go on (RESUME, the socket drained): send what waited, if idle."""
        listen = self.listen
        if listen is not None and listen.notify_queue and self._idle_unlinked():
            self.write(self._take_notifications())

    def pause_writing(self) -> None:
        self.write_paused = True
        super().pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        super().resume_writing()
        self.release_notifications()

    # --- closing --------------------------------------------------------------------------------

    def _close_after(self, server: ServerConnection | None, error: PgtarnError) -> None:
        """Close with error, unless server's reply was relayed only in part: an ErrorResponse
        in the middle of a message would corrupt the stream, so then just close."""
        if server is not None and not server.scanner.at_boundary:
            self.close_reason = error.message
            self.send_state = SEND_NEVER
            if self.transport is not None:
                self.transport.abort()  # half a message sent: nothing more is worth flushing
            self.leave_containers()
            return
        self.close(error)
