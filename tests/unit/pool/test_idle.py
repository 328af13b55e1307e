"""IdleServers: a pool's idle servers, a stack that keeps its storage."""

from __future__ import annotations

import pytest

from pgtarn.pool.idle import IdleServers


class Server:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_the_newest_comes_out_first_and_iteration_runs_oldest_first() -> None:
    a, b, c = Server("a"), Server("b"), Server("c")
    idle: IdleServers[Server] = IdleServers()
    assert not idle and len(idle) == 0 and idle.top() is None
    for server in (a, b, c):
        idle.append(server)
    assert idle and len(idle) == 3 and list(idle) == [a, b, c] and idle.top() is c
    assert idle.pop() is c and idle.pop() is b and list(idle) == [a]


def test_pop_by_index_and_remove_keep_the_order_of_the_rest() -> None:
    a, b, c, d = (Server(n) for n in "abcd")
    idle: IdleServers[Server] = IdleServers()
    for server in (a, b, c, d):
        idle.append(server)
    assert idle.pop(0) is a and list(idle) == [b, c, d]
    idle.remove(c)
    assert list(idle) == [b, d] and c not in idle and b in idle and d in idle
    idle.append(a)
    assert list(idle) == [b, d, a] and idle.pop() is a


def test_missing_servers_raise_as_a_list_would() -> None:
    a = Server("a")
    idle: IdleServers[Server] = IdleServers()
    with pytest.raises(IndexError):
        idle.pop()
    with pytest.raises(ValueError):
        idle.remove(a)
    idle.append(a)
    with pytest.raises(IndexError):
        idle.pop(1)
    assert idle.pop(-1) is a


def test_emptying_keeps_the_storage_and_holds_no_server() -> None:
    """A list frees its storage at its last pop and allocates it again at the next append,
    once per transaction in a pool with fewer idle servers than clients."""
    a, b = Server("a"), Server("b")
    idle: IdleServers[Server] = IdleServers()
    idle.append(a)
    slots = idle.slots
    for _ in range(3):
        assert idle.pop() is a and not idle
        idle.append(a)
    assert idle.slots is slots and len(slots) == 1
    idle.append(b)
    idle.pop()
    idle.pop()
    assert len(slots) == 2 and slots == [None, None]  # kept, and no server kept alive
