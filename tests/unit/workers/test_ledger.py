"""The supervisor's books of workers = N: server slots, the queue across workers, clients."""

from __future__ import annotations

from pgtarn.workers.ledger import (
    ClientLimits,
    Ledger,
    Reclaim,
    SlotRequest,
    on_message,
)


def ask(
    worker: int,
    pool_limit: int = 4,
    max_db: int = 0,
    max_user: int = 0,
    database: str = "app",
    user: str = "app",
) -> SlotRequest:
    return SlotRequest(worker, database, user, pool_limit, max_db, max_user)


def test_slots_are_granted_up_to_the_pool_size_over_all_workers() -> None:
    ledger = Ledger()
    assert [ledger.ask(ask(w % 2))[0] for w in range(4)] == [True] * 4
    granted, _ = ledger.ask(ask(0))
    assert not granted
    assert ledger.pool_total[("app", "app")] == 4
    assert (ledger.held(0, "app", "app"), ledger.held(1, "app", "app")) == (2, 2)


def test_a_released_slot_goes_to_the_oldest_waiting_request_of_any_worker() -> None:
    ledger = Ledger()
    for _ in range(2):
        ledger.ask(ask(0, pool_limit=2))
    ledger.ask(ask(1, pool_limit=2))  # first in the queue
    ledger.ask(ask(0, pool_limit=2))
    assert ledger.release(0, "app", "app") == [ask(1, pool_limit=2)]
    assert ledger.release(0, "app", "app") == [ask(0, pool_limit=2)]
    assert ledger.release(0, "app", "app") == []
    assert not ledger.queue


def test_max_db_and_max_user_connections_span_pools_and_workers() -> None:
    ledger = Ledger()
    assert ledger.ask(ask(0, max_db=3, user="a"))[0]
    assert ledger.ask(ask(1, max_db=3, user="b"))[0]
    assert ledger.ask(ask(1, max_db=3, user="c"))[0]
    assert not ledger.ask(ask(0, max_db=3, user="d"))[0]
    assert ledger.ask(ask(0, max_db=3, user="d", database="other"))[0]
    assert ledger.ask(ask(0, max_user=1, user="x", database="d1"))[0]
    assert not ledger.ask(ask(1, max_user=1, user="x", database="d2"))[0]
    # a freed slot of another pool of the same database lets the queued request in
    assert ledger.release(1, "app", "b") == [ask(0, max_db=3, user="d")]


def test_a_request_that_waits_reclaims_from_a_worker_over_its_fair_share() -> None:
    ledger = Ledger()
    for _ in range(4):
        ledger.ask(ask(0))
    granted, reclaims = ledger.ask(ask(1))
    assert not granted and reclaims == [Reclaim(0, "app", "app")]
    # one give-back is asked per waiting request, down to the fair share (4 / 2 workers)
    assert ledger.ask(ask(1))[1] == [Reclaim(0, "app", "app")]
    # at its fair share: only an idle server of it, if it has one
    assert ledger.ask(ask(1))[1] == [Reclaim(0, "app", "app", idle_only=True)]
    assert ledger.release(0, "app", "app") == [ask(1)]
    assert ledger.release(0, "app", "app") == [ask(1)]
    assert ledger.reclaiming[(0, "app", "app")] == 0


def test_at_their_fair_share_workers_are_asked_for_an_idle_server_only() -> None:
    ledger = Ledger()
    for w in (0, 0, 1, 1):
        ledger.ask(ask(w))
    assert ledger.ask(ask(1)) == (False, [Reclaim(0, "app", "app", idle_only=True)])
    assert ledger.reclaiming[(0, "app", "app")] == 0


def test_at_a_database_limit_the_asker_gives_back_an_idle_server_of_another_pool() -> None:
    ledger = Ledger()
    ledger.ask(ask(0, max_db=2, user="a"))
    ledger.ask(ask(1, max_db=2, user="a"))
    assert ledger.ask(ask(0, max_db=2, user="b")) == (
        False,
        [Reclaim(0, "app", "a", idle_only=True), Reclaim(1, "app", "a", idle_only=True)],
    )


def test_reclaims_at_the_database_limit_pick_the_biggest_pool_of_the_worker() -> None:
    ledger = Ledger()
    ledger.ask(ask(0, max_db=3, user="a"))
    ledger.ask(ask(0, max_db=3, user="b"))
    ledger.ask(ask(0, max_db=3, user="b"))
    granted, reclaims = ledger.ask(ask(1, max_db=3, user="c"))
    assert not granted and reclaims == [Reclaim(0, "app", "b")]


def test_a_gone_worker_frees_its_slots_and_drops_its_requests() -> None:
    ledger = Ledger()
    for _ in range(4):
        ledger.ask(ask(0))
    ledger.ask(ask(0))
    ledger.ask(ask(1))
    ledger.ask(ask(1))
    assert ledger.worker_gone(0) == [ask(1), ask(1)]
    assert ledger.pool_total[("app", "app")] == 2 and not ledger.queue
    assert ledger.held(0, "app", "app") == 0


def test_max_client_conn_counts_the_other_workers_admitted_clients() -> None:
    ledger = Ledger()
    for n in range(1, 6):
        assert ledger.admit(0, "app", "app", False, ClientLimits(10, local_clients=n)) is None
    for n in range(1, 6):
        assert ledger.admit(1, "app", "app", False, ClientLimits(10, local_clients=n)) is None
    assert (
        ledger.admit(1, "app", "app", False, ClientLimits(10, local_clients=6)) == "max_client_conn"
    )
    assert (
        ledger.admit(0, "app", "app", False, ClientLimits(10, local_clients=6)) == "max_client_conn"
    )
    ledger.client_left(0, "app", "app", False)
    assert ledger.admit(1, "app", "app", False, ClientLimits(10, local_clients=6)) is None
    ledger.worker_gone(1)
    assert ledger.admit(0, "app", "app", False, ClientLimits(10, local_clients=5)) is None


def test_client_limits_per_database_and_user() -> None:
    ledger = Ledger()
    assert ledger.admit(0, "app", "u", False, ClientLimits(0, max_db=2, local_db=1)) is None
    assert ledger.admit(1, "app", "v", False, ClientLimits(0, max_db=2, local_db=1)) is None
    assert (
        ledger.admit(1, "app", "w", False, ClientLimits(0, max_db=2, local_db=2))
        == "max_db_client_connections"
    )
    assert (
        ledger.admit(1, "other", "u", False, ClientLimits(0, max_user=1, local_user=1))
        == "max_user_client_connections"
    )
    # admin console clients do not count for their user
    assert ledger.admit(0, "pgbouncer", "v", True, ClientLimits(0)) is None
    assert ledger.admit(0, "x", "v", False, ClientLimits(0, max_user=2, local_user=1)) is None


def test_messages_become_grants_reclaims_and_replies() -> None:
    ledger = Ledger()
    slot = {"kind": "limits_ask", "database": "app", "user": "app", "pool_limit": 1}
    assert on_message(ledger, 0, slot) == (
        None,
        [(0, {"kind": "limits_grant", "database": "app", "user": "app"})],
    )
    assert on_message(ledger, 1, slot) == (
        None,
        [(0, {"kind": "limits_reclaim", "database": "app", "user": "app", "idle_only": False})],
    )
    assert on_message(ledger, 0, {"kind": "limits_release", "database": "app", "user": "app"}) == (
        None,
        [(1, {"kind": "limits_grant", "database": "app", "user": "app"})],
    )
    admit = {
        "kind": "limits_admit",
        "database": "app",
        "user": "app",
        "admin": False,
        "limits": [1, 0, 0, 1, 0, 0],
    }
    assert on_message(ledger, 0, admit) == ({"refused": None}, [])
    assert on_message(ledger, 1, admit) == ({"refused": "max_client_conn"}, [])
    on_message(ledger, 0, {"kind": "limits_left", "database": "app", "user": "app"})
    assert on_message(ledger, 1, admit) == ({"refused": None}, [])
