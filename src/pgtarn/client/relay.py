"""The relay of a logged-in client's bytes: plain, with prepared statements, statement mode.

A part of the client connection that holds no field of its own: one ClientRelay (RELAY)
serves every client, and each method takes the client it works for, so that following a
Query reads in this file alone and a test can drive it with any client. (A relay object per
client would cost every logged-in client the 56 bytes of an object.)

Only Query, Sync and Terminate are noticed (each Query or Sync means one ReadyForQuery to
come); in transaction and statement mode with max_prepared_statements, the client's Parse/
Bind/Describe/Close go through the ClientFramer and are rewritten per server from its first
use of them.
"""

from __future__ import annotations

from typing import Final

from ..errors import PgtarnError
from ..proto import build
from ..proto.framing import shared_scanner
from ..proto.messages import nul_at
from ..proto.msgtypes import (
    BIND,
    CLIENT_RELAY_TYPES,
    PARSE,
    PARSE_TYPES,
    QUERY,
    STATEMENT_MESSAGES,
    STATEMENT_MESSAGES_OR_QUERY,
    STATEMENT_RELAY_TYPES,
    STATEMENT_WATCH_TYPES,
    SYNC,
    TERMINATE,
    TEXT_TYPES,
)
from ..session.effects import (
    CHANGES_STATE,
    NAMES_STATEMENTS,
    SCHEMA_CHANGE,
    first_look,
    may_change_state,
)
from ..session.framer import SYNC_MARK, ClientFramer, Part
from ..session.prepared import ClientStatements
from ..session.sqlnames import has_statement_words, may_name_statements
from ..views.states import READY_STATE, ClientState
from .link import LINK, TRANSACTION_REFUSED, TRANSACTION_REFUSED_RESPONSE
from .listening import local_batch
from .transport import ClientTransport

#: What a tracked session's relay watches: each watch set with Parse (made once, not per
#: client); and the bodies a relay that reads no text keeps (none: only counted).
WITH_PARSE = {
    watch: watch | PARSE_TYPES
    for watch in (CLIENT_RELAY_TYPES, STATEMENT_RELAY_TYPES, STATEMENT_WATCH_TYPES)
}
NO_BODIES: frozenset[int] = frozenset()
_TRANSACTION_WORDS: Final = (b"begin", b"start")
#: A Flush message, whole (Flushes change nothing in a batch: _only_flushes).
FLUSH_MESSAGE: Final = build.message(b"H")


class ClientRelay:
    """A logged-in client's bytes on their way to its server (see the module docstring).

    The client is a ClientTransport, a concrete class, not a typing.Protocol: in the compiled
    build its fields are then read as a C struct's, at every message.

    Long: the three ways a client's bytes go (plain, with prepared statements, statement
    mode) share their checks and their ways to the server; one class is one Query's path.
    """

    __slots__ = ()

    def start(self, client: ClientTransport) -> None:
        """Logged in to a pool: watch what this pool mode needs to notice."""
        config = client.runtime.config
        watch = STATEMENT_RELAY_TYPES if client.statement_mode else CLIENT_RELAY_TYPES
        if not client.session_mode and config.max_prepared_statements > 0:
            # The framer starts with the client's first Parse/Bind/Describe/Close.
            client.follows_statements = True
            watch = STATEMENT_WATCH_TYPES
            if config.schema_change_channel and client.pool is not None:
                client.runtime.registry.watch_schema(client.pool)  # (DDL made outside pgtarn)
        if not client.session_mode and config.track_session_state:
            # its session tracking is made when first needed (_tracking_made); LISTEN and
            # UNLISTEN are answered here (listening.py)
            client.tracked = True
        self._watch(client, watch)

    def _watch(self, client: ClientTransport, watch: frozenset[int]) -> None:
        """The client's scanner: watch, and Parse too with the texts of Query and Parse kept
        for a tracked session. Lent: the client keeps one of its own only while a message
        is cut (connection.py)."""
        config = client.runtime.config
        bodies = NO_BODIES
        if client.tracked:  # the texts of Query and Parse are looked at
            watch = WITH_PARSE[watch]
            bodies = TEXT_TYPES
        client.scanner = shared_scanner(
            watch, config.max_packet_size, bodies, config.client_message_buffer
        )

    def _local_batches(self, client: ClientTransport, data: bytes) -> bytes:
        """What is left of data after the batches at its start that pgtarn answers itself
        (a LISTEN through the extended protocol: listening.py); the LISTEN state is made
        for a client only when one is."""
        listen = client.listen
        if listen is None:
            session = client.session
            if (session is not None and session.state.channels) or local_batch(data, None) is None:
                return data  # (the common case: no LISTEN at data's start)
            listen = client._listen_made()
        return listen.local_batches(data)

    def _answer_now(self, client: ClientTransport) -> None:
        """A Query of the client's is answered here (LISTEN): its reply goes out now if
        nothing is owed before it."""
        listen = client.listen
        if listen is not None:
            listen.answer_now()

    def relay(self, client: ClientTransport, data: bytes) -> None:
        """A chunk from a client that no framer reads (no prepared statement named yet)."""
        listen = client.listen
        if listen is not None and listen.held_batch:  # the start of a batch that may be
            data, listen.held_batch = listen.held_batch + data, b""  # answered here (LISTEN)
        if (
            (
                data[0] == PARSE
                or (
                    listen is not None and listen.local_statements and data[0] in STATEMENT_MESSAGES
                )
            )
            and client.tracked
            and client.scanner.at_boundary
        ):
            data = self._local_batches(client, data)  # a LISTEN through the extended protocol
            if not data:
                return
        if client.statement_mode:
            data = self._refuse_transaction_blocks(client, data)
            if not data:
                return
        scanner = client.scanner
        if scanner.one_whole(data, QUERY):  # the common case: one whole simple Query
            body = data[5:]
            look = first_look(body)
            if look & SCHEMA_CHANGE:
                client.schema_change_sent()
            if client.follows_statements and look & NAMES_STATEMENTS:
                self.start_statements(client)
                self.relay_prepared(client, data)
                return
            was_open = client.open_batch
            client.open_batch = False  # (a Query ends a batch)
            self._relay_query(client, data, body, look, was_open)
            return
        if client.follows_statements:  # statement tracking is on, not yet needed
            # (the chunk may start with the end of a message whose start has gone already)
            cut = scanner.to_boundary(data)
            events = scanner.feed(data)
            if scanner.big_at >= 0:
                data = self._divert(client, data, scanner.big_at, scanner.big_start)
            for msg_type, body, _end in events:
                if msg_type in STATEMENT_MESSAGES or (
                    msg_type == QUERY
                    and _names_statements(data, body, len(events) == 1 and data[0] == QUERY)
                ):
                    # From the first message boundary on, the framer; nothing after it has
                    # gone yet. (A message found after the cut one: cut is not -1.)
                    if cut > 0:
                        self._relay_events(client, data[:cut], [e for e in events if e[2] <= cut])
                        if client.state is not READY_STATE:
                            return
                    self.start_statements(client)
                    self.relay_prepared(client, data[max(cut, 0) :])
                    return
            held = scanner.held
            client.open_batch = _goes_on(data, events, held, client.open_batch)
            if held and data[len(data) - held] in STATEMENT_MESSAGES_OR_QUERY:
                # The chunk ends inside a Parse/Bind/..., or a Query that may name SQL-level
                # statements: keep that start for the framer.
                self._relay_events(client, data[: len(data) - held], events)
                if client.state is READY_STATE:
                    self.start_statements(client)
                    self.relay_prepared(client, data[len(data) - held :])
                return
            self._relay_events(client, data, events)
            return
        if client.tracked:
            held_before = scanner.held  # (the last chunk ended inside a message)
            events = scanner.feed(data)
            if scanner.big_at >= 0:
                data = self._divert(client, data, scanner.big_at, scanner.big_start)
            client.open_batch = _goes_on(data, events, scanner.held, client.open_batch)
            if held_before or scanner.held:
                self._relay_whole_texts(client, data, events)
            else:
                self._relay_events(client, data, events)
            return
        events = scanner.feed(data)
        if scanner.big_at >= 0:  # (its header's start, if cut, went with the last chunk)
            start = scanner.big_start
            data = self._divert(client, data, scanner.big_at, start, len(start))
        client.open_batch = _goes_on(data, events, scanner.held, client.open_batch)
        self._relay_events(client, data, events)

    def _divert(
        self, client: ClientTransport, data: bytes, big_at: int, big_start: bytes, already: int = 0
    ) -> bytes:
        """The scanner stopped at a message too long to hold, at big_at in data (its first
        bytes, big_start, held from an earlier chunk, already of them sent): it goes in
        pieces (large.py) once what came before it is relayed, which is returned."""
        client.large = client._large_made(big_start + data[big_at:], already)
        return data[:big_at]

    def _relay_query(
        self, client: ClientTransport, data: bytes, body: bytes, look: int, was_open: bool
    ) -> None:
        """_relay_events for a chunk that is one whole Query (body: its text; look: its
        first_look; was_open: an extended batch was open before it, whose results come
        first)."""
        if client.tracked and (
            look & CHANGES_STATE
            or (
                (tracking := client.tracking) is not None
                and (session := tracking.session) is not None
                and session.parse_all
            )
        ):
            refusal = client._tracking_made().text(
                QUERY, body, client.expected, -1 if was_open else 0
            )
            if refusal is not None:  # a refusal PostgreSQL raises, or answered here (LISTEN)
                client.expected += 1
                if refusal:
                    LINK.to_server(client, refusal)
                else:
                    self._answer_now(client)
                return
        client.expected += 1
        LINK.to_server(client, data)

    def _relay_whole_texts(
        self, client: ClientTransport, data: bytes, events: list[tuple[int, bytes, int]]
    ) -> None:
        """_relay_events for a client whose texts are read, when a message is cut across
        chunks: a Query or Parse is held back until whole, since it may be answered here
        (LISTEN) or refused in its place, and then must not have reached a server in part."""
        scanner = client.scanner
        if events and events[0][2] < len(events[0][1]) + 5:
            # the first message began in bytes held back from an earlier chunk: whole again
            msg_type, body, end = events[0]
            whole = build.message(bytes((msg_type,)), body)
            shift = len(whole) - end
            data = whole + data[end:]
            events = [(msg_type, body, len(whole))] + [
                (kind, text, at + shift) for kind, text, at in events[1:]
            ]
        elif scanner.released:  # held back, but only the header of an unwatched message
            shift = len(scanner.released)
            data = scanner.released + data
            events = [(kind, text, at + shift) for kind, text, at in events]
        held = scanner.held
        if held:
            data = data[: len(data) - held]
        if data:
            self._relay_events(client, data, events)

    def cede_statements(self, client: ClientTransport) -> None:
        """The client's statements became its server's own (a long Query naming them that
        pgtarn could not rewrite went as written: large.py), its client pinned there: from
        now on its bytes go as it writes them, as a session's do. Called at the end of that
        message, a boundary: the framer is dropped and the relay reads as for a client that
        follows no statements (its names stay, unused, until it leaves)."""
        client.framer = None
        client.follows_statements = False
        self._watch(client, CLIENT_RELAY_TYPES)

    def statements_made(self, client: ClientTransport) -> ClientStatements:
        """The client's statement names, made at their first use: most clients of a pool
        that follows them never name one."""
        statements = client.statements
        if statements is None:
            assert client.follows_statements
            statements = client.statements = ClientStatements(client.runtime.statement_cache)
        return statements

    def start_statements(self, client: ClientTransport) -> None:
        """The client uses the extended protocol: track its statements from now on.

        Replies still owed for what went before are ReadyForQuery only (no statement
        messages were sent), so they become sync markers ahead of anything tracked.
        """
        self.statements_made(client)
        # The framer reads the bytes from here on: the relay's scanner, lent, goes back new
        # (what it held of a message is the framer's now; kept() leaves the shared one new).
        scanner = client.scanner.kept()
        client.scanner = scanner.home if scanner.home is not None else scanner
        config = client.runtime.config
        client.framer = ClientFramer(config.max_packet_size, config.client_message_buffer)
        if client.tracked:  # (the framer asks the session at each text: made now)
            tracking = client._tracking_made()
            client.framer.watch(tracking.made(), tracking.text)
        outstanding = client.expected
        server = client.server
        if server is not None:
            statements = server.prepared_statements()
            for _ in range(outstanding):
                statements.sync_sent()
        elif client.pending:
            raw = b"".join(item for item in client.pending if isinstance(item, bytes))
            parts: list[Part] = [raw, *([SYNC_MARK] * outstanding)]
            client.pending = [(parts, None)]

    def _relay_events(
        self, client: ClientTransport, data: bytes, events: list[tuple[int, bytes, int]]
    ) -> None:
        tracked = client.tracked
        for msg_type, body, end in events:
            if msg_type == TERMINATE:  # forward what came before it, then leave
                if end > 5:
                    LINK.to_server(client, data[: end - 5])
                client.state = ClientState.CLOSED
                client.connection_lost(None)
                if client.transport is not None:
                    client.transport.close()
                return
            # (the session is read at each message: a text before may have made it)
            if tracked and body and first_look(body, msg_type) & SCHEMA_CHANGE:
                client.schema_change_sent()
            if (
                tracked
                and body
                and (
                    may_change_state(body, msg_type)
                    or (
                        (tracking := client.tracking) is not None
                        and (session := tracking.session) is not None
                        and session.parse_all
                    )
                )
            ):
                # (a Query right after another, a Sync or the chunk's start begins its
                # batch; after other messages it ends theirs, whose results come first)
                begin = end - len(body) - 5
                base = (
                    0
                    if msg_type != QUERY
                    or begin <= 0
                    or any(at == begin and kind in CLIENT_RELAY_TYPES for kind, _text, at in events)
                    else -1
                )
                refusal = client._tracking_made().text(msg_type, body, client.expected, base)
                if refusal is not None:  # the Query goes as a refusal PostgreSQL raises,
                    if end > len(body) + 5:  # or is answered here (LISTEN)
                        LINK.to_server(client, data[: end - len(body) - 5])
                    client.expected += 1
                    if refusal:
                        LINK.to_server(client, refusal)
                    else:
                        self._answer_now(client)
                    if client.state is READY_STATE:
                        self._relay_events(client, data[end:], _events_after(events, end))
                    return
            if msg_type in (QUERY, SYNC):  # Query or Sync: one ReadyForQuery to come
                client.expected += 1
        if data:
            LINK.to_server(client, data)

    def relay_prepared(self, client: ClientTransport, data: bytes) -> None:
        """Transaction or statement mode with prepared statements: statements are rewritten
        per server."""
        framer = client.framer
        assert framer is not None and client.statements is not None
        listen = client.listen
        if listen is not None and listen.held_batch:  # the start of a batch that may be
            data, listen.held_batch = listen.held_batch + data, b""  # answered here (LISTEN)
        if (
            (
                data[0] == PARSE
                or (
                    listen is not None and listen.local_statements and data[0] in STATEMENT_MESSAGES
                )
            )
            and client.tracked
            and framer.idle
        ):
            data = self._local_batches(client, data)  # a LISTEN through the extended protocol
            if not data:
                return
        if client.statement_mode:
            data = self._refuse_transaction_blocks(client, data)
            if not data:
                return
        body = (
            data[5:]
            if (
                data[0] == QUERY
                and framer.idle
                and len(data) > 5
                and int.from_bytes(data[1:5], "big") + 1 == len(data)
            )
            else b""
        )
        if body and not (look := first_look(body)) & NAMES_STATEMENTS:
            # The common case: one whole simple Query, passed on as it is.
            if look & SCHEMA_CHANGE:
                client.schema_change_sent()
            if client.tracked and (
                look & CHANGES_STATE
                or (
                    (tracking := client.tracking) is not None
                    and (session := tracking.session) is not None
                    and session.parse_all
                )
            ):
                refusal = client._tracking_made().text(
                    QUERY, body, client.expected, -1 if client.open_batch else 0
                )
                if refusal is not None:
                    if not refusal:  # answered here (LISTEN)
                        client.expected += 1
                        self._answer_now(client)
                        return
                    data = refusal
            client.expected += 1
            LINK.send_item(client, (None, data), len(data))
            return
        # A DISCARD ALL or DEALLOCATE ALL (in a Query, or a prepared statement bound) makes
        # the server forget its statements, and the client its names, when the parts are
        # encoded for the server (in their place among them).
        parts, syncs = framer.feed(data, client.expected, client.open_batch)
        if framer.big_at >= 0:
            data = self._divert(client, data, framer.big_at, framer.big_start)
        client.expected += syncs
        if framer.schema_change:
            framer.schema_change = False
            client.schema_change_sent()
        client.open_batch = framer.held > 0 or _parts_go_on(parts, client.open_batch)
        unbound = client.unnamed_unbound = _unnamed_unbound(parts, client.unnamed_unbound)
        if unbound:
            client.open_batch = True
        listen = client.listen
        if listen is not None and listen.answers:  # a Query of the chunk is answered here
            self._answer_now(client)
        if parts:
            LINK.send_item(
                client, (parts, data if framer.whole and framer.plain else None), len(data)
            )
        if framer.terminated:
            client.state = ClientState.CLOSED
            client.connection_lost(None)
            if client.transport is not None:
                client.transport.close()

    def _refuse_transaction_blocks(self, client: ClientTransport, data: bytes) -> bytes:
        """Statement mode: a BEGIN / START TRANSACTION ends the client, as in PgBouncer, before
        any server sees it (b"" then).

        Only when nothing else is in flight (nor a reply answered here, withheld), so the
        error cannot overtake earlier replies; anything that still opens a transaction is
        caught at ReadyForQuery (ClientLink.link_ends).
        """
        if client.expected or client.server is not None or not data:
            return data
        listen = client.listen
        if listen is not None and (listen.withheld or listen.answers):
            return data
        framer = client.framer
        if not (client.scanner.at_boundary if framer is None else framer.idle):
            return data
        msg_type = data[0]
        if msg_type not in TEXT_TYPES or len(data) < 5:
            return data
        if msg_type == QUERY:
            text = data[5:69]
        else:  # Parse: statement name, then the query text
            name_end = data.find(b"\x00", 5)
            if name_end < 0:
                return data  # name not complete yet: left to the ReadyForQuery check
            text = data[name_end + 1 : name_end + 65]
        if not _opens_transaction(text):
            return data
        client.close(PgtarnError(TRANSACTION_REFUSED), TRANSACTION_REFUSED_RESPONSE)
        return b""


#: The one relay every client uses (it holds no field of any client).
RELAY: Final = ClientRelay()


def _goes_on(data: bytes, events: list[tuple[int, bytes, int]], held: int, was_open: bool) -> bool:
    """Whether the client's extended batch goes on after this chunk (its watched messages:
    Query, Sync, Terminate, ...): messages after its last Sync or Query, or one cut short.
    Flush asks for the replies so far and changes nothing: a chunk of Flushes leaves it as
    it was (was_open)."""
    if held:
        return True
    if not events:
        return was_open if _only_flushes(data) else bool(data)
    msg_type, _body, end = events[-1]
    if end != len(data) and not _only_flushes(data[end:]):
        return True
    return msg_type not in CLIENT_RELAY_TYPES


def _parts_go_on(parts: list[Part], was_open: bool) -> bool:
    """_goes_on for the framer's parts: after the last Sync mark (or Query), anything but
    raw Flushes means the batch goes on."""
    after = parts
    for at in range(len(parts) - 1, -1, -1):
        part = parts[at]
        if part is SYNC_MARK or (isinstance(part, tuple) and part[0] == QUERY):
            after = parts[at + 1 :]
            break
    else:
        if all(isinstance(part, bytes) and _only_flushes(part) for part in parts):
            return was_open
        return True
    return not all(isinstance(part, bytes) and _only_flushes(part) for part in after)


def _only_flushes(raw: bytes) -> bool:
    """Whether raw bytes are whole Flush messages only (or nothing)."""
    count = len(raw) // 5
    return len(raw) == 5 * count and raw == FLUSH_MESSAGE * count


def _names_statements(data: bytes, body: bytes, alone: bool) -> bool:
    """Whether a Query in data may name prepared statements. alone: data is that Query, and
    body its text when the scanner reads texts (b"" when not)."""
    if not alone:
        return has_statement_words(data)
    if body:  # the first look, which _relay_events takes of the same body too
        return first_look(body) & NAMES_STATEMENTS != 0
    return may_name_statements(data, 5)


def _unnamed_unbound(parts: list[Part], unbound: bool) -> bool:
    """Whether the client's unnamed statement is parsed and not bound yet after parts
    (unbound: it was before them): it lives on this server only (pg8000 parses, describes
    and binds in three batches), so the client keeps the server until a batch binds it."""
    for part in parts:
        if isinstance(part, tuple):
            msg_type, body = part
            if msg_type == PARSE:  # name, NUL, ...
                unbound = unbound or body[:1] == b"\x00"
            elif msg_type == BIND:  # portal, NUL, statement, NUL, ...
                statement = nul_at(body, 0) + 1
                if 0 < statement < len(body) and body[statement] == 0:
                    unbound = False  # Bind of the unnamed statement
    return unbound


def _events_after(events: list[tuple[int, bytes, int]], end: int) -> list[tuple[int, bytes, int]]:
    """The scanner's events after offset end, their offsets counted from there."""
    return [(msg_type, body, at - end) for msg_type, body, at in events if at > end]


def _opens_transaction(text: bytes) -> bool:
    """Whether a statement starts with BEGIN or START (TRANSACTION), ignoring comments."""
    text = text.lstrip()
    while text.startswith(b"--") or text.startswith(b"/*"):
        cut = text.find(b"\n") if text.startswith(b"--") else text.find(b"*/")
        if cut < 0:
            return False
        text = text[cut + (1 if text.startswith(b"--") else 2) :].lstrip()
    word = text[:5].lower()
    return word in _TRANSACTION_WORDS and (len(text) == 5 or not text[5:6].isalnum())
