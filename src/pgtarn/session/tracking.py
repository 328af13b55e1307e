"""A client's session state as PostgreSQL would hold it on the client's own connection.

SessionState applies the effects of each batch (a Query, or the messages up to a Sync) once
its ReadyForQuery arrives, with PostgreSQL's transaction semantics: a change inside a
transaction block is kept at COMMIT and undone at ROLLBACK, one after a savepoint is undone by
ROLLBACK TO it, and a failed batch outside a block changes nothing (its implicit transaction
rolls back). Session advisory locks and LOAD are not transactional. The settings are kept as
the SQL that replays them, in a dict that is replaced, never changed in place, so a server
can keep the one it was left with and compare it by identity.

SessionTracker ties the effects to the ReadyForQuery that ends their batch, and keeps the
rows that say what an advisory lock call did (rows.py).

Long: SessionState's transaction semantics (blocks, savepoints, failed batches) and
SessionTracker's batch bookkeeping change together whenever a new kind of effect is followed.
"""

from __future__ import annotations

from typing import Final

from ..proto.msgtypes import DATA_ROW
from .effects import (
    BEGIN,
    CEDED,
    CLOSE,
    COMMIT,
    DISCARD_ALL,
    DISCARD_TEMP,
    DROP_TEMP,
    FROM_CURRENT,
    HELD,
    HOLD,
    LISTEN,
    LOAD,
    LOCAL,
    LOCK,
    LOCK_ROW,
    LOCK_TAKEN,
    LOCK_UNCOUNTED,
    RELEASE,
    RESET,
    RESET_ALL,
    ROLE,
    ROLLBACK,
    ROW_EFFECTS,
    SAVEPOINT,
    SEED,
    SET,
    SUBSCRIBE,
    TEMP,
    TRANSACTION_CONTROL,
    UNLISTEN,
    UNLOCK,
    UNLOCK_ALL,
    UNLOCKED,
    UNLOCKED_ALL,
    UNSUBSCRIBE,
    UNTRACKED,
    Effect,
    Parsed,
)
from .rows import read

#: The settings of a session that changed none (shared: compared by identity). Final: a
#: static in the compiled build, not a module dictionary lookup at each link and release.
NO_SETTINGS: Final[dict[str, str]] = {}
_EMPTY: frozenset[str] = frozenset()
#: Shared empty containers, never written (each is replaced by a list or dict of its own
#: at its first item): thousands of idle clients then hold none of their own.
_NO_LOCKS: dict[str, int] = {}
_NO_SAVEPOINTS: list[tuple[str, Snapshot]] = []

# Pin reasons, as SHOW CLIENTS and the metrics name them.
ADVISORY_LOCK = "advisory_lock"
TEMP_OBJECT = "temp_object"
HOLD_CURSOR = "hold_cursor"
ROLE_PIN = "role"
LOAD_PIN = "load"
SEED_PIN = "seed"
LISTEN_PIN = "listen"
UNTRACKED_PIN = "untracked"
#: Reasons DISCARD ALL cannot clear: the server is closed after such a client.
CLOSE_AFTER = frozenset((LOAD_PIN, SEED_PIN, UNTRACKED_PIN))
#: The effects that pin, and the reason each gives (a ROLE effect pins when it sets one).
_PIN_OF = {
    LOCK: ADVISORY_LOCK,
    LOCK_UNCOUNTED: ADVISORY_LOCK,
    LOCK_ROW: ADVISORY_LOCK,
    LOCK_TAKEN: ADVISORY_LOCK,
    TEMP: TEMP_OBJECT,
    HOLD: HOLD_CURSOR,
    LISTEN: LISTEN_PIN,
    LOAD: LOAD_PIN,
    SEED: SEED_PIN,
    UNTRACKED: UNTRACKED_PIN,
    ROLE: ROLE_PIN,
}


def pin_reason(parsed: Parsed) -> str:
    """The reason the first effect of parsed that would pin gives ("" when none would)."""
    for effect in parsed.effects:
        reason = _PIN_OF.get(effect[0])
        if reason is not None and (effect[0] != ROLE or effect[2]):
            return reason
    return ""


# The transactional part of the state: (settings, local, temp, cursors, channels, roles,
# subscriptions).
Snapshot = tuple[
    dict[str, str],
    dict[str, str],
    frozenset[str],
    frozenset[str],
    frozenset[str],
    frozenset[str],
    frozenset[str],
]


class SessionState:
    """What one client changed in its session (see the module docstring)."""

    __slots__ = (
        "base",
        "channels",
        "cursors",
        "ignored",
        "load",
        "local",
        "locks",
        "locks_uncounted",
        "restore",
        "roles",
        "savepoints",
        "seed",
        "settings",
        "startup",
        "subscriptions",
        "temp",
        "untracked",
    )

    def __init__(self, ignored: frozenset[str] = _EMPTY) -> None:
        #: Names followed another way (ParameterStatus): never replayed from here.
        self.ignored = ignored
        #: The settings the session started with (options): RESET returns to them. A RESET
        #: on a server returns it to the server's own values: settings say so until the
        #: client gets a server again, when restore_startup sets them back (restore).
        self.startup = NO_SETTINGS
        self.restore = False
        self.settings = NO_SETTINGS
        #: SET LOCAL values of the open transaction (for SET ... FROM CURRENT).
        self.local = NO_SETTINGS
        #: The temporary relations created, by name ("": some other temporary object).
        self.temp = _EMPTY
        self.cursors = _EMPTY
        #: Channels LISTENed on the client's server (they pin it), and the ones pgtarn's
        #: listener connection listens to for it (they do not).
        self.channels = _EMPTY
        self.subscriptions = _EMPTY
        self.roles = _EMPTY
        #: Advisory locks by key (non-transactional), and whether some were not counted.
        self.locks = _NO_LOCKS
        self.locks_uncounted = False
        self.load = False
        self.seed = False
        #: Why the state could not be followed ("" while it can).
        self.untracked = ""
        #: The state when the open transaction began, once it changed something; and the
        #: savepoints set since then.
        self.base: Snapshot | None = None
        self.savepoints = _NO_SAVEPOINTS

    def start_with(self, settings: dict[str, str]) -> None:
        """The session begins with these settings (name -> the SQL that sets it), as its
        startup values: RESET, RESET ALL and DISCARD ALL return to them."""
        self.startup = self.settings = settings

    def restore_startup(self) -> None:
        """Before the next server is linked: the startup settings a RESET removed are the
        session's again (PostgreSQL's RESET returns to them)."""
        self.restore = False
        missing = {name: sql for name, sql in self.startup.items() if name not in self.settings}
        if missing:
            self.settings = {**self.settings, **missing}

    # --- what the pool needs to know ---------------------------------------------------------

    def reasons(self) -> list[str]:
        """Why this client must keep its server (empty: it need not)."""
        reasons = []
        if self.locks or self.locks_uncounted:
            reasons.append(ADVISORY_LOCK)
        if self.cursors:
            reasons.append(HOLD_CURSOR)
        if self.channels:
            reasons.append(LISTEN_PIN)
        if self.load:
            reasons.append(LOAD_PIN)
        if self.roles:
            reasons.append(ROLE_PIN)
        if self.seed:
            reasons.append(SEED_PIN)
        if self.temp:
            reasons.append(TEMP_OBJECT)
        if self.untracked:
            reasons.append(UNTRACKED_PIN)
        return reasons

    @property
    def pinned(self) -> bool:
        return bool(self.reasons())

    def committed_settings(self) -> dict[str, str]:
        """The settings a ROLLBACK of the open transaction would leave."""
        return self.settings if self.base is None else self.base[0]

    def committed_subscriptions(self) -> frozenset[str]:
        """The channels the client listens to through the listener connection, as of its
        last commit (a LISTEN in a transaction block counts from COMMIT on)."""
        return self.subscriptions if self.base is None else self.base[6]

    # --- applying a batch -----------------------------------------------------------------------

    def apply(self, parsed: list[Parsed], before: bytes, after: bytes, failed: bool) -> None:
        """A batch ended: before and after are the transaction status around it (ReadyForQuery
        bytes), failed whether it ended in an error."""
        # (texts read from rows come resolved from SessionTracker; unread, as written)
        effects = [
            effect
            for one in parsed
            for effect in (read(one, -1, _NO_ROWS, -1) if one.rows else one).effects
        ]
        if failed:
            self._failed(effects, sum(one.statements for one in parsed))
            return
        in_block = before != b"I"
        aborted = before == b"E"
        for effect in effects:
            kind = effect[0]
            if kind in TRANSACTION_CONTROL:
                in_block, aborted = self._transaction(effect, in_block, aborted)
            else:
                self._effect(effect, in_block)
        if in_block != (after != b"I"):
            # The transaction began or ended where no statement of ours said so.
            self._lost("a transaction began or ended unseen")

    def _failed(self, effects: list[Effect], statements: int) -> None:
        """A batch ended in an error: what ran before it is rolled back with its transaction
        (implicit, or the failed block), except advisory locks, which stay."""
        if any(effect[0] in TRANSACTION_CONTROL for effect in effects):
            self._lost("an error in a batch that controls its transaction")
            return
        for effect in effects:
            kind = effect[0]
            # What a row said happened did, and a lock among other expressions may have been
            # taken before the error (session locks outlive it). Of a batch of statements,
            # which ran is unknown: count what is not transactional (locks, never unlocks).
            # The one statement failed: nothing else of it happened.
            if (
                kind in _HAPPENED
                or (statements > 1 and kind in (LOCK, LOAD, SEED))
                or (kind == UNTRACKED and effect[1] in (HELD, CEDED))
            ):
                self._effect(effect, False)

    def _lost(self, why: str) -> None:
        self.untracked = why
        self.base = None
        self.savepoints = _NO_SAVEPOINTS

    def _snapshot(self) -> Snapshot:
        return (
            self.settings,
            self.local,
            self.temp,
            self.cursors,
            self.channels,
            self.roles,
            self.subscriptions,
        )

    def _restore(self, snapshot: Snapshot) -> None:
        (
            self.settings,
            self.local,
            self.temp,
            self.cursors,
            self.channels,
            self.roles,
            self.subscriptions,
        ) = snapshot

    def _transaction(self, effect: Effect, in_block: bool, aborted: bool) -> tuple[bool, bool]:
        kind = effect[0]
        if kind == BEGIN:
            return True, aborted if in_block else False
        if not in_block:
            return False, False  # COMMIT, ROLLBACK, ... outside a block: a warning, no effect
        if kind in (COMMIT, ROLLBACK):
            if self.base is not None and (kind == ROLLBACK or aborted):
                self._restore(self.base)
            self.base = None
            self.savepoints = _NO_SAVEPOINTS
            self.local = NO_SETTINGS
            return bool(effect[1]), False  # AND CHAIN: a new block at once
        name = effect[1]
        if kind == SAVEPOINT:
            if self.base is None:
                self.base = self._snapshot()
            savepoint = (name, self._snapshot())
            if self.savepoints:
                self.savepoints.append(savepoint)
            else:  # (never into the shared empty list)
                self.savepoints = [savepoint]
            return True, aborted
        index = _last(self.savepoints, name)
        if kind == RELEASE:
            if index >= 0:
                del self.savepoints[index:]
            return True, aborted
        # ROLLBACK TO: back to the savepoint, which stays; an unknown one was set before
        # anything here changed, so everything since the block began is undone.
        if index >= 0:
            self._restore(self.savepoints[index][1])
            del self.savepoints[index + 1 :]
        elif self.base is not None:
            self._restore(self.base)
            self.savepoints = _NO_SAVEPOINTS
        return True, False

    def _effect(self, effect: Effect, in_block: bool) -> None:
        kind = effect[0]
        if kind in (LOCK, LOCK_TAKEN):
            locks = self.locks if self.locks else {}  # (never into the shared empty dict)
            locks[effect[1]] = locks.get(effect[1], 0) + 1
            self.locks = locks
            return
        if kind == UNLOCK:
            self._unlock(effect[1])
            return
        if kind == UNLOCKED:
            # PostgreSQL released one lock of that mode: counted under this key, or (taken
            # under another text, $1 for this value) under another key of the same mode,
            # since what pins is how many are held, and each one taken was counted.
            key, shared = effect[1], effect[2]
            if key is None or key not in self.locks:
                key = next(
                    (held for held in self.locks if held.startswith("shared ") == shared), None
                )
            if key is not None:
                self._unlock(key)
            return
        if kind in (UNLOCK_ALL, UNLOCKED_ALL):
            self.locks = _NO_LOCKS
            self.locks_uncounted = False
            return
        if kind == LOCK_UNCOUNTED:
            self.locks_uncounted = True
            return
        if kind == LOAD:
            self.load = True
            return
        if kind == SEED:
            self.seed = True
            return
        if kind == UNTRACKED:
            self.untracked = effect[1]
            return
        if kind == DISCARD_ALL:
            self.locks = _NO_LOCKS
            self.locks_uncounted = False
            self.untracked = ""
            self._restore((NO_SETTINGS, NO_SETTINGS, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY))
            self.restore = bool(self.startup)
            return
        # transactional from here on
        if in_block and self.base is None:
            self.base = self._snapshot()
        if kind == SET:
            name = effect[1]
            if name not in self.ignored:
                self.settings = {**self.settings, name: effect[2]}
                if name in self.local:
                    self.local = _without(self.local, name)
        elif kind == RESET:
            name = effect[1]
            if name in self.settings:
                self.settings = _without(self.settings, name)
            if name in self.startup:
                self.restore = True
            if name in self.local:
                self.local = _without(self.local, name)
        elif kind == RESET_ALL:
            self.settings = NO_SETTINGS
            self.local = NO_SETTINGS
            self.restore = bool(self.startup)
        elif kind == LOCAL:
            if in_block and effect[1] not in self.ignored:
                self.local = {**self.local, effect[1]: effect[2]}
        elif kind == FROM_CURRENT:
            sql = self.local.get(effect[1])
            if sql:  # the value of a SET LOCAL becomes the session's
                self.settings = {**self.settings, effect[1]: sql}
            elif sql is not None:
                self.untracked = "SET FROM CURRENT of a SET LOCAL value that cannot be replayed"
        elif kind == DISCARD_TEMP:
            self.temp = _EMPTY
        elif kind == TEMP:
            self.temp = self.temp | {effect[1]}
        elif kind == DROP_TEMP:
            # A DROP that succeeded of a name the client made temporary dropped that one,
            # when qualified with pg_temp, or when the temporary schema is searched first
            # (search_path does not name it, and is known: not a ParameterStatus one).
            name = effect[1]
            if name in self.temp and (
                effect[2]
                or (
                    "search_path" not in self.ignored
                    and "pg_temp" not in self.settings.get("search_path", "")
                )
            ):
                self.temp = self.temp - {name}
        elif kind == HOLD:
            self.cursors = self.cursors | {effect[1]}
        elif kind == CLOSE:
            self.cursors = _EMPTY if effect[1] is None else self.cursors - {effect[1]}
        elif kind == LISTEN:  # on the server, which now delivers it (not the listener too)
            self.channels = self.channels | {effect[1]}
            if effect[1] in self.subscriptions:
                self.subscriptions = self.subscriptions - {effect[1]}
        elif kind == UNLISTEN:  # on the server: for the listener connection's channels too
            if effect[1] is None:
                self.channels = self.subscriptions = _EMPTY
            else:
                self.channels = self.channels - {effect[1]}
                self.subscriptions = self.subscriptions - {effect[1]}
        elif kind == SUBSCRIBE:
            self.subscriptions = self.subscriptions | {effect[1]}
        elif kind == UNSUBSCRIBE:
            self.subscriptions = _EMPTY if effect[1] is None else self.subscriptions - {effect[1]}
        elif kind == ROLE:
            if effect[2]:
                self.roles = self.roles | {effect[1]}
            elif effect[1] == "session_authorization":
                self.roles = _EMPTY  # also resets the role
            else:
                self.roles = self.roles - {effect[1]}

    def _unlock(self, key: str) -> None:
        count = self.locks.get(key, 0)
        if count > 1:
            self.locks[key] = count - 1
        elif count:
            del self.locks[key]


#: Effects that happened whatever the batch's outcome (see _failed).
_HAPPENED: Final = frozenset((LOCK_TAKEN, UNLOCKED, UNLOCKED_ALL, LOCK_UNCOUNTED))


def _without(values: dict[str, str], name: str) -> dict[str, str]:
    return {key: value for key, value in values.items() if key != name} or NO_SETTINGS


def _last(savepoints: list[tuple[str, Snapshot]], name: str) -> int:
    for index in range(len(savepoints) - 1, -1, -1):
        if savepoints[index][0] == name:
            return index
    return -1


class Batch:
    """The parsed texts of one batch (a Query, or the messages up to a Sync), and where the
    rows of those read from a row (Parsed.rows) come among the batch's results."""

    __slots__ = ("bases", "parsed", "remaining", "wanted")

    def __init__(self, remaining: int, parsed: Parsed) -> None:
        #: ReadyForQuery still to come up to this batch's.
        self.remaining = remaining
        self.parsed = [parsed]
        #: Per parsed text, how many results of the batch come before its first statement's
        #: (-1: unknown); None while no text of the batch is read from a row.
        self.bases: list[int] | None = None
        #: The results whose first DataRow is wanted (None: none is).
        self.wanted: set[int] | None = None

    def add(self, parsed: Parsed, base: int) -> None:
        self.parsed.append(parsed)
        if self.bases is not None:
            self.bases.append(base)

    def watch(self, parsed: Parsed, base: int) -> None:
        """parsed (the last text added) is read from its rows, base results after the
        batch's first."""
        bases = self.bases
        if bases is None:
            bases = self.bases = [0] * len(self.parsed)
        bases[-1] = base
        if base < 0:
            return
        wanted = self.wanted if self.wanted is not None else set()
        for effect in parsed.effects:
            if effect[0] in ROW_EFFECTS:
                wanted.add(base + effect[-3])
        self.wanted = wanted


_NO_BATCHES: list[Batch] = []
_NO_ROWS: dict[int, bytes] = {}


class SessionTracker:
    """Ties parsed batches to the ReadyForQuery that ends each (one per client), and reads
    the rows of the statements whose effects a row says (advisory lock calls)."""

    __slots__ = (
        "error_at",
        "failed",
        "parse_all",
        "pending",
        "results",
        "rows",
        "state",
        "status",
        "watching",
    )

    def __init__(self, state: SessionState) -> None:
        self.state = state
        #: The batches pending, oldest first.
        self.pending = _NO_BATCHES
        #: The transaction status before the oldest pending batch.
        self.status = b"I"
        #: An ErrorResponse came in the oldest pending batch.
        self.failed = False
        #: Whether every text must be parsed: transaction control matters while a batch is
        #: pending or a transaction holds changes.
        self.parse_all = False
        #: Whether a pending batch reads rows: its server then reports them (result).
        self.watching = False
        #: Of the batch whose replies come now: the results ended so far (CommandComplete,
        #: EmptyQueryResponse, PortalSuspended), the first DataRow of each wanted one, and
        #: how many results had ended at its ErrorResponse (-1: none came).
        self.results = 0
        self.rows = _NO_ROWS
        self.error_at = -1

    def add(self, parsed: Parsed, replies_ahead: int, status: bytes, base: int = 0) -> None:
        """parsed is part of the batch whose ReadyForQuery is replies_ahead + 1 from now;
        status is the transaction status now (used when nothing else is pending). base: how
        many results of its batch come before its first statement's (-1: unknown), for a
        text read from its rows."""
        remaining = replies_ahead + 1
        pending = self.pending
        if pending and pending[-1].remaining == remaining:
            batch = pending[-1]
            batch.add(parsed, base)
        else:
            batch = Batch(remaining, parsed)
            if pending:
                pending.append(batch)
            else:  # (never into the shared empty list)
                if not replies_ahead:
                    self.status = status
                    self.failed = False
                    self.results, self.rows, self.error_at = 0, _NO_ROWS, -1
                self.pending = [batch]
            self.parse_all = True
        if parsed.rows:
            batch.watch(parsed, base)
            self.watching = True

    def error(self) -> None:
        """An ErrorResponse is relayed to the client."""
        pending = self.pending
        if pending and pending[0].remaining == 1:
            self.failed = True
            if self.error_at < 0:
                self.error_at = self.results

    def result(self, msg_type: int, body: bytes) -> None:
        """A DataRow (body: its body), or a CommandComplete, EmptyQueryResponse or
        PortalSuspended that ends a statement's result, is relayed to the client."""
        pending = self.pending
        if not pending or pending[0].remaining != 1:
            return  # the replies of a batch not followed
        wanted = pending[0].wanted
        if wanted is None:
            return
        results = self.results
        if msg_type != DATA_ROW:
            self.results = results + 1
        elif results in wanted and results not in self.rows:
            rows = self.rows if self.rows else {}  # (never into the shared empty dict)
            rows[results] = body
            self.rows = rows

    def ready(self, status: bytes) -> None:
        """A ReadyForQuery is relayed: a batch may be complete."""
        pending = self.pending
        for batch in pending:
            batch.remaining -= 1
        while pending and pending[0].remaining <= 0:
            batch = pending.pop(0)
            parsed = batch.parsed
            if batch.bases is not None:
                parsed = [
                    read(one, base, self.rows, self.error_at) if one.rows else one
                    for one, base in zip(parsed, batch.bases, strict=True)
                ]
            self.state.apply(parsed, self.status, status, self.failed)
        self.status = status
        self.failed = False
        self.results, self.rows, self.error_at = 0, _NO_ROWS, -1
        if self.watching:
            self.watching = any(batch.bases is not None for batch in pending)
        self.parse_all = bool(pending) or self.state.base is not None
