"""HostSet: roles from the checks, bans with backoff, lag limits, reads with read-your-writes."""

from __future__ import annotations

from typing import Any

import pytest

from pgtarn.pool.hosts import FIRST_BAN, MAX_BAN, PRIMARY, REPLICA, UNKNOWN, HostSet


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def three(clock: Clock, **kwargs: Any) -> HostSet:
    return HostSet("app", [("a", 5432), ("b", 5433), ("c", 5434)], clock=clock, **kwargs)


def test_roles_are_what_the_servers_say(clock: Clock) -> None:
    hosts = three(clock)
    assert hosts.primary is None and [h.role for h in hosts.hosts] == [UNKNOWN] * 3
    hosts.check_passed(0, False, 1000, 0.0, clock.now)
    hosts.check_passed(1, True, 900, 0.0, clock.now)
    assert hosts.primary is hosts.hosts[0]
    assert hosts.hosts[1].role == REPLICA and hosts.hosts[1].lag_bytes == 100
    assert hosts.fit == [hosts.hosts[1]]
    # a promoted standby is the primary once the old one is gone, without a reload
    hosts.check_failed(0, "connection refused")
    assert hosts.primary is None
    hosts.check_passed(1, False, 1200, 0.0, clock.now)
    assert hosts.primary is hosts.hosts[1] and hosts.fit == []


def test_two_primaries_write_to_neither(clock: Clock) -> None:
    told: list[tuple[int, str]] = []
    hosts = three(clock)
    hosts.tell = lambda level, message: told.append((level, message))
    hosts.check_passed(0, False, 1000, 0.0, clock.now)
    hosts.check_passed(1, False, 1000, 0.0, clock.now)
    assert hosts.primary is None and hosts.split_brain
    assert any("claim to be the primary" in m for _, m in told)
    hosts.check_failed(1, "connection refused")
    assert hosts.primary is hosts.hosts[0] and not hosts.split_brain


def test_ban_backoff_doubles_and_a_passing_check_lifts_it(clock: Clock) -> None:
    hosts = three(clock, period=1.0)
    hosts.check_passed(1, True, 5, 0.0, clock.now)
    assert hosts.next_check(1) == clock.now + 1.0
    hosts.check_failed(1, "connection refused")
    assert hosts.hosts[1].banned(clock.now) and not hosts.hosts[1].up
    assert hosts.next_check(1) == clock.now + FIRST_BAN
    hosts.check_failed(1, "connection refused")
    assert hosts.next_check(1) == clock.now + 2 * FIRST_BAN
    for _ in range(20):
        hosts.check_failed(1, "connection refused")
    assert hosts.next_check(1) == clock.now + MAX_BAN
    assert hosts.fit == []
    hosts.check_passed(1, True, 5, 0.0, clock.now)
    assert hosts.hosts[1].up and not hosts.hosts[1].banned(clock.now)
    assert hosts.hosts[1].failures == 0 and hosts.fit == [hosts.hosts[1]]


def test_lagging_replica_gets_no_reads(clock: Clock) -> None:
    hosts = three(clock, max_lag_bytes=1000)
    hosts.check_passed(0, False, 10_000, 0.0, clock.now)
    hosts.check_passed(1, True, 9_500, 0.0, clock.now)
    hosts.check_passed(2, True, 8_000, 0.0, clock.now)
    assert hosts.fit == [hosts.hosts[1]]
    hosts.configure(1.0, None, 5.0)
    assert hosts.fit == [hosts.hosts[1], hosts.hosts[2]]
    hosts.check_passed(2, True, 8_000, 7.5, clock.now)
    assert hosts.fit == [hosts.hosts[1]]


def test_read_your_writes_waits_for_a_sample_after_the_write(clock: Clock) -> None:
    woken: list[bool] = []
    hosts = three(clock)
    hosts.wake = lambda: woken.append(True)
    hosts.check_passed(0, False, 1000, 0.0, clock.now)
    hosts.check_passed(1, True, 1000, 0.0, clock.now)
    hosts.check_passed(2, True, 1000, 0.0, clock.now)
    assert hosts.readable(0.0) == hosts.fit and len(hosts.fit) == 2
    clock.now += 1
    wrote = clock.now  # a client's write committed now
    assert hosts.readable(wrote) == [] and hosts.sample_wanted and woken == [True]
    assert hosts.readable(wrote) == [] and woken == [True]  # asked once
    clock.now += 0.01
    hosts.check_passed(0, False, 1500, 0.0, clock.now)  # the primary, after the write
    assert not hosts.sample_wanted
    assert hosts.readable(wrote) == []  # no replica replayed 1500 yet
    hosts.check_passed(2, True, 1500, 0.0, clock.now)
    assert hosts.readable(wrote) == [hosts.hosts[2]]
    assert hosts.readable(0.0) == [hosts.hosts[1], hosts.hosts[2]]  # others: any fit one


def test_changes_are_told_to_who_cares(clock: Clock) -> None:
    seen: list[object] = []
    hosts = three(clock)
    hosts.changed.append(seen.append)
    hosts.check_passed(0, False, 1, 0.0, clock.now)
    assert seen == [hosts]
    assert hosts.hosts[0].role == PRIMARY
