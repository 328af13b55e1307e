"""ClientLargeMessage, a part: one client message too long to hold, passed on in pieces.

The relay's scanner (or the framer's) stops at a watched message longer than
client_message_buffer that a chunk does not hold whole (MessageScanner.big_at): the
connection makes this part for it, and hands it every byte until the message ends. Its head
(proto.streaming.MessageStream: header and 8 KiB of body) decides how it goes:

- a Query: counted (one ReadyForQuery to come, which keeps the server linked until then),
  its text looked at piece by piece (session.streamlook) when the session is tracked: one
  that may change session state pins the client with state that is not followed (its
  server is closed when it leaves), never a state missed;
- a Parse of the unnamed statement, a Bind: passed on, a Bind's statement name rewritten
  for the server (the framer's STREAMED_HEAD part), as is the name of an unnamed Parse
  that is one EXECUTE (as a Query's below);
- a named Parse where pgtarn keeps prepared statements: its text cannot be kept to prepare
  it on other servers, so it is passed on under a server-side name of its own
  (Statement.held) and its client pinned to its server (HELD, whatever its batch's
  outcome; the server closed when the client leaves). Where that cannot be (a session not
  tracked, pin_session_state = 0, a head that does not show the name's end, or a text
  that may name SQL-level statements) it is refused in its place (54000, the connection
  kept) and its rest dropped;
- a Query that is one SQL PREPARE (sqlnames.scan_head: long for its statement's text) where
  pgtarn keeps prepared statements: as a named Parse, its text cannot be kept, so it is
  passed on as it is, the server's statement named as the client names it (the rewriter's
  STREAMED_HEAD: Statement.held), and its client pinned (HELD); where that cannot be (as
  for a Parse, or a name of pgtarn's kind) it is gathered whole as before;
- a Query that is one EXECUTE of a SQL-level prepared statement (sqlnames.scan_head: long
  for its arguments) where pgtarn keeps prepared statements: passed on through the
  framer's parts, the name in its head rewritten for the server and its length made
  right for it (the rewriter's STREAMED_HEAD); its look does not count the words of that
  EXECUTE, only what follows;
- a Describe or Close: no statement or portal name is that long, refused with 08P01 (the
  client closed, as for a message past max_packet_size);
- any other Query or unnamed Parse naming SQL-level prepared statements in its head (a
  DEALLOCATE, a script of statements; sqlnames.head_names_none tells a head whose naming
  words are all in literals or comments, which is not): its names cannot be rewritten
  (they may be anywhere in it), so it goes as written (the rewriter's CEDING_HEAD),
  after the client's statements are prepared on its server under the client's own names;
  its client is pinned there (CEDED, whatever its batch's outcome) and from its end
  relayed as a client that follows no statements (ClientRelay.cede_statements). Where that
  cannot be (_can_cede) it is gathered whole as before (max_packet_size bounds it),
  then relayed as usual (docs/clients.md says why);
- any Query passed on in pieces from a client with statements: names past its head are
  not rewritten, so its client's statements are prepared under their own names ahead of
  it (COPIES); if its look finds a word of a statement naming statements past the head,
  they are ceded at its end as above, and if not, closed after it (COPIES_CLOSED). A
  client with none is ceded all the same when its look finds one (what it prepares is the
  server's to know).

Pieces go the way the connection's bytes go (to_server, or the framer's parts), so a
client with no server yet holds at most PENDING_PAUSE of them, and one whose server's
socket is full is not read (the server's pause_writing). Nothing of the message is held
here but its head.
"""

from __future__ import annotations

from typing import Final

from ..errors import ProtocolViolation
from ..proto.msgtypes import BIND, CLOSE, DESCRIBE, PARSE, QUERY
from ..proto.streaming import MessageStream
from ..session.effects import (
    CEDED,
    HELD,
    NAMES_STATEMENTS,
    SCHEMA_CHANGE,
    UNTRACKED,
    Effect,
    Parsed,
    first_look,
)
from ..session.framer import SYNC_MARK, Part
from ..session.rewrite import (
    CEDING_HEAD,
    COPIES,
    COPIES_CLOSED,
    REFUSED_HEAD,
    SERVER_PREFIX,
    STREAMED_HEAD,
)
from ..session.sqlnames import (
    EXECUTE,
    PREPARE,
    begins_plainly,
    head_names_none,
    may_name_statements,
    scan_head,
)
from ..session.streamlook import StreamedText
from .interfaces import LargeClient

#: How a message goes, decided at its head.
_RAW: Final = 0  # its bytes as they are, to the server
_PARTS: Final = 1  # through the framer's parts (prepared statements)
_WHOLE: Final = 2  # gathered whole, then relayed as usual
_REFUSED: Final = 3  # refused with 08P01 (its client closed): nothing more taken
#: The pin of a streamed text that may change session state.
UNFOLLOWED: Final = "a message longer than client_message_buffer that may change session state"


class ClientLargeMessage:
    """A client message too long to hold, on its way (see the module docstring)."""

    __slots__ = (
        "_already",
        "_base",
        "_cede",
        "_client",
        "_copied",
        "_held",
        "_kept",
        "_look",
        "_stream",
        "_way",
        "first",
    )

    def __init__(self, client: LargeClient, first: bytes, max_size: int, already: int = 0) -> None:
        self._client = client
        #: The message's first bytes, from the chunk that began it (begin() takes them).
        self.first = first
        #: How many of them went to the server already (a relay that passes every chunk on
        #: as it is sent a header cut across chunks before its length was known).
        self._already = already
        self._stream = MessageStream(first[:5], max_size)
        self._way = -1  # (not decided until the head is in)
        self._look: StreamedText | None = None
        #: _WHOLE: the message gathered.
        self._kept = bytearray()
        #: A streamed Query of a tracked session: how many results of its batch come before
        #: its own (-1: unknown), as the relay's base.
        self._base = 0
        #: A named Parse or SQL PREPARE passed on, its client to be pinned (HELD) at its end.
        self._held = False
        #: A Query naming statements that goes as written, its client's statements the
        #: server's own from its head on (CEDING_HEAD), its client pinned at its end.
        self._cede = False
        #: The client's statements were prepared under its names ahead of this Query
        #: (COPIES): closed at its end, unless it names statements past its head.
        self._copied = False

    @property
    def done(self) -> bool:
        """The whole message was taken (the connection drops this part then)."""
        return self._stream.done

    def receive(self, data: bytes) -> bytes:
        """Take the message's bytes from data: returns what follows its end (b"" while it
        goes on), or, for a message gathered whole, the message and what follows it."""
        stream = self._stream
        if self._way == _REFUSED:  # (every later feed fails again, as a bad length does)
            raise ProtocolViolation(_too_long_name(stream.msg_type, stream.length))
        had_head = stream.head_ready
        piece, taken = stream.feed(data)
        if self._way == _WHOLE:
            self._kept += data[:taken]
        elif not had_head and stream.head_ready:
            self._decide(stream.head(), piece)
        elif piece:
            self._pass(piece)
        if not stream.done:
            return b""
        if self._way == _WHOLE:
            return bytes(self._kept) + data[taken:]
        self._end()
        return data[taken:]

    def _decide(self, head: bytes, piece: bytes) -> None:
        client = self._client
        msg_type = head[0]
        body = head[5:]
        framer = client.framer
        statements = framer is not None or client.follows_statements
        if msg_type in (DESCRIBE, CLOSE):
            self._way = _REFUSED
            raise ProtocolViolation(_too_long_name(msg_type, self._stream.length))
        whole = msg_type not in (QUERY, PARSE, BIND)
        #: A named Parse the rewriter refuses in its place (see the module docstring).
        refused = False
        name_end = -1
        #: A Query or unnamed Parse whose head names statements, rewritten there (the rest
        #: as it comes).
        named = False
        if msg_type == QUERY:
            look = first_look(body)
            # (its words may be in literals or comments only: then it names nothing)
            named = statements and look & NAMES_STATEMENTS != 0 and not head_names_none(body)
            if named:
                use = scan_head(body)
                # A PREPARE is passed on only where its client can be pinned (as a named
                # Parse's), under a name no statement of pgtarn's has.
                self._held = (
                    use is not None
                    and use.kind == PREPARE
                    and client.tracked
                    and bool(client.runtime.config.pin_session_state)
                    and not use.name.startswith(SERVER_PREFIX)
                )
                whole = use is None or (use.kind == PREPARE and not self._held)
                # Any other such text goes as written, once the client's statements are
                # the server's own (CEDING_HEAD), where its client can be pinned.
                self._cede = use is None and _between_batches(client) and _can_cede(client)
                whole = whole and not self._cede
        elif msg_type == PARSE:
            name_end = body.find(b"\x00")
            if statements and name_end != 0:
                self._held = (
                    name_end > 0
                    and client.tracked
                    and client.runtime.config.pin_session_state
                    and begins_plainly(body, name_end + 1)
                )
                refused = not self._held
            whole = (
                statements
                and name_end == 0
                and may_name_statements(body, 1)
                and not head_names_none(body[1:])
            )
            if whole and body.find(b"\x00", 1) < 0:  # (one EXECUTE, long for its text:
                use = scan_head(body[1:])  # its name rewritten in the head, as a Query's)
                named = use is not None and use.kind == EXECUTE
                whole = not named
            if whole:  # (as a Query's, where its client can be pinned)
                self._cede = _between_batches(client) and _can_cede(client)
                whole = not self._cede
        if whole:  # (today's way: kept whole, relayed when complete)
            self._way = _WHOLE
            self._kept += head + piece
            return
        if statements and framer is None and (msg_type != QUERY or named):
            client._start_statements()  # (the relay's way at a first Parse or Bind)
        framer = client.framer
        self._way = _RAW if framer is None else _PARTS
        if msg_type == QUERY:
            if look & SCHEMA_CHANGE:
                client.schema_change_sent()
            self._base = -1 if client.open_batch else 0
            client.open_batch = False
            client.expected += 1
        else:
            client.open_batch = True
            if self._way == _PARTS:  # (as the framer's relay follows the unnamed statement)
                if msg_type == PARSE:
                    if name_end == 0:
                        client.unnamed_unbound = True
                elif body[body.find(b"\x00") + 1 : body.find(b"\x00") + 2] == b"\x00":
                    client.unnamed_unbound = False  # a Bind of the unnamed statement
        if refused:  # (it never runs: nothing to look at)
            self._look = None
        elif client.tracked and msg_type != BIND:
            self._look = StreamedText()
            if msg_type == PARSE:  # its text, after its name (which may hold a quote)
                self._look.changes_state = name_end < 0  # (no name is that long)
                body = body[name_end + 1 :]
            # (the statement names of a rewritten head are followed: not words to pin on)
            self._look.feed(body, not named or self._cede)
        elif client.tracked and framer is not None and framer.named_effects:
            self._look = StreamedText()  # a Bind of a statement that changes state: its
            self._look.changes_state = True  # parameters are not all here to be read
        if (
            msg_type == QUERY
            and self._way == _PARTS
            and not self._cede
            and client.statements is not None
            and client.statements.names
            and _can_cede(client)
            and _between_batches(client)
        ):  # (names past its head are not rewritten: copies under the client's names)
            self._copied = True
            self._send([(COPIES, b"")], 0)
        if refused:
            self._send([(REFUSED_HEAD, head)], len(head))
        elif self._cede:
            self._send([(CEDING_HEAD, head)], len(head))
        elif self._way == _PARTS and (msg_type != QUERY or named):
            self._send([(STREAMED_HEAD, head)], len(head))
        else:
            self._forward(head[self._already :])
        if piece:
            self._pass(piece)

    def _pass(self, piece: bytes) -> None:
        look = self._look
        if look is not None and self._stream.msg_type != BIND:
            look.feed(piece)
        self._forward(piece)

    def _forward(self, piece: bytes) -> None:
        if self._way == _RAW:
            self._client._to_server(piece)
            return
        self._send([piece], len(piece))

    def _send(self, parts: list[Part], size: int) -> None:
        self._client._send_item((parts, None), size)

    def _end(self) -> None:
        """The message went whole: a Query's look decides, and a statement passed on pins."""
        client = self._client
        query = self._stream.msg_type == QUERY
        if self._way == _PARTS and query:
            self._send([SYNC_MARK], 0)
        effects: list[Effect] = []
        look = self._look
        if look is not None:
            look.finish()
            if look.schema_change:
                client.schema_change_sent()
            if look.changes_state:
                effects.append((UNTRACKED, UNFOLLOWED))
        if self._held:  # (last: its reason is the one said, and it holds if the batch fails)
            effects.append((UNTRACKED, HELD))
        if self._cede or (
            query
            and look is not None
            and look.names_statements
            and (client.framer is not None or client.follows_statements)
            and (self._copied or client.statements is None or not client.statements.names)
            and _can_cede(client)
        ):  # its names past the head are the server's: so are its client's from now on
            effects.append((UNTRACKED, CEDED))
            client._statements_ceded()
        elif self._copied:  # (it named none after all: the copies go)
            self._send([(COPIES_CLOSED, b"")], 0)
        if effects:
            # A Query's batch ends at the ReadyForQuery counted at its head (none can have
            # come before the whole message did); another's at the next Sync's, after those
            # owed now.
            replies_ahead = max(client.expected - 1, 0) if query else client.expected
            client._session_add(Parsed(effects, 1), replies_ahead, self._base)

    def begin(self) -> bytes:
        """Take the first bytes (the chunk that began the message): see receive."""
        first, self.first = self.first, b""
        return self.receive(first)


def _can_cede(client: LargeClient) -> bool:
    """Whether the client's statements can become its server's own (CEDING_HEAD): it can
    be pinned (a tracked session in transaction mode, pin_session_state), and each of its
    statements can be prepared under its own name (its text kept; a name of pgtarn's kind
    would meet the server's own). (The caller also sees that no extended batch is open:
    the copies go in batches of pgtarn's own, which must not fall inside the client's.)"""
    if not client.tracked or client.statement_mode or not client.runtime.config.pin_session_state:
        return False
    statements = client.statements
    if statements is None:
        return True
    return not any(
        name.startswith(SERVER_PREFIX) or (stmt.held and not stmt.sql)
        for name, stmt in statements.names.items()
    )


def _between_batches(client: LargeClient) -> bool:
    """Whether the client's message about to go starts a batch: nothing of an extended
    batch of its went since its last Sync or Query, where its server (or its wait for one)
    is now. Batches of pgtarn's own (the copies of CEDING_HEAD and COPIES) go there only
    then: one inside the client's would end it, and an error there would fail it."""
    pending = client.pending
    if pending:
        last = pending[-1]
        if isinstance(last, bytes):
            return False
        parts = last[0]
        if parts is None:  # (one whole Query)
            return True
        end = parts[-1] if parts else None
        return end is SYNC_MARK or (isinstance(end, tuple) and end[0] == QUERY)
    server = client.server
    if server is None:  # (no batch is open without its server)
        return True
    statements = server.statements
    return statements is None or statements.clean


def _too_long_name(msg_type: int, length: int) -> str:
    """The 08P01 for a Describe or Close longer than client_message_buffer."""
    what = "Describe" if msg_type == DESCRIBE else "Close"
    return (
        f"{what} message of {length} bytes is longer than client_message_buffer:"
        " no statement or portal name is that long"
    )
