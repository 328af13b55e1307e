"""The supervisor's books of workers = N: server slots, the queue across workers, clients."""

from __future__ import annotations

from pgtarn.workers.ledger import (
    Admission,
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


def login(
    worker: int, limits: ClientLimits, need: int = 1, lease: int = 0, ident: int = 0
) -> Admission:
    return Admission(worker, ident, "app", "app", False, limits, need, lease)


def test_max_client_conn_counts_every_workers_places_with_their_leases() -> None:
    ledger = Ledger()
    # worker 0's first login takes a place and a lease of 3 spare ones
    assert ledger.admit(login(0, ClientLimits(10), lease=3)) == ((None, 4), [])
    assert ledger.admit(login(1, ClientLimits(10), lease=3)) == ((None, 4), [])
    # the lease is cut to what the limit leaves
    assert ledger.admit(login(1, ClientLimits(10), lease=3)) == ((None, 2), [])
    assert ledger.places == {0: 4, 1: 6}
    # a login in a spare place of its worker's takes nothing more
    assert ledger.admit(login(0, ClientLimits(10), need=0)) == ((None, 0), [])


def test_a_client_is_refused_only_when_no_worker_has_a_spare_place() -> None:
    ledger = Ledger()
    ledger.admit(login(0, ClientLimits(4), lease=3))  # worker 0: 1 client, 3 spare places
    # worker 1 has none: the spare places of worker 0 are asked for, the login waits
    assert ledger.admit(login(1, ClientLimits(4), ident=7)) == (
        None,
        [(0, {"kind": "limits_spare"})],
    )
    assert ledger.admit(login(1, ClientLimits(4), ident=8)) == (None, [])  # (asked already)
    decided = ledger.spare_returned(0, 3, asked=True)
    assert [(a.ident, verdict) for a, verdict in decided] == [(7, (None, 1)), (8, (None, 1))]
    assert ledger.places == {0: 1, 1: 2}
    assert ledger.admit(login(0, ClientLimits(4))) == ((None, 1), [])  # the last place
    # every place held by a client: asked, nobody has a spare one, refused
    verdict, asks = ledger.admit(login(1, ClientLimits(4), ident=9))
    assert verdict is None and asks == [(0, {"kind": "limits_spare"})]
    [(admission, refused)] = ledger.spare_returned(0, 0, asked=True)
    assert admission.ident == 9 and refused == ("max_client_conn", 0)
    # places given back unasked (clients left) let the next one in at once
    ledger.spare_returned(1, 1, asked=False)
    assert ledger.admit(login(0, ClientLimits(4))) == ((None, 1), [])


def test_a_gone_worker_frees_its_places_and_its_answer_is_not_waited_for() -> None:
    ledger = Ledger()
    ledger.admit(login(0, ClientLimits(2), lease=1))
    assert ledger.admit(login(1, ClientLimits(2), ident=3))[0] is None
    [(admission, verdict)] = ledger.clients_worker_gone(0)
    assert (admission.ident, verdict) == (3, (None, 1))
    assert ledger.places == {1: 1}


def test_client_limits_per_database_and_user() -> None:
    ledger = Ledger()

    def verdict(worker: int, database: str, user: str, limits: ClientLimits) -> str | None:
        answer, _asks = ledger.admit(Admission(worker, 0, database, user, False, limits))
        assert answer is not None
        return answer[0]

    assert verdict(0, "app", "u", ClientLimits(0, max_db=2, local_db=1)) is None
    assert verdict(1, "app", "v", ClientLimits(0, max_db=2, local_db=1)) is None
    assert verdict(1, "app", "w", ClientLimits(0, max_db=2, local_db=2)) == (
        "max_db_client_connections"
    )
    assert verdict(1, "other", "u", ClientLimits(0, max_user=1, local_user=1)) == (
        "max_user_client_connections"
    )
    # admin console clients do not count for their user
    answer, _ = ledger.admit(
        Admission(0, 0, "pgbouncer", "v", True, ClientLimits(0, max_user=1, local_user=1))
    )
    assert answer == (None, 1)
    assert verdict(0, "x", "v", ClientLimits(0, max_user=2, local_user=1)) is None
    # clients no such limit applies to are not counted by name (nor told of when they leave)
    assert verdict(0, "free", "z", ClientLimits(0)) is None
    assert "free" not in ledger.db_clients[0]


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
        "id": 5,
        "database": "app",
        "user": "app",
        "admin": False,
        "limits": [1, 0, 0, 1, 0, 0],
        "need": 1,
        "lease": 32,
    }
    assert on_message(ledger, 0, admit) == ({"refused": None, "places": 1}, [])
    assert on_message(ledger, 1, admit) == (None, [(0, {"kind": "limits_spare"})])
    assert on_message(ledger, 0, {"kind": "limits_returned", "count": 0, "asked": True}) == (
        None,
        [(1, {"refused": "max_client_conn", "places": 0, "re": 5})],
    )
    assert on_message(ledger, 0, {"kind": "limits_returned", "count": 1}) == (None, [])
    assert on_message(ledger, 1, admit) == ({"refused": None, "places": 1}, [])
