"""Fifo: the first-in first-out queue of the replies a server owes."""

from __future__ import annotations

import pytest

from pgtarn.session.fifo import Fifo


class Item:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_first_in_first_out_and_the_front_by_index() -> None:
    a, b, c = Item("a"), Item("b"), Item("c")
    fifo: Fifo[Item] = Fifo()
    assert not fifo and len(fifo) == 0
    for item in (a, b, c):
        fifo.append(item)
    assert fifo and len(fifo) == 3 and list(fifo) == [a, b, c]
    assert fifo[0] is a and fifo[2] is c
    assert fifo.popleft() is a and fifo[0] is b and len(fifo) == 2
    with pytest.raises(IndexError):
        fifo[2]
    with pytest.raises(IndexError):
        fifo[-1]


def test_index_and_delete_by_identity_from_the_front() -> None:
    a, b, c = Item("a"), Item("b"), Item("c")
    fifo: Fifo[Item] = Fifo()
    for item in (a, b, c):
        fifo.append(item)
    fifo.popleft()
    assert fifo.index(b) == 0 and fifo.index(c) == 1 and fifo.index(a) == -1
    fifo.delete(0)
    assert list(fifo) == [c] and fifo.index(c) == 0
    with pytest.raises(IndexError):
        fifo.delete(1)
    fifo.delete(0)
    assert not fifo and fifo.head == fifo.tail == 0


def test_empty_raises_and_taken_slots_hold_nothing() -> None:
    a, b = Item("a"), Item("b")
    fifo: Fifo[Item] = Fifo()
    with pytest.raises(IndexError):
        fifo.popleft()
    with pytest.raises(IndexError):
        fifo[0]
    fifo.append(a)
    fifo.append(b)
    slots = fifo.slots
    fifo.popleft()
    assert slots == [None, b]
    fifo.popleft()
    fifo.append(a)  # emptied: starts again at the front, in the same storage
    assert fifo.slots is slots and slots == [a, None] and fifo[0] is a


def test_a_queue_that_never_empties_stays_as_small_as_its_longest_length() -> None:
    fifo: Fifo[Item] = Fifo()
    items = [Item(str(n)) for n in range(10)]
    for item in items:
        fifo.append(item)
    for turn in range(10_000):
        item = fifo.popleft()
        assert item is items[turn % 10]
        fifo.append(item)
    assert len(fifo) == 10 and len(fifo.slots) <= 2 * 10 + 32
