"""Tests for pgtarn.pool.handoffs: servers released while clients wait, lent after the callback."""

from __future__ import annotations

from typing import Any

from pgtarn.pool.cancels import cancel_ended, cancel_started
from pgtarn.pool.handoffs import hand_off, lend_marked
from pgtarn.pool.lifetimes import reconnect
from pgtarn.pool.pool import Pool
from pgtarn.pool.state import HandOffs

from .test_pool import FakeClient, FakeServer, make_pool, ready


class Asked(HandOffs):
    """The runtime's side: the hand-offs asked for, in order."""

    def __init__(self) -> None:
        self.due_now: list[tuple[Pool[Any], Any]] = []

    def due(self, pool: Pool[Any], server: Any) -> None:
        self.due_now.append((pool, server))

    def run(self) -> None:
        """What the runtime does once the reads under way are over."""
        while self.due_now:
            pool, server = self.due_now.pop(0)
            hand_off(pool, server)


class Deferring:
    """A pool whose hand-offs wait for the end of the callback (as the runtime's), its
    servers lent."""

    def __init__(self, pool_size: int = 1) -> None:
        self.pool, self.clock, self.launched = make_pool(pool_size=pool_size)
        self.asked = Asked()
        self.pool.defer = self.asked
        self.holders = [FakeClient(f"holder{i}") for i in range(pool_size)]
        for holder in self.holders:
            assert self.pool.acquire(holder) is None
        for server in list(self.launched):
            ready(self.pool, server)  # (outside a read of its own: lent at once)
        assert all(h.server is not None for h in self.holders)

    def wait(self, *names: str) -> list[FakeClient]:
        clients = [FakeClient(name) for name in names]
        for client in clients:
            assert self.pool.acquire(client) is None
        return clients

    def release(self, holder: FakeClient) -> FakeServer:
        """holder's server released inside its own read (its ReadyForQuery), not yet over."""
        server = holder.server
        assert server is not None
        holder.server = None
        server.in_read = True
        self.pool.release(server)
        return server

    def read_over(self, server: FakeServer) -> None:
        """The end of server's read (ServerConnection.data_received)."""
        server.in_read = False
        if server.handoff_at:
            lend_marked(self.pool, server)


class Declining(FakeClient):
    """A client that closed meanwhile: it hands the server it is given straight back."""

    def __init__(self, pool: Pool[FakeServer]) -> None:
        super().__init__("declining")
        self.pool = pool

    def server_assigned(self, server: FakeServer) -> None:
        self.server = server
        self.pool.release(server)


def test_a_server_released_in_its_read_while_a_client_waits_is_lent_at_the_end_of_it() -> None:
    d = Deferring()
    (waiter,) = d.wait("waiter")
    server = d.release(d.holders[0])
    assert waiter.server is None and list(d.pool.waiting) == [waiter]
    assert d.pool.active == {server} and not d.pool.idle and server.handoff_at  # nobody's
    assert not d.asked.due_now  # (a mark, read at the end of the read: no queue of its own)
    d.read_over(server)
    assert waiter.server is server and not d.pool.waiting and not d.pool.idle
    assert d.pool.active == {server} and not server.handoff_at


def test_without_defer_the_server_is_lent_at_once() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    holder, waiter = FakeClient(), FakeClient()
    pool.acquire(holder)
    ready(pool, launched[0])
    pool.acquire(waiter)
    assert holder.server is not None
    launched[0].in_read = True
    pool.release(holder.server)
    assert waiter.server is launched[0] and not pool.idle and not launched[0].handoff_at


def test_with_nobody_waiting_a_release_goes_idle_at_once() -> None:
    d = Deferring()
    server = d.release(d.holders[0])
    assert list(d.pool.idle) == [server] and not server.handoff_at


def test_released_outside_a_read_of_its_own_it_is_lent_at_once() -> None:
    """(No read is under way: the hand-off of another server whose client declined it.)"""
    d = Deferring()
    (waiter,) = d.wait("waiter")
    server = d.holders[0].server
    assert server is not None
    d.pool.release(server)
    assert waiter.server is server and not server.handoff_at


def test_servers_released_in_their_reads_serve_the_waiters_in_order() -> None:
    d = Deferring(pool_size=3)
    waiters = d.wait("a", "b", "c", "d")
    released = [d.release(h) for h in d.holders]
    assert all(w.server is None for w in waiters)
    for server in released:
        d.read_over(server)
    assert [w.server for w in waiters[:3]] == released and waiters[3].server is None
    assert list(d.pool.waiting) == [waiters[3]]  # first come, first served
    server = d.release(waiters[0])
    d.read_over(server)
    assert waiters[3].server is server


def test_a_client_that_left_before_the_hand_off_does_not_get_it_the_next_one_does() -> None:
    d = Deferring()
    gone, waiter = d.wait("gone", "waiter")
    server = d.release(d.holders[0])
    d.pool.client_left(gone, joined=False)
    d.read_over(server)
    assert gone.server is None and waiter.server is server


def test_with_nobody_left_waiting_the_server_goes_idle_for_the_next_client() -> None:
    d = Deferring()
    (gone,) = d.wait("gone")
    server = d.release(d.holders[0])
    d.pool.cancel_wait(gone)
    d.read_over(server)
    assert gone.server is None and list(d.pool.idle) == [server] and not d.pool.active
    assert d.pool.acquire(FakeClient("next")) is server


def test_a_server_that_closes_before_the_hand_off_goes_to_nobody_and_is_replaced() -> None:
    d = Deferring()
    (waiter,) = d.wait("waiter")
    server = d.release(d.holders[0])
    server.close("server connection lost")  # (the fake tells its pool at once)
    assert not d.pool.active and d.pool.server_count == 1  # one opened for the waiter
    d.read_over(server)
    assert waiter.server is None and list(d.pool.waiting) == [waiter]
    assert d.launched[1] in d.pool.login and not d.pool.idle
    ready(d.pool, d.launched[1])
    assert waiter.server is d.launched[1]


def test_a_client_asking_before_the_hand_off_queues_behind_those_waiting() -> None:
    d = Deferring()
    (first,) = d.wait("first")
    server = d.release(d.holders[0])
    (second,) = d.wait("second")  # asks in the same read: the server is first's
    assert second.server is None and list(d.pool.waiting) == [first, second]
    d.read_over(server)
    assert first.server is server and second.server is None


def test_pause_before_the_hand_off_keeps_the_server_idle_and_resume_hands_it_off() -> None:
    d = Deferring()
    (waiter,) = d.wait("waiter")
    kept = d.release(d.holders[0])
    d.pool.pause()
    d.read_over(kept)
    assert waiter.server is None and list(d.pool.idle) == [kept]
    d.pool.resume()  # (inside the admin console's read: handed off after it)
    assert waiter.server is None and d.asked.due_now == [(d.pool, kept)]
    d.asked.run()
    assert waiter.server is kept and not d.pool.idle


def test_reconnect_before_the_hand_off_closes_the_server_the_client_keeps_waiting() -> None:
    d = Deferring()
    (waiter,) = d.wait("waiter")
    server = d.release(d.holders[0])
    reconnect(d.pool)
    d.read_over(server)
    assert server.closed == "reconnect requested"
    assert waiter.server is None and list(d.pool.waiting) == [waiter]
    assert d.launched[1] in d.pool.login  # opened for it


def test_a_client_that_cannot_take_it_hands_it_to_the_next_one() -> None:
    d = Deferring()
    declining = Declining(d.pool)
    assert d.pool.acquire(declining) is None
    (waiter,) = d.wait("waiter")
    server = d.release(d.holders[0])
    d.read_over(server)
    assert waiter.server is server and d.pool.active == {server} and not d.pool.idle


def test_a_reserve_server_nobody_waits_for_at_the_hand_off_closes() -> None:
    d = Deferring(pool_size=2)
    (gone,) = d.wait("gone")
    server = d.release(d.holders[0])
    d.pool.pool_size = 1  # (as a reserve server: one more than the size)
    d.pool.cancel_wait(gone)
    d.read_over(server)
    assert server.closed == "pool is over its size" and d.pool.server_count == 1


def test_a_new_server_and_a_cancelled_one_are_handed_off_too() -> None:
    pool, _clock, launched = make_pool(pool_size=1)
    asked = Asked()
    pool.defer = asked
    owner, waiter = FakeClient("owner"), FakeClient("waiter")
    pool.acquire(owner)
    server = launched[0]
    server.in_read = True
    ready(pool, server)  # its login ends in its read
    assert owner.server is None and pool.active == {server} and not pool.login
    server.in_read = False
    lend_marked(pool, server)
    assert owner.server is server
    pool.acquire(waiter)
    cancel_started(pool, server, request=True)
    owner.server = None
    server.in_read = True
    pool.release(server)
    assert server in pool.being_canceled and waiter.server is None  # held for its cancel
    server.in_read = False
    cancel_ended(pool, server, request=True, answered=True)  # (from a task of its own)
    assert waiter.server is None and asked.due_now == [(pool, server)]
    asked.run()
    assert waiter.server is server


def test_the_wait_is_counted_up_to_the_release() -> None:
    d = Deferring()
    (waiter,) = d.wait("waiter")
    d.clock.now += 2
    before = d.pool.stats.wait.total
    server = d.release(d.holders[0])
    d.clock.now += 1
    d.read_over(server)
    assert waiter.server is server and d.pool.stats.wait.total - before == 2.0


def test_a_client_queued_after_the_server_came_back_waited_no_negative_time() -> None:
    d = Deferring()
    d.pool.pause()
    (gone,) = d.wait("gone")
    server = d.release(d.holders[0])
    d.read_over(server)
    d.pool.resume()  # (handed off after the callback)
    d.pool.cancel_wait(gone)
    d.clock.now += 1
    (late,) = d.wait("late")  # (no server idle: it queues)
    before = d.pool.stats.wait.total
    d.asked.run()
    assert late.server is server and d.pool.stats.wait.total == before


def test_resume_hands_off_one_idle_server_per_waiting_client_and_keeps_the_rest() -> None:
    d = Deferring(pool_size=3)
    d.pool.pause()
    for holder in d.holders:
        d.read_over(d.release(holder))
    assert len(d.pool.idle) == 3 and not d.asked.due_now
    first, second = d.wait("first", "second")
    d.pool.resume()
    assert len(d.asked.due_now) == 2 and len(d.pool.idle) == 1
    d.asked.run()
    assert first.server is not None and second.server is not None
    assert len(d.pool.idle) == 1 and not d.pool.waiting
