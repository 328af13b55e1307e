"""Tests for pgtarn.session.tracking: the session model, and batches tied to ReadyForQuery."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.proto.build import data_row
from pgtarn.session.effects import Parsed, as_subscriptions
from pgtarn.session.parsing import effects_of
from pgtarn.session.tracking import (
    ADVISORY_LOCK,
    HOLD_CURSOR,
    LISTEN_PIN,
    LOAD_PIN,
    NO_SETTINGS,
    ROLE_PIN,
    SEED_PIN,
    TEMP_OBJECT,
    UNTRACKED_PIN,
    SessionState,
    SessionTracker,
)

IDLE, BLOCK, FAILED = b"I", b"T", b"E"

A1 = "SET a.x TO 1"
A2 = "SET a.x TO 2"
B1 = "SET b.x TO 1"


def run(
    state: SessionState,
    *texts: str,
    before: bytes = IDLE,
    after: bytes | None = None,
    failed: bool = False,
) -> None:
    """One batch of texts (a Query, or the Parses up to a Sync) ends at a ReadyForQuery."""
    state.apply(
        [effects_of(text) for text in texts], before, before if after is None else after, failed
    )


def values(state: SessionState) -> dict[str, str]:
    return dict(state.settings)


# --- settings and transactions -------------------------------------------------------------------


def test_startup_settings_are_what_reset_returns_to_once_a_server_is_linked_again() -> None:
    state = SessionState()
    startup = {"a.x": A1}
    state.start_with(startup)
    assert state.settings is startup and not state.restore
    run(state, A2, B1)
    run(state, "RESET a.x")  # on the server: its own value, until the next link
    assert values(state) == {"b.x": B1} and state.restore
    state.restore_startup()
    assert values(state) == {"a.x": A1, "b.x": B1} and not state.restore
    for reset in ("RESET ALL", "DISCARD ALL"):
        run(state, A2, B1)
        run(state, reset)
        assert state.settings is NO_SETTINGS and state.restore
        state.restore_startup()
        assert values(state) == {"a.x": A1}
    run(state, "RESET b.x")  # not a startup setting: nothing to restore
    assert not state.restore


def test_a_new_session_has_changed_nothing() -> None:
    state = SessionState()
    assert state.settings is NO_SETTINGS and state.local is NO_SETTINGS
    assert not state.pinned and state.reasons() == []
    assert state.untracked == ""


def test_set_in_autocommit() -> None:
    state = SessionState()
    run(state, A1)
    assert values(state) == {"a.x": A1}
    run(state, A2)
    assert values(state) == {"a.x": A2}
    assert state.base is None and not state.pinned and state.untracked == ""


def test_reset_and_set_to_default_forget_a_setting() -> None:
    state = SessionState()
    run(state, A1, B1)
    run(state, "RESET a.x")
    assert values(state) == {"b.x": B1}
    run(state, "SET b.x TO DEFAULT")
    assert state.settings is NO_SETTINGS
    run(state, "RESET c.x")  # never set: nothing to forget
    assert state.settings is NO_SETTINGS


def test_set_in_a_committed_block() -> None:
    state = SessionState()
    run(state, "BEGIN", after=BLOCK)
    run(state, A1, before=BLOCK)
    assert values(state) == {"a.x": A1}
    assert state.committed_settings() is NO_SETTINGS  # what a ROLLBACK would leave
    run(state, "COMMIT", before=BLOCK, after=IDLE)
    assert values(state) == {"a.x": A1}
    assert state.base is None and state.committed_settings() is state.settings


def test_a_whole_block_in_one_query() -> None:
    state = SessionState()
    run(state, "BEGIN; SET a.x TO 1; COMMIT; BEGIN; SET b.x TO 1; ROLLBACK")
    assert values(state) == {"a.x": "SET a.x TO 1"}
    assert state.untracked == ""


def test_set_in_a_rolled_back_block() -> None:
    state = SessionState()
    run(state, A1)
    kept = state.settings
    run(state, "BEGIN", after=BLOCK)
    run(state, A2, B1, before=BLOCK)
    run(state, "RESET a.x", before=BLOCK)
    assert values(state) == {"b.x": B1}
    run(state, "ROLLBACK", before=BLOCK, after=IDLE)
    assert state.settings is kept
    assert state.base is None and state.savepoints == []


def test_a_block_that_changed_nothing_keeps_no_snapshot() -> None:
    state = SessionState()
    run(state, A1)
    run(state, "BEGIN; SELECT pg_advisory_lock(1)", after=BLOCK)
    assert state.base is None  # locks are not transactional
    run(state, "ROLLBACK", before=BLOCK, after=IDLE)
    assert values(state) == {"a.x": A1}
    assert state.locks == {"1": 1}


def test_rollback_to_a_savepoint() -> None:
    state = SessionState()
    run(state, "BEGIN; SET a.x TO 1; SAVEPOINT s", after=BLOCK)
    run(state, A2, B1, before=BLOCK)
    run(state, "ROLLBACK TO s", before=BLOCK)
    assert values(state) == {"a.x": "SET a.x TO 1"}
    # the savepoint stays, and can be rolled back to again
    run(state, "SET c.x TO 1; ROLLBACK TO SAVEPOINT s", before=BLOCK)
    assert values(state) == {"a.x": "SET a.x TO 1"}
    assert [name for name, _snapshot in state.savepoints] == ["s"]
    run(state, "COMMIT", before=BLOCK, after=IDLE)
    assert values(state) == {"a.x": "SET a.x TO 1"}


def test_rollback_to_the_latest_savepoint_of_a_name() -> None:
    state = SessionState()
    run(
        state,
        "BEGIN; SAVEPOINT s; SET a.x TO 1; SAVEPOINT s; SET a.x TO 2; ROLLBACK TO s",
        after=BLOCK,
    )
    assert values(state) == {"a.x": "SET a.x TO 1"}
    run(state, "RELEASE s; ROLLBACK TO s", before=BLOCK)  # the first s
    assert state.settings is NO_SETTINGS


def test_rollback_to_a_savepoint_destroys_later_ones() -> None:
    state = SessionState()
    run(
        state,
        "BEGIN; SAVEPOINT s1; SET a.x TO 1; SAVEPOINT s2; SET b.x TO 1; ROLLBACK TO s1",
        after=BLOCK,
    )
    assert [name for name, _snapshot in state.savepoints] == ["s1"]
    assert state.settings is NO_SETTINGS


def test_rollback_to_an_unknown_savepoint_undoes_the_whole_block() -> None:
    # a savepoint not seen was set before anything in the block changed (nothing is parsed
    # before that), so going back to it undoes all of the block
    state = SessionState()
    run(state, A1)
    kept = state.settings
    run(state, "BEGIN", after=BLOCK)  # ... then SAVEPOINT u, which no first look lets through
    run(state, "SET a.x TO 2; SAVEPOINT s; SET b.x TO 1", before=BLOCK)
    run(state, "ROLLBACK TO u", before=BLOCK)
    assert state.settings is kept
    assert state.savepoints == []  # s came after u: gone with it
    run(state, "COMMIT", before=BLOCK, after=IDLE)
    assert state.settings is kept and state.untracked == ""


def test_rollback_to_an_unknown_savepoint_when_nothing_changed() -> None:
    state = SessionState()
    run(state, A1)
    run(state, "ROLLBACK TO u", before=BLOCK)
    assert values(state) == {"a.x": A1} and state.base is None


def test_release_keeps_the_changes_in_the_block() -> None:
    state = SessionState()
    run(state, "BEGIN; SAVEPOINT s1; SET a.x TO 1; SAVEPOINT s2; SET b.x TO 1", after=BLOCK)
    run(state, "RELEASE s2", before=BLOCK)
    assert [name for name, _snapshot in state.savepoints] == ["s1"]
    assert set(state.settings) == {"a.x", "b.x"}
    run(state, "ROLLBACK TO s1", before=BLOCK)  # what s2 held went with s1 now
    assert state.settings is NO_SETTINGS
    run(state, "SET a.x TO 3; RELEASE SAVEPOINT s1; COMMIT", before=BLOCK, after=IDLE)
    assert values(state) == {"a.x": "SET a.x TO 3"}


def test_release_of_an_unknown_savepoint_changes_nothing() -> None:
    state = SessionState()
    run(state, "BEGIN; SAVEPOINT s; SET a.x TO 1", after=BLOCK)
    run(state, "RELEASE u", before=BLOCK)
    assert [name for name, _snapshot in state.savepoints] == ["s"]
    assert values(state) == {"a.x": "SET a.x TO 1"}


def test_commit_of_an_aborted_block_rolls_back() -> None:
    state = SessionState()
    run(state, A1)
    kept = state.settings
    run(state, "BEGIN; SET a.x TO 2", after=BLOCK)
    run(state, "SELECT 1/0", before=BLOCK, after=FAILED, failed=True)
    assert values(state) == {"a.x": "SET a.x TO 2"}  # until the block ends
    run(state, "COMMIT", before=FAILED, after=IDLE)
    assert state.settings is kept and state.base is None


def test_rollback_to_leaves_the_aborted_state() -> None:
    state = SessionState()
    run(state, "BEGIN; SAVEPOINT s; SET a.x TO 1", after=BLOCK)
    run(state, "SELECT 1/0", before=BLOCK, after=FAILED, failed=True)
    run(state, "ROLLBACK TO s; SET b.x TO 1; COMMIT", before=FAILED, after=IDLE)
    assert values(state) == {"b.x": B1}


def test_commit_or_rollback_outside_a_block_does_nothing() -> None:
    state = SessionState()
    run(state, A1)
    run(state, "COMMIT")
    run(state, "ROLLBACK; RELEASE s")
    assert values(state) == {"a.x": A1} and state.untracked == ""


def test_and_chain_opens_a_new_block() -> None:
    state = SessionState()
    run(state, "BEGIN; SET a.x TO 1; COMMIT AND CHAIN; SET b.x TO 1; ROLLBACK")
    assert values(state) == {"a.x": "SET a.x TO 1"}
    run(state, "BEGIN; SET b.x TO 1; ROLLBACK AND CHAIN; SET c.x TO 1", after=BLOCK)
    assert set(state.settings) == {"a.x", "c.x"}
    assert state.untracked == ""
    run(state, "ROLLBACK", before=BLOCK, after=IDLE)
    assert values(state) == {"a.x": "SET a.x TO 1"}


def test_prepare_transaction_keeps_the_settings() -> None:
    state = SessionState()
    run(state, "BEGIN; SET a.x TO 1; PREPARE TRANSACTION 'x'")
    assert values(state) == {"a.x": "SET a.x TO 1"} and state.base is None


def test_set_local_and_from_current() -> None:
    state = SessionState()
    run(state, "SET LOCAL a.x TO 1")  # outside a block: a warning, no effect
    assert state.settings is NO_SETTINGS and state.local is NO_SETTINGS
    run(state, "BEGIN; SET LOCAL a.x TO 1", after=BLOCK)
    assert state.settings is NO_SETTINGS and state.local == {"a.x": "SET a.x TO 1"}
    run(state, "SET a.x FROM CURRENT; SET work_mem FROM CURRENT", before=BLOCK)
    assert values(state) == {"a.x": "SET a.x TO 1"}  # work_mem has no SET LOCAL value to keep
    run(state, "COMMIT", before=BLOCK, after=IDLE)
    assert values(state) == {"a.x": "SET a.x TO 1"} and state.local is NO_SETTINGS


def test_set_local_alone_is_gone_at_commit() -> None:
    state = SessionState()
    run(state, "BEGIN; SET LOCAL a.x TO 1; SELECT set_config('b.x', 'y', true); COMMIT")
    assert state.settings is NO_SETTINGS and state.local is NO_SETTINGS


def test_a_set_after_set_local_wins() -> None:
    state = SessionState()
    run(state, "BEGIN; SET LOCAL a.x TO 1; SET a.x TO 2; SET a.x FROM CURRENT; COMMIT")
    assert values(state) == {"a.x": "SET a.x TO 2"}
    run(state, "BEGIN; SET LOCAL a.x TO 3; RESET a.x; SET a.x FROM CURRENT; COMMIT")
    assert state.settings is NO_SETTINGS


def test_set_config_local_then_from_current() -> None:
    state = SessionState()
    run(state, "BEGIN; SELECT set_config('a.x', 'y', true); SET a.x FROM CURRENT; COMMIT")
    assert values(state) == {"a.x": "SELECT set_config('a.x', 'y', false)"}


def test_local_values_go_back_with_a_savepoint() -> None:
    state = SessionState()
    run(
        state,
        "BEGIN; SAVEPOINT s; SET LOCAL a.x TO 1; ROLLBACK TO s; SET a.x FROM CURRENT",
        after=BLOCK,
    )
    assert state.settings is NO_SETTINGS and state.local is NO_SETTINGS


# --- failed batches ------------------------------------------------------------------------------


def test_a_failed_single_statement_changes_nothing() -> None:
    state = SessionState()
    for text in (
        "SET a.x TO 1",
        "SELECT pg_advisory_lock(1)",
        "LISTEN ch",
        "SET ROLE r",
        "CREATE TEMP TABLE t (a int)",
        "SELECT pg_advisory_unlock_all()",
    ):
        run(state, text, failed=True)
        run(state, text, before=BLOCK, after=FAILED, failed=True)
    assert state.settings is NO_SETTINGS and state.locks == {}
    assert not state.pinned and state.base is None


def test_a_failed_batch_keeps_its_locks_but_not_its_settings() -> None:
    # which statements ran before the error is unknown: a lock may be held (locks outlive
    # their transaction), an unlock may not have happened; the rest rolls back
    state = SessionState()
    run(state, "SELECT pg_advisory_lock(2)")
    run(
        state,
        "SELECT pg_advisory_lock(1); SET a.x TO 1; SELECT pg_advisory_unlock(2);"
        " SELECT pg_advisory_lock(id) FROM t; LISTEN ch; SELECT 1/0",
        failed=True,
    )
    assert state.locks == {"1": 1, "2": 1} and state.locks_uncounted
    assert state.settings is NO_SETTINGS and state.channels == frozenset()
    assert state.reasons() == [ADVISORY_LOCK]


def test_a_failed_batch_of_parses_counts_its_statements() -> None:
    # the extended protocol: one statement per Parse, the batch up to a Sync
    state = SessionState()
    state.apply(
        [effects_of("SELECT pg_advisory_lock(1)"), effects_of("SET a.x TO 1")], IDLE, IDLE, True
    )
    assert state.locks == {"1": 1} and state.settings is NO_SETTINGS


def test_a_failed_batch_in_a_block_changes_no_setting() -> None:
    state = SessionState()
    run(state, "BEGIN; SET a.x TO 1", after=BLOCK)
    kept = state.settings
    run(state, "SET b.x TO 1; SELECT 1/0", before=BLOCK, after=FAILED, failed=True)
    assert state.settings is kept


@pytest.mark.parametrize(
    ("text", "after"),
    [
        ("BEGIN; SET a.x TO 1; SELECT 1/0", FAILED),
        ("SET a.x TO 1; COMMIT", IDLE),  # COMMIT failed (a deferred constraint), or SET did
        ("SAVEPOINT s; SELECT 1/0", FAILED),
        ("ROLLBACK TO nowhere", FAILED),
    ],
)
def test_a_failed_batch_that_controls_its_transaction_is_untracked(text: str, after: bytes) -> None:
    state = SessionState()
    run(state, "BEGIN; SAVEPOINT s; SET b.x TO 1", after=BLOCK)
    run(state, text, before=BLOCK, after=after, failed=True)
    assert state.untracked
    assert state.reasons() == [UNTRACKED_PIN] and state.pinned
    assert state.base is None and state.savepoints == []


# --- the transaction status around a batch -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "before", "after"),
    [
        ("SET a.x TO 1", BLOCK, IDLE),  # its block ended where no statement of ours said so
        ("SET a.x TO 1", IDLE, BLOCK),  # a block began unseen
        ("BEGIN; SET a.x TO 1", IDLE, IDLE),
        ("SET a.x TO 1; COMMIT", BLOCK, BLOCK),
    ],
)
def test_a_status_the_effects_do_not_explain_is_untracked(
    text: str, before: bytes, after: bytes
) -> None:
    state = SessionState()
    run(state, text, before=before, after=after)
    assert state.untracked
    assert UNTRACKED_PIN in state.reasons()
    assert state.base is None and state.savepoints == []


# --- pins ----------------------------------------------------------------------------------------


def test_discard_all_clears_every_pin_but_load_and_seed() -> None:
    state = SessionState()
    run(
        state,
        "SET a.x TO 1; SELECT pg_advisory_lock(1); SELECT pg_advisory_lock(id) FROM t;"
        " CREATE TEMP TABLE t (a int); DECLARE c CURSOR WITH HOLD FOR SELECT 1; LISTEN ch;"
        " SET ROLE r; SET SESSION AUTHORIZATION u; LOAD 'auto_explain'; SET SEED TO 0.5;"
        " SELECT set_config('b.x', x, false) FROM t",
    )
    assert state.reasons() == [
        ADVISORY_LOCK,
        HOLD_CURSOR,
        LISTEN_PIN,
        LOAD_PIN,
        ROLE_PIN,
        SEED_PIN,
        TEMP_OBJECT,
        UNTRACKED_PIN,
    ]
    run(state, "DISCARD ALL")
    assert state.reasons() == [LOAD_PIN, SEED_PIN]
    assert state.settings is NO_SETTINGS and state.local is NO_SETTINGS
    assert state.locks == {} and not state.locks_uncounted and state.untracked == ""
    assert state.cursors == frozenset() and state.channels == frozenset()
    assert state.roles == frozenset() and not state.temp


def test_reset_all_keeps_the_roles() -> None:
    state = SessionState()
    run(state, "SET ROLE r; SET SESSION AUTHORIZATION u; SET a.x TO 1; SET b.x TO 1")
    run(state, "RESET ALL")
    assert state.settings is NO_SETTINGS
    assert state.roles == {"role", "session_authorization"}
    assert state.reasons() == [ROLE_PIN]


def test_reset_all_in_a_rolled_back_block() -> None:
    state = SessionState()
    run(state, A1)
    kept = state.settings
    run(state, "BEGIN; RESET ALL; ROLLBACK")
    assert state.settings is kept


def test_role_pins_until_reset() -> None:
    state = SessionState()
    run(state, "SET ROLE r")
    assert state.reasons() == [ROLE_PIN]
    run(state, "SET ROLE NONE")
    assert not state.pinned
    run(state, "SELECT set_config('role', 'r', false)")
    assert state.pinned
    run(state, "RESET ROLE")
    assert not state.pinned


def test_resetting_the_session_authorization_resets_the_role() -> None:
    state = SessionState()
    run(state, "SET SESSION AUTHORIZATION u; SET ROLE r")
    run(state, "SET ROLE NONE")
    assert state.roles == {"session_authorization"}
    run(state, "SET ROLE r; RESET SESSION AUTHORIZATION")
    assert state.roles == frozenset() and not state.pinned
    run(state, "SET SESSION AUTHORIZATION u; SET SESSION AUTHORIZATION DEFAULT")
    assert not state.pinned


def test_a_role_set_in_a_rolled_back_block_does_not_pin() -> None:
    state = SessionState()
    run(state, "BEGIN; SET ROLE r; ROLLBACK")
    assert not state.pinned
    run(state, "BEGIN; SET ROLE r; SAVEPOINT s; RESET ROLE; ROLLBACK TO s; COMMIT")
    assert state.reasons() == [ROLE_PIN]


def test_advisory_locks_are_counted_by_key() -> None:
    state = SessionState()
    run(state, "SELECT pg_advisory_lock(1), pg_advisory_lock(1), pg_advisory_lock_shared(1)")
    assert state.locks == {"1": 2, "shared 1": 1}
    run(state, "SELECT pg_advisory_unlock(1)")
    assert state.locks == {"1": 1, "shared 1": 1}
    run(state, "SELECT pg_advisory_unlock(1); SELECT pg_advisory_unlock(1)")  # one too many
    assert state.locks == {"shared 1": 1}
    run(state, "SELECT pg_advisory_unlock(2)")  # never taken
    assert state.locks == {"shared 1": 1} and state.pinned
    run(state, "SELECT pg_advisory_unlock_shared(1)")
    assert state.locks == {} and not state.pinned


def test_uncounted_locks_pin_until_all_are_unlocked() -> None:
    state = SessionState()
    run(state, "SELECT pg_advisory_lock(id) FROM t; SELECT pg_advisory_lock(1, 2)")
    run(state, "SELECT pg_advisory_unlock(1, 2)")
    assert state.locks == {} and state.reasons() == [ADVISORY_LOCK]
    run(state, "SELECT pg_advisory_unlock_all()")
    assert not state.locks_uncounted and not state.pinned


def test_advisory_locks_outlive_a_rolled_back_block() -> None:
    state = SessionState()
    run(state, "BEGIN; SELECT pg_advisory_lock(1); SET a.x TO 1; ROLLBACK")
    assert state.locks == {"1": 1} and state.settings is NO_SETTINGS
    run(state, "BEGIN; SAVEPOINT s; SELECT pg_advisory_unlock(1); ROLLBACK TO s; COMMIT")
    assert state.locks == {}


def test_listen_and_unlisten() -> None:
    state = SessionState()
    run(state, "LISTEN a; LISTEN b; LISTEN a")
    assert state.channels == {"a", "b"} and state.reasons() == [LISTEN_PIN]
    run(state, "UNLISTEN a; UNLISTEN c")
    assert state.channels == {"b"}
    run(state, "LISTEN c; UNLISTEN *")
    assert state.channels == frozenset() and not state.pinned
    run(state, "BEGIN; LISTEN a; ROLLBACK")  # LISTEN takes effect at commit
    assert not state.pinned


def test_temporary_objects_pin_until_discarded() -> None:
    state = SessionState()
    run(state, "BEGIN; CREATE TEMP TABLE t (a int); ROLLBACK")
    assert not state.pinned
    run(state, "CREATE TEMP TABLE t (a int) ON COMMIT DROP")
    assert not state.pinned
    run(state, "SELECT 1 INTO TEMP t")
    assert state.reasons() == [TEMP_OBJECT]
    run(state, "DISCARD TEMP")
    assert not state.pinned


def test_hold_cursors_pin_until_closed() -> None:
    state = SessionState()
    run(state, "DECLARE c CURSOR FOR SELECT 1", before=BLOCK)  # closed with its transaction
    assert not state.pinned
    run(state, "DECLARE c CURSOR WITH HOLD FOR SELECT 1; DECLARE d CURSOR WITH HOLD FOR SELECT 2")
    assert state.cursors == {"c", "d"} and state.reasons() == [HOLD_CURSOR]
    run(state, "CLOSE c")
    assert state.cursors == {"d"}
    run(state, "BEGIN; DECLARE e CURSOR WITH HOLD FOR SELECT 1; ROLLBACK")
    assert state.cursors == {"d"}
    run(state, "CLOSE ALL")
    assert state.cursors == frozenset() and not state.pinned


def test_load_seed_and_untracked_pin() -> None:
    state = SessionState()
    run(state, "LOAD 'auto_explain'")
    run(state, "SET SEED TO 0.5")
    run(state, "PREPARE p AS SELECT pg_advisory_lock(1)")
    assert state.reasons() == [LOAD_PIN, SEED_PIN, UNTRACKED_PIN]
    assert state.untracked == "a prepared statement that changes session state"
    run(state, "RESET ALL")
    assert state.reasons() == [LOAD_PIN, SEED_PIN, UNTRACKED_PIN]


@pytest.mark.parametrize(
    "texts",
    [
        ("SELECT generate_series(1, 3), pg_advisory_lock(1)", "SELECT pg_advisory_unlock(1)"),
        ("SELECT pg_advisory_lock(1)", "SELECT pg_advisory_unlock(1) LIMIT 0"),
    ],
)
def test_pinned_while_a_lock_is_held(texts: tuple[str, str]) -> None:
    state = SessionState()
    for text in texts:
        run(state, text)
    assert state.pinned


# --- the settings dict ---------------------------------------------------------------------------


def test_the_settings_dict_is_replaced_never_changed() -> None:
    state = SessionState()
    seen: list[tuple[dict[str, str], dict[str, str]]] = []

    def step(*texts: str, before: bytes = IDLE, after: bytes | None = None) -> None:
        seen.append((state.settings, dict(state.settings)))
        run(state, *texts, before=before, after=after)

    step(A1)
    step(B1)
    step("SET a.x TO 2; RESET b.x")
    step("BEGIN; SET c.x TO 1", after=BLOCK)
    step("SAVEPOINT s; SET a.x TO 3; ROLLBACK TO s", before=BLOCK)
    step(
        "SET c.x FROM CURRENT; SET LOCAL d.x TO 1; SET d.x FROM CURRENT; COMMIT",
        before=BLOCK,
        after=IDLE,
    )
    step("RESET ALL")
    step("DISCARD ALL")
    for settings_dict, copy in seen:
        assert settings_dict == copy
    assert NO_SETTINGS == {}


def test_a_session_that_changed_no_setting_shares_no_settings() -> None:
    state = SessionState()
    run(state, "LISTEN ch; SELECT pg_advisory_lock(1); RESET a.x")
    assert state.settings is NO_SETTINGS
    run(state, "SET a.x TO 1; RESET a.x")
    assert state.settings is NO_SETTINGS
    run(state, "BEGIN; SET a.x TO 1; ROLLBACK")
    assert state.settings is NO_SETTINGS


_BATCHES = [
    "SET a.x TO 1",
    "SET a.x TO 2",
    "SET b.x TO 1",
    "RESET a.x",
    "RESET ALL",
    "DISCARD ALL",
    "SET LOCAL a.x TO 3",
    "SET a.x FROM CURRENT",
    "SELECT set_config('c.x', 'y', false)",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "ROLLBACK TO s",
    "RELEASE s",
    "COMMIT AND CHAIN",
    "SET ROLE r",
    "LISTEN ch",
]


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(_BATCHES), min_size=1, max_size=4), st.booleans()),
        max_size=12,
    )
)
def test_no_sequence_of_batches_changes_a_settings_dict_in_place(
    batches: list[tuple[list[str], bool]],
) -> None:
    state = SessionState(frozenset({"application_name"}))
    status = IDLE
    seen = []
    for texts, failed in batches:
        seen.append((state.settings, dict(state.settings)))
        seen.append((state.local, dict(state.local)))
        # the status after the batch as PostgreSQL would report it, near enough: whether the
        # last transaction control opened a block (tests only the dicts, not the statuses)
        after = status
        for text in texts:
            if text in ("BEGIN", "COMMIT AND CHAIN"):
                after = BLOCK
            elif text in ("COMMIT", "ROLLBACK"):
                after = IDLE
        if failed and status != IDLE:
            after = FAILED
        run(state, ";".join(texts), before=status, after=after, failed=failed)
        status = after
    for values_dict, copy in seen:
        assert values_dict == copy
    assert NO_SETTINGS == {}


def test_ignored_names_are_not_stored() -> None:
    state = SessionState(frozenset({"application_name", "client_encoding"}))
    run(state, "SET application_name TO 'x'; SET client_encoding TO 'UTF8'")
    run(state, "SELECT set_config('application_name', 'y', false)")
    assert state.settings is NO_SETTINGS
    run(
        state, "BEGIN; SET LOCAL application_name TO 'z'; SET application_name FROM CURRENT; COMMIT"
    )
    assert state.settings is NO_SETTINGS and state.local is NO_SETTINGS
    run(state, "SET search_path TO a; RESET application_name")
    assert values(state) == {"search_path": "SET search_path TO a"}


# --- LISTEN and UNLISTEN answered by pgtarn (subscriptions) ------------------------------------


def subscriptions_of(text: str) -> Parsed:
    parsed = as_subscriptions(effects_of(text))
    assert parsed is not None
    return parsed


def listen(
    state: SessionState,
    text: str,
    before: bytes = IDLE,
    after: bytes | None = None,
    failed: bool = False,
) -> None:
    """A Query of LISTEN/UNLISTEN only, answered by pgtarn, applied as its batch."""
    state.apply([subscriptions_of(text)], before, before if after is None else after, failed)


def test_subscriptions_outside_a_block_count_at_once_and_pin_nothing() -> None:
    state = SessionState()
    listen(state, "LISTEN a; LISTEN b")
    assert state.subscriptions == {"a", "b"} and state.committed_subscriptions() == {"a", "b"}
    assert state.channels == frozenset() and not state.pinned
    listen(state, "UNLISTEN a; UNLISTEN c")
    assert state.subscriptions == {"b"}
    listen(state, "LISTEN c; UNLISTEN *")
    assert state.subscriptions == frozenset()


def test_a_subscription_in_a_block_counts_from_commit() -> None:
    state = SessionState()
    listen(state, "LISTEN a")
    run(state, "BEGIN", after=BLOCK)
    listen(state, "LISTEN b; UNLISTEN a", before=BLOCK)
    assert state.subscriptions == {"b"}
    assert state.committed_subscriptions() == {"a"}  # what the listener serves meanwhile
    run(state, "COMMIT", before=BLOCK, after=IDLE)
    assert state.committed_subscriptions() == state.subscriptions == {"b"}
    assert state.base is None


def test_a_subscription_in_a_rolled_back_block_is_forgotten() -> None:
    state = SessionState()
    listen(state, "LISTEN a")
    run(state, "BEGIN", after=BLOCK)
    listen(state, "UNLISTEN *; LISTEN b", before=BLOCK)
    assert state.committed_subscriptions() == {"a"}
    run(state, "ROLLBACK", before=BLOCK, after=IDLE)
    assert state.subscriptions == {"a"} and state.committed_subscriptions() == {"a"}


def test_rollback_to_a_savepoint_undoes_the_subscriptions_after_it() -> None:
    state = SessionState()
    run(state, "BEGIN", after=BLOCK)
    listen(state, "LISTEN a", before=BLOCK)
    run(state, "SAVEPOINT s", before=BLOCK)
    listen(state, "LISTEN b; UNLISTEN a", before=BLOCK)
    assert state.subscriptions == {"b"}
    run(state, "ROLLBACK TO s", before=BLOCK)
    assert state.subscriptions == {"a"} and state.committed_subscriptions() == frozenset()
    run(state, "COMMIT", before=BLOCK, after=IDLE)
    assert state.subscriptions == {"a"} == state.committed_subscriptions()


def test_a_subscription_in_a_failed_block_is_rolled_back_at_commit() -> None:
    state = SessionState()
    run(state, "BEGIN", after=BLOCK)
    listen(state, "LISTEN a", before=BLOCK)
    run(state, "SELECT 1/0", before=BLOCK, after=FAILED, failed=True)
    listen(state, "LISTEN b", before=FAILED, failed=True)  # 25P02: changes nothing
    assert state.subscriptions == {"a"} and state.committed_subscriptions() == frozenset()
    run(state, "COMMIT", before=FAILED, after=IDLE)
    assert state.subscriptions == frozenset()


def test_a_failed_subscription_changes_nothing() -> None:
    state = SessionState()
    listen(state, "LISTEN a", failed=True)
    assert state.subscriptions == frozenset()


def test_discard_all_ends_the_subscriptions() -> None:
    state = SessionState()
    listen(state, "LISTEN a; LISTEN b")
    run(state, "DISCARD ALL")
    assert state.subscriptions == frozenset() == state.committed_subscriptions()


def test_a_listen_on_the_server_takes_the_channel_from_the_listener() -> None:
    """The client's server now delivers that channel: the listener must not deliver it too."""
    state = SessionState()
    listen(state, "LISTEN a; LISTEN b")
    run(state, "LISTEN a; SELECT 1")  # mixed: runs on the server, and pins
    assert state.channels == {"a"} and state.reasons() == [LISTEN_PIN]
    assert state.subscriptions == {"b"}


def test_an_unlisten_on_the_server_ends_the_listeners_channels_too() -> None:
    state = SessionState()
    listen(state, "LISTEN a; LISTEN b; LISTEN c")
    run(state, "UNLISTEN b; SELECT 1")
    assert state.subscriptions == {"a", "c"} and state.channels == frozenset()
    run(state, "LISTEN d; SELECT 1")
    run(state, "UNLISTEN *; SELECT 1")
    assert state.subscriptions == frozenset() and state.channels == frozenset()
    assert not state.pinned


def test_a_server_listen_in_a_rolled_back_block_gives_the_channel_back() -> None:
    state = SessionState()
    listen(state, "LISTEN a")
    run(state, "BEGIN", after=BLOCK)
    run(state, "LISTEN a; SELECT 1", before=BLOCK)
    assert state.subscriptions == frozenset() and state.committed_subscriptions() == {"a"}
    run(state, "ROLLBACK", before=BLOCK, after=IDLE)
    assert state.subscriptions == {"a"} and state.channels == frozenset()


def test_subscriptions_apply_at_their_ready_for_query() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed("BEGIN"), 0, IDLE)
    tracker.add(subscriptions_of("LISTEN a"), 1, IDLE)
    tracker.add(parsed("COMMIT"), 2, IDLE)
    tracker.ready(BLOCK)
    assert tracker.state.subscriptions == frozenset()
    tracker.ready(BLOCK)
    assert tracker.state.subscriptions == {"a"}
    assert tracker.state.committed_subscriptions() == frozenset()
    tracker.ready(IDLE)
    assert tracker.state.committed_subscriptions() == {"a"}


# --- SessionTracker ------------------------------------------------------------------------------


def parsed(text: str) -> Parsed:
    return effects_of(text)


#: pg_advisory_lock's value (void) in text format.
VOID = ""


def returned(tracker: SessionTracker, *values: str | None, binary: bool = False) -> None:
    """One statement's result relayed: its one row of values, then its CommandComplete."""
    body = data_row(values)[5:]
    if binary:  # booleans as one byte
        body = data_row([None] * len(values))[5:7] + b"".join(
            b"\xff\xff\xff\xff"
            if value is None
            else len(code := BINARY[value]).to_bytes(4, "big") + code
            for value in values
        )
    tracker.result(0x44, body)
    tracker.result(0x43, b"SELECT 1\x00")


BINARY = {"t": b"\x01", "f": b"\x00", VOID: b""}


def test_a_batch_applies_at_its_ready_for_query() -> None:
    tracker = SessionTracker(SessionState())
    assert not tracker.parse_all
    tracker.add(parsed(A1), 0, IDLE)
    assert tracker.parse_all  # a batch is pending: its transaction control matters
    assert tracker.state.settings is NO_SETTINGS
    tracker.ready(IDLE)
    assert values(tracker.state) == {"a.x": A1}
    assert tracker.pending == [] and not tracker.parse_all


def test_parses_of_one_batch_apply_together() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed("SELECT pg_advisory_lock(1)"), 0, IDLE)
    tracker.add(parsed(A1), 0, IDLE, 1)
    assert len(tracker.pending) == 1
    returned(tracker, VOID)
    tracker.error()
    tracker.ready(IDLE)
    # one failed batch of two statements: the lock's row came, the setting rolled back
    assert tracker.state.locks == {"1": 1} and tracker.state.settings is NO_SETTINGS


def test_pipelined_batches_apply_each_at_their_own_ready_for_query() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed(A1), 0, IDLE)
    tracker.add(parsed(B1), 1, IDLE)
    tracker.add(parsed("SET c.x TO 1"), 2, IDLE)
    assert len(tracker.pending) == 3
    tracker.ready(IDLE)
    assert set(tracker.state.settings) == {"a.x"}
    tracker.ready(IDLE)
    assert set(tracker.state.settings) == {"a.x", "b.x"}
    tracker.ready(IDLE)
    assert set(tracker.state.settings) == {"a.x", "b.x", "c.x"}
    assert tracker.pending == []


def test_a_batch_behind_one_not_tracked() -> None:
    # replies_ahead 2: two batches that changed nothing go first
    tracker = SessionTracker(SessionState())
    tracker.add(parsed(A1), 2, IDLE)
    tracker.ready(IDLE)
    tracker.ready(IDLE)
    assert tracker.state.settings is NO_SETTINGS
    tracker.ready(IDLE)
    assert values(tracker.state) == {"a.x": A1}


def test_an_error_counts_only_for_the_batch_under_way() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed(A1), 0, IDLE)
    tracker.add(parsed(B1), 1, IDLE)
    tracker.error()  # in the first batch
    assert tracker.failed
    tracker.ready(IDLE)
    assert tracker.state.settings is NO_SETTINGS
    tracker.ready(IDLE)  # the second did not fail
    assert values(tracker.state) == {"b.x": B1}


def test_an_error_in_an_untracked_batch_ahead_is_not_ours() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed(A1), 1, IDLE)
    tracker.error()  # the batch ahead, which changes nothing, fails
    assert not tracker.failed
    tracker.ready(IDLE)
    tracker.ready(IDLE)
    assert values(tracker.state) == {"a.x": A1}


def test_the_status_before_a_batch_is_the_ready_for_query_before_it() -> None:
    # BEGIN (no first look lets it through) goes ahead of a SET, then a ROLLBACK: the SET
    # was in a block, and is undone
    tracker = SessionTracker(SessionState())
    tracker.add(parsed(A1), 1, IDLE)
    tracker.ready(BLOCK)  # BEGIN's
    tracker.ready(BLOCK)
    assert values(tracker.state) == {"a.x": A1} and tracker.state.base is not None
    assert tracker.parse_all  # a transaction holds changes: its end must be seen
    assert tracker.state.untracked == ""
    tracker.add(parsed("ROLLBACK"), 0, BLOCK)
    tracker.ready(IDLE)
    assert tracker.state.settings is NO_SETTINGS and not tracker.parse_all


def test_the_status_given_is_used_when_nothing_is_ahead() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed(A1), 0, IDLE)
    tracker.ready(IDLE)
    # a BEGIN ran since, untracked: the status now says a block is open
    tracker.add(parsed(B1), 0, BLOCK)
    tracker.ready(BLOCK)
    assert tracker.state.untracked == ""
    tracker.add(parsed("ROLLBACK"), 0, BLOCK)
    tracker.ready(IDLE)
    assert values(tracker.state) == {"a.x": A1}


def test_a_failed_flag_does_not_outlive_its_batch() -> None:
    tracker = SessionTracker(SessionState())
    tracker.add(parsed("SELECT pg_advisory_lock(1); SELECT 1/0"), 0, IDLE)
    returned(tracker, VOID)
    tracker.error()
    tracker.ready(IDLE)
    assert tracker.state.locks == {"1": 1}
    tracker.add(parsed("SELECT pg_advisory_unlock(1)"), 0, IDLE)
    returned(tracker, "t")
    tracker.ready(IDLE)
    assert tracker.state.locks == {}


# --- temporary relations end with their DROP ------------------------------------------------------


def test_the_temp_pin_ends_when_every_temporary_relation_is_dropped() -> None:
    state = SessionState()
    run(state, "CREATE TEMP TABLE t1 (a int)", "CREATE TEMP VIEW v AS SELECT 1")
    run(state, "DROP TABLE t1")
    assert state.reasons() == [TEMP_OBJECT]
    run(state, "DROP TABLE public.v")  # another schema's: not the client's
    assert state.reasons() == [TEMP_OBJECT]
    run(state, "DROP VIEW IF EXISTS v CASCADE")
    assert state.reasons() == [] and state.temp == frozenset()


def test_a_drop_that_failed_or_rolled_back_keeps_the_pin() -> None:
    state = SessionState()
    run(state, "CREATE TEMP TABLE t (a int)")
    run(state, "DROP TABLE t, nothing", failed=True)
    run(state, "BEGIN; DROP TABLE t", after=BLOCK)
    run(state, "ROLLBACK", before=BLOCK, after=IDLE)
    assert state.reasons() == [TEMP_OBJECT]
    run(state, "BEGIN; DROP TABLE t; COMMIT")
    assert state.reasons() == []


def test_an_unqualified_drop_counts_only_while_pg_temp_is_searched_first() -> None:
    state = SessionState()
    run(state, "SET search_path = public, pg_temp", "CREATE TEMP TABLE t (a int)")
    run(state, "DROP TABLE t")  # may have been public.t
    assert state.reasons() == [TEMP_OBJECT]
    run(state, "DROP TABLE pg_temp.t")
    assert state.reasons() == []
    followed = SessionState(frozenset({"search_path"}))  # a ParameterStatus: not seen here
    run(followed, "CREATE TEMP TABLE t (a int)", "DROP TABLE t")
    assert followed.reasons() == [TEMP_OBJECT]


def test_a_temporary_object_that_is_not_a_relation_ends_only_with_discard() -> None:
    state = SessionState()
    run(state, "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    run(state, "DROP FUNCTION pg_temp.f()")
    assert state.reasons() == [TEMP_OBJECT]
    run(state, "DISCARD TEMP")
    assert state.reasons() == []
