"""Tests for pgtarn.pool.cancels: servers held while CancelRequests for them are in flight."""

from __future__ import annotations

from pgtarn.pool.cancels import cancel_ended, cancel_started, cancels_in_flight
from pgtarn.pool.pool import Pool

from .test_pool import FakeClient, FakeServer, make_pool, ready


def linked(pool_size: int = 1) -> tuple[Pool[FakeServer], FakeServer, FakeClient]:
    """A pool whose one server is lent to a client."""
    pool, _clock, launched = make_pool(pool_size=pool_size)
    owner = FakeClient("owner")
    assert pool.acquire(owner) is None
    ready(pool, launched[0])
    assert owner.server is launched[0]
    return pool, launched[0], owner


def test_a_server_released_with_a_cancel_in_flight_goes_to_no_one_until_it_ends() -> None:
    pool, server, _owner = linked()
    cancel_started(pool, server, request=True)
    assert (cancels_in_flight(pool), pool.cancel_requests) == (1, 1)
    other = FakeClient("other")
    assert pool.acquire(other) is None  # waits: the server is lent
    pool.release(server)
    assert other.server is None and server in pool.being_canceled
    assert len(pool.idle) == 0 and pool.server_count == 1 and not pool.has_room()
    assert pool.busy and server in pool.servers()
    cancel_ended(pool, server, request=True, answered=True)
    assert other.server is server and server in pool.active
    assert (cancels_in_flight(pool), pool.cancel_requests, len(pool.being_canceled)) == (0, 0, 0)


def test_a_held_server_goes_idle_once_its_last_cancel_ends() -> None:
    pool, server, _owner = linked()
    cancel_started(pool, server, request=True)
    cancel_started(pool, server, request=False)  # query_timeout's, say
    pool.release(server)
    cancel_ended(pool, server, request=False, answered=True)
    assert server in pool.being_canceled and cancels_in_flight(pool) == 1
    cancel_ended(pool, server, request=True, answered=True)
    assert list(pool.idle) == [server] and not pool.being_canceled and server.closed is None
    # the next release of the same server does not look back
    assert pool.acquire(FakeClient()) is server
    pool.release(server)
    assert list(pool.idle) == [server]


def test_a_cancel_that_ends_while_its_server_is_still_lent_changes_nothing() -> None:
    pool, server, _owner = linked()
    cancel_started(pool, server, request=True)
    cancel_ended(pool, server, request=True, answered=True)
    assert server in pool.active and not pool.cancels
    pool.release(server)
    assert list(pool.idle) == [server]


def test_a_held_server_whose_cancel_got_no_answer_is_closed() -> None:
    pool, server, _owner = linked()
    cancel_started(pool, server, request=True)
    pool.release(server)
    cancel_ended(pool, server, request=True, answered=False)
    assert server.closed is not None and "may still arrive" in server.closed
    assert pool.server_count == 0 and not pool.being_canceled


def test_a_lent_server_whose_cancel_got_no_answer_is_closed_when_released() -> None:
    pool, server, _owner = linked()
    cancel_started(pool, server, request=False)
    cancel_ended(pool, server, request=False, answered=False)
    assert server.closed is None and server in pool.active  # its client's query goes on
    pool.release(server)
    assert server.closed is not None and pool.server_count == 0


def test_a_held_server_that_closes_leaves_the_pool_and_its_cancel_ends_quietly() -> None:
    pool, server, _owner = linked()
    cancel_started(pool, server, request=True)
    pool.release(server)
    server.close("server connection lost")
    assert pool.server_count == 0 and not pool.being_canceled
    cancel_ended(pool, server, request=True, answered=True)
    assert not pool.cancels and pool.cancel_requests == 0 and len(pool.idle) == 0


def test_a_waiter_gets_a_new_server_while_one_is_held_if_the_pool_has_room() -> None:
    pool, server, _owner = linked(pool_size=2)
    cancel_started(pool, server, request=True)
    pool.release(server)
    other = FakeClient("other")
    assert pool.acquire(other) is None
    assert pool.server_count == 2  # the held one and a new one, no more than pool_size
    assert server not in pool.active
