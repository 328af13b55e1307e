"""WaitQueue: a pool's waiting clients, first come first served, with when each began."""

from __future__ import annotations

import pytest

from pgtarn.pool.waiting import WaitQueue


class Client:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_first_come_first_served_with_the_time_each_began() -> None:
    a, b, c = Client("a"), Client("b"), Client("c")
    queue: WaitQueue[Client] = WaitQueue()
    assert not queue and len(queue) == 0
    queue.append(a, 1.0)
    queue.append(b, 2.0)
    queue.append(c, 3.0)
    assert queue and len(queue) == 3 and list(queue) == [a, b, c]
    assert queue.items() == [(a, 1.0), (b, 2.0), (c, 3.0)] and queue.since(b) == 2.0
    assert queue.first_since() == 1.0 and queue.popleft() is a
    assert queue.first_since() == 2.0 and queue.popleft() is b
    assert a not in queue and c in queue and queue.since(a) is None and list(queue) == [c]


def test_remove_keeps_the_order_and_times_of_the_rest() -> None:
    a, b, c = Client("a"), Client("b"), Client("c")
    queue: WaitQueue[Client] = WaitQueue()
    for since, client in enumerate((a, b, c)):
        queue.append(client, float(since))
    queue.popleft()
    queue.remove(c)
    assert queue.items() == [(b, 1.0)]
    with pytest.raises(ValueError):
        queue.remove(c)
    queue.remove(b)
    assert not queue
    with pytest.raises(IndexError):
        queue.popleft()


def test_take_waiting_since_takes_the_old_in_order_and_keeps_the_young() -> None:
    clients = [Client(n) for n in "abcd"]
    queue: WaitQueue[Client] = WaitQueue()
    for client, since in zip(clients, (5.0, 1.0, 9.0, 3.0), strict=True):
        queue.append(client, since)  # (not in time order: waiters moved from another pool)
    assert queue.take_waiting_since(4.0) == [clients[1], clients[3]]
    assert queue.items() == [(clients[0], 5.0), (clients[2], 9.0)]
    assert queue.take_waiting_since(0.0) == [] and len(queue) == 2
    assert queue.take_waiting_since(float("inf")) == [clients[0], clients[2]] and not queue


def test_a_queue_that_never_empties_stays_as_small_as_its_longest_length() -> None:
    """Under steady load the queue is never empty: its ring goes round, or the storage
    would grow by one slot per transaction."""
    queue: WaitQueue[Client] = WaitQueue()
    clients = [Client(str(n)) for n in range(50)]
    for client in clients:
        queue.append(client, 0.0)
    for turn in range(10_000):
        assert queue.first_since() == (0.0 if turn < 50 else float(turn - 50))
        client = queue.popleft()
        assert client is clients[turn % 50]
        queue.append(client, float(turn))
    assert len(queue) == 50 and len(queue.waiters) == len(queue.times) == 64


def test_the_ring_grows_while_it_goes_round_and_keeps_the_order() -> None:
    """A ring full while its front is past its first slot grows into the waiters in order."""
    clients = [Client(str(n)) for n in range(40)]
    queue: WaitQueue[Client] = WaitQueue()
    for n in range(6):
        queue.append(clients[n], float(n))
    for _ in range(5):
        queue.popleft()  # the front at slot 5 of 8
    for n in range(6, 30):
        queue.append(clients[n], float(n))
    assert queue.items() == [(clients[n], float(n)) for n in range(5, 30)]
    queue.remove(clients[7])
    assert [queue.popleft() for _ in range(3)] == [clients[5], clients[6], clients[8]]
    assert queue.first_since() == 9.0 and len(queue) == 21 and clients[29] in queue
    while queue:
        queue.popleft()
    with pytest.raises(IndexError):
        queue.first_since()
    assert queue.head == 0 and all(slot is None for slot in queue.waiters)
