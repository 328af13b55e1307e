"""SessionTracking: a transaction-mode client's session state: texts read, batches applied, pins.

The relay hands every Query and Parse text that may change session state (a cheap first
look, effects.may_change_state) to text(), which parses it; the server relay reports
errors, and the client's ready_for_query ReadyForQuery, so that each batch's effects apply
with their outcome. The settings are replayed by the server when lent
(ServerConnection.link); state that cannot move pins the client to its server until it is
gone.

A part the client connection owns, made at first use (its connection's _tracking_made): a
text that may change its state, its first prepared statement, settings in its startup
options. Most clients of a pool never use it, and thousands of idle ones then hold none of
it. Its one field of state is the SessionTracker, made at the first change (made()). The
flags the relay reads at every message (tracked, pinned) stay the connection's: a read there
costs no hop. It sees its connection through interfaces.TrackedClient.
"""

from __future__ import annotations

import logging

from ..errors import PgtarnError
from ..proto import build
from ..proto.msgtypes import BIND, CLOSE, PARSE, QUERY
from ..session.effects import (
    UNTRACKED,
    Parsed,
    as_subscriptions,
    may_change_state,
    parse_text,
    query_text,
    with_parameters,
)
from ..session.rewrite import raise_error
from ..session.tracking import SessionState, SessionTracker, pin_reason
from .interfaces import TrackedClient
from .parsers import effects_of

log = logging.getLogger("pgtarn.client")


#: What text() returns for a Query pgtarn answers itself (listening.py): send nothing.
ANSWERED = b""


class SessionTracking:
    """Session-state tracking for a pooled client (see the module docstring)."""

    __slots__ = ("client", "session")

    def __init__(self, client: TrackedClient) -> None:
        self.client = client
        #: The session state (None: the one every client starts with: no settings, no pins,
        #: nothing pending), made at its first change (made).
        self.session: SessionTracker | None = None

    def made(self) -> SessionTracker:
        """The session state, made now if there was none: until a text that changes it, a
        client's state is the one every client starts with, and holds no objects for it."""
        session = self.session
        if session is None:
            client = self.client
            assert client.tracked
            session = self.session = SessionTracker(SessionState(_ignored(tuple(client.params))))
        return session

    def start_with(self, settings: dict[str, str]) -> None:
        """Settings from the StartupMessage's options that are not tracked parameters: the
        client's session starts with them, set on each server it gets (tracking is on).
        set_config takes the value as PostgreSQL takes it from options (a list such as
        search_path's is not one quoted name)."""
        self.made().state.start_with(
            {
                name: f"SELECT pg_catalog.set_config({build.quote_literal(name)}, "
                f"{build.quote_literal(value)}, false)"
                for name, value in settings.items()
            }
        )

    def text(self, msg_type: int, body: bytes, replies_ahead: int, base: int = 0) -> bytes | None:
        """A Query or Parse that may change session state, or a Bind or Close of a named
        statement while some change it; its batch ends at the ReadyForQuery replies_ahead + 1
        from now. base: for a Query not seen through the framer, how many results of its
        batch come before its own (-1: unknown).

        Returns the Query to send in place of a refused one (pin_session_state = 0), or
        ANSWERED for a Query of LISTEN/UNLISTEN only, which pgtarn answers (listening.py):
        its reply is due once replies_ahead ReadyForQuery have gone to the client.
        """
        client = self.client
        session = self.session  # None: the state every client starts with (made when changed)
        parse_all = session is not None and session.parse_all
        # Bind, Close and Parse come through the framer only, which keeps the named effects
        framer = client.framer
        if msg_type == CLOSE:  # of a statement ('S') that may have changed state
            if body[:1] == b"S" and framer is not None:
                framer.named_effects.pop(body[1 : body.find(b"\x00", 1)], None)
            return None
        if msg_type == BIND:  # of a named statement that changes state: runs again
            portal_end = body.find(b"\x00")
            name = body[portal_end + 1 : body.find(b"\x00", portal_end + 1)]
            parsed = framer.named_effects.get(name) if framer is not None else None
            if parsed is not None:
                if parsed.parameters:  # set_config's value is a parameter: this Bind's
                    parsed = with_parameters(parsed, body)
                self.add(
                    parsed,
                    replies_ahead,
                    framer.executes_before(False) if framer is not None and parsed.rows else 0,
                )
            return None
        if msg_type == PARSE:
            name, sql = parse_text(body)
            if framer is not None:  # a name parsed again is a new statement
                framer.named_effects.pop(name, None)
            if not (parse_all or may_change_state(body, msg_type)):
                return None
        else:
            name, sql = b"", query_text(body)
        parsed = effects_of(sql)
        if not parsed.effects and not parse_all:
            return None
        if framer is None and msg_type == PARSE and parsed.rows:
            base = -1  # its Execute may come in another batch: its rows are not read
        if (name or (msg_type == PARSE and (parsed.rows or parsed.parameters)
                     and framer is not None)) and parsed.effects:  # fmt: skip
            # (the unnamed statement too when rows or parameters say its effects: they come
            # at its Bind)
            if framer is None:  # its Binds are not followed: it cannot be
                parsed = Parsed(
                    [
                        *parsed.effects,
                        (UNTRACKED, "a named prepared statement that changes session state"),
                    ],
                    parsed.statements,
                )
            elif len(framer.named_effects) >= client.runtime.config.max_prepared_statements:
                # bounded as a server's statements are: past it, no longer followed
                parsed = Parsed(
                    [
                        *parsed.effects,
                        (
                            UNTRACKED,
                            "more named statements that change session state than"
                            " max_prepared_statements",
                        ),
                    ],
                    parsed.statements,
                )
            else:
                framer.named_effects[name] = parsed
                return None  # counted at its Bind
        if msg_type == QUERY and client.tracked and (session is None or not session.state.channels):
            # (a client that LISTENed on its server, pinned, goes on doing so there)
            subscriptions = as_subscriptions(parsed)
            if subscriptions is not None:
                self.made().add(subscriptions, replies_ahead, client._status_now())
                client._owe_answer([replies_ahead, subscriptions, None, True])
                client.listening = True
                return ANSWERED
        if msg_type == QUERY and not client.runtime.config.pin_session_state:
            refused = pin_reason(parsed)
            if refused:  # answered in its place in the stream: a block fails as with any error
                return raise_error("0A000", _refusal_message(refused))
        if parsed.rows and msg_type == QUERY and framer is not None and framer.hooking:
            base = framer.executes_before(True)
        self.add(parsed, replies_ahead, base)
        return None

    def add(self, parsed: Parsed, replies_ahead: int, base: int) -> None:
        """parsed is part of the batch whose ReadyForQuery is replies_ahead + 1 from now; one
        read from its rows (base: see SessionTracker.add) has its server report them."""
        if parsed.parameters:  # no Bind gives them here: not followed
            parsed = with_parameters(parsed, None)
        client = self.client
        self.made().add(parsed, replies_ahead, client._status_now(), base)
        if parsed.rows:
            server = client.server
            if server is not None:
                server.watch_rows(True)

    def name_kept(self, name: bytes) -> None:
        """A Parse of a name the client has was refused (42P05) as it went to a server: the
        name's session effects are its statement's again, not the refused text's (the framer
        took them when it read the Parse, which may come before the name's own Parse went)."""
        client = self.client
        framer, statements = client.framer, client.statements
        if not client.tracked or framer is None or statements is None:
            return
        framer.named_effects.pop(name, None)
        stmt = statements.names.get(name)
        if stmt is not None and not stmt.sql:
            self.text(PARSE, name + b"\x00" + stmt.parse[6 + len(stmt.name) :], 0)

    def ready(self, status: bytes) -> bool:
        """A ReadyForQuery while batches are pending; False when the client was closed (its
        state would pin it, and pin_session_state = 0)."""
        client = self.client
        session = self.session
        assert session is not None
        was = session.state.reasons() if client.pinned else []
        watching = session.watching
        session.ready(status)
        server = client.server
        if watching and not session.watching and server is not None:
            server.watch_rows(False)  # the replies' common case again
        state = session.state
        reasons = state.reasons()
        client.pinned = bool(reasons)
        if not reasons:
            return True
        begun = [reason for reason in reasons if reason not in was]
        pool = client.pool
        stats = None if pool is None else pool.stats
        config = client.runtime.config
        if begun and stats is not None:
            for reason in begun:
                if stats.note_pin(reason) and config.log_pooler_errors:
                    log.warning(
                        "%r pinned to its server: %s (%s)",
                        client,
                        reason,
                        state.untracked or "session state that cannot move",
                    )
        if config.pin_session_state or status != b"I":
            return True
        client.close(PgtarnError(_refusal_message(reasons[0]), sqlstate="0A000", severity="FATAL"))
        return False

    def pin_reasons(self) -> list[str]:
        """Why the client keeps its server (SHOW CLIENTS)."""
        session = self.session
        return session.state.reasons() if session is not None else []

    def settings(self) -> list[str]:
        """The names of the settings the client changed (SHOW CLIENTS)."""
        session = self.session
        return sorted(session.state.settings) if session is not None else []


#: The names a session's state leaves to ParameterStatus, by the tracked parameters a client
#: has: one frozenset shared by all the clients with the same ones (about 1.5 KB each
#: otherwise). Few sets of names occur (they come from the configuration's tracked names).
_IGNORED: dict[tuple[str, ...], frozenset[str]] = {}
_IGNORED_MAX = 64


def _ignored(names: tuple[str, ...]) -> frozenset[str]:
    ignored = _IGNORED.get(names)
    if ignored is None:
        if len(_IGNORED) >= _IGNORED_MAX:
            _IGNORED.clear()
        ignored = _IGNORED[names] = frozenset(name.lower() for name in names)
    return ignored


def _refusal_message(reason: str) -> str:
    return (
        f"session state that would pin the client to its server is refused ({reason}):"
        " pin_session_state = 0"
    )
