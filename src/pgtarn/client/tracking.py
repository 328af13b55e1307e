"""A transaction-mode client's session state: texts read, batches applied, pins kept.

The relay hands every Query and Parse text that may change session state (a cheap first
look, effects.may_change_state) to _session_text, which parses it; the server relay reports
errors, and ready_for_query ReadyForQuery, so that each batch's effects apply with their
outcome. The settings are replayed by the server when lent (ServerConnection.link); state
that cannot move pins the client to its server until it is gone.
"""

from __future__ import annotations

import logging
from typing import Any

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
from .parsers import effects_of
from .transport import ClientTransport

log = logging.getLogger("pgtarn.client")


#: What _session_text returns for a Query pgtarn answers itself (listening.py): send nothing.
ANSWERED = b""


class ClientTracking(ClientTransport):
    """Session-state tracking for a pooled client (see the module docstring)."""

    __slots__ = ()

    def _start_tracking(self) -> None:
        """Logged in to a transaction or statement mode pool with track_session_state."""
        config = self.runtime.config
        if self.session_mode or not config.track_session_state:
            return
        # the state itself is made when first needed (_session_made); LISTEN and UNLISTEN
        # are answered here (listening.py)
        self.tracked = True

    def _session_made(self) -> SessionTracker:
        """The session state of a tracked client, made now if it had none: until a text that
        changes it, a client's state is the one every client starts with (no settings, no
        pins, nothing pending), and thousands of idle clients then hold no objects for it."""
        session = self.session
        if session is None:
            assert self.tracked
            session = self.session = SessionTracker(SessionState(_ignored(tuple(self.params))))
        return session

    def _owe_answer(self, entry: list[Any]) -> None:
        """A LISTEN/UNLISTEN reply pgtarn owes (listening.py), after those owed before it."""
        self._listen_made().answers.append(entry)

    def _start_with_settings(self, settings: dict[str, str]) -> None:
        """Settings from the StartupMessage's options that are not tracked parameters: the
        client's session starts with them, set on each server it gets (tracking is on).
        set_config takes the value as PostgreSQL takes it from options (a list such as
        search_path's is not one quoted name)."""
        self._session_made().state.start_with(
            {
                name: f"SELECT pg_catalog.set_config({build.quote_literal(name)}, "
                f"{build.quote_literal(value)}, false)"
                for name, value in settings.items()
            }
        )

    def _session_text(
        self, msg_type: int, body: bytes, replies_ahead: int, base: int = 0
    ) -> bytes | None:
        """A Query or Parse that may change session state, or a Bind or Close of a named
        statement while some change it; its batch ends at the ReadyForQuery replies_ahead + 1
        from now. base: for a Query not seen through the framer, how many results of its
        batch come before its own (-1: unknown).

        Returns the Query to send in place of a refused one (pin_session_state = 0), or
        ANSWERED for a Query of LISTEN/UNLISTEN only, which pgtarn answers (listening.py):
        its reply is due once replies_ahead ReadyForQuery have gone to the client.
        """
        session = self.session  # None: the state every client starts with (made when changed)
        parse_all = session is not None and session.parse_all
        # Bind, Close and Parse come through the framer only, which keeps the named effects
        framer = self.framer
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
                self._session_add(
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
            elif len(framer.named_effects) >= self.runtime.config.max_prepared_statements:
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
        if msg_type == QUERY and self.tracked and (session is None or not session.state.channels):
            # (a client that LISTENed on its server, pinned, goes on doing so there)
            subscriptions = as_subscriptions(parsed)
            if subscriptions is not None:
                self._session_made().add(subscriptions, replies_ahead, self._status_now())
                self._owe_answer([replies_ahead, subscriptions, None, True])
                self.listening = True
                return ANSWERED
        if msg_type == QUERY and not self.runtime.config.pin_session_state:
            refused = pin_reason(parsed)
            if refused:  # answered in its place in the stream: a block fails as with any error
                return raise_error("0A000", _refusal_message(refused))
        if parsed.rows and msg_type == QUERY and framer is not None and framer.hooking:
            base = framer.executes_before(True)
        self._session_add(parsed, replies_ahead, base)
        return None

    def _session_add(self, parsed: Parsed, replies_ahead: int, base: int) -> None:
        """parsed is part of the batch whose ReadyForQuery is replies_ahead + 1 from now; one
        read from its rows (base: see SessionTracker.add) has its server report them."""
        if parsed.parameters:  # no Bind gives them here: not followed
            parsed = with_parameters(parsed, None)
        self._session_made().add(parsed, replies_ahead, self._status_now(), base)
        if parsed.rows:
            server = self.server
            if server is not None:
                server.watch_rows(True)

    def _status_now(self) -> bytes:
        server = self.server
        if server is not None:
            return server.status
        route = self.route  # a BEGIN answered here (read_write_split): in a transaction
        return b"T" if route is not None and route.begin else b"I"

    def name_kept(self, name: bytes) -> None:
        """A Parse of a name the client has was refused (42P05) as it went to a server: the
        name's session effects are its statement's again, not the refused text's (the framer
        took them when it read the Parse, which may come before the name's own Parse went)."""
        framer, statements = self.framer, self.statements
        if not self.tracked or framer is None or statements is None:
            return
        framer.named_effects.pop(name, None)
        stmt = statements.names.get(name)
        if stmt is not None and not stmt.sql:
            self._session_text(PARSE, name + b"\x00" + stmt.parse[6 + len(stmt.name) :], 0)

    def error_relayed(self) -> None:
        """The linked server relays an ErrorResponse: the batch under way failed."""
        session = self.session
        if session is not None:
            session.error()

    def result_relayed(self, msg_type: int, body: bytes) -> None:
        """The linked server relays a DataRow or the end of a result (while rows are read)."""
        session = self.session
        if session is not None:
            session.result(msg_type, body)

    def _session_ready(self, status: bytes) -> bool:
        """A ReadyForQuery while batches are pending; False when the client was closed."""
        session = self.session
        assert session is not None
        was = session.state.reasons() if self.pinned else []
        watching = session.watching
        session.ready(status)
        if watching and not session.watching and self.server is not None:
            self.server.watch_rows(False)  # the replies' common case again
        state = session.state
        reasons = state.reasons()
        self.pinned = bool(reasons)
        if not reasons:
            return True
        begun = [reason for reason in reasons if reason not in was]
        stats = None if self.pool is None else self.pool.stats
        if begun and stats is not None:
            for reason in begun:
                if stats.note_pin(reason) and self.runtime.config.log_pooler_errors:
                    log.warning(
                        "%r pinned to its server: %s (%s)",
                        self,
                        reason,
                        state.untracked or "session state that cannot move",
                    )
        if self.runtime.config.pin_session_state or status != b"I":
            return True
        self.close(PgtarnError(_refusal_message(reasons[0]), sqlstate="0A000", severity="FATAL"))
        return False

    def pin_reasons(self) -> list[str]:
        """Why this client keeps its server (SHOW CLIENTS)."""
        session = self.session
        return session.state.reasons() if session is not None else []

    def tracked_settings(self) -> list[str]:
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
