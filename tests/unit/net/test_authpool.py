"""The auth threads: results, the bound on checks under way and waiting, timeouts, dropping."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pgtarn.net.authpool import AuthPool, PoolFull


def test_a_check_runs_in_another_thread() -> None:
    pool = AuthPool(threads=2, waiting=0)

    async def main() -> str | None:
        return await pool.run(lambda: threading.current_thread().name, timeout=30)

    try:
        name = asyncio.run(main())
    finally:
        pool.close()
    assert name is not None and name.startswith("pgtarn-auth")
    assert pool.pending == 0


def test_past_threads_and_waiting_a_check_is_refused_at_once() -> None:
    pool = AuthPool(threads=1, waiting=1)
    release = threading.Event()
    ran: list[int] = []

    def blocked(n: int) -> int:
        release.wait(30)
        ran.append(n)
        return n

    async def main() -> list[int | None]:
        first = asyncio.ensure_future(pool.run(lambda: blocked(1), timeout=30))
        second = asyncio.ensure_future(pool.run(lambda: blocked(2), timeout=30))
        await asyncio.sleep(0)  # both submitted
        assert pool.pending == 2
        with pytest.raises(PoolFull):
            await pool.run(lambda: blocked(3), timeout=30)
        release.set()
        return [await first, await second]

    try:
        assert asyncio.run(main()) == [1, 2]
    finally:
        pool.close()
    assert ran == [1, 2] and pool.pending == 0


def test_a_check_not_started_in_time_is_dropped() -> None:
    pool = AuthPool(threads=1, waiting=1)
    release = threading.Event()
    ran: list[str] = []

    async def main() -> tuple[str | None, str | None]:
        first = asyncio.ensure_future(pool.run(lambda: release.wait(30) and "first",
                                               timeout=30))
        await asyncio.sleep(0)
        late = await pool.run(lambda: ran.append("late") or "late", timeout=0.05)
        assert pool.pending == 1  # the dropped one no longer counts
        release.set()
        return await first, late

    try:
        assert asyncio.run(main()) == ("first", None)
    finally:
        pool.close()
    assert ran == []


def test_a_check_nobody_waits_for_is_skipped() -> None:
    pool = AuthPool(threads=1, waiting=0)
    ran: list[bool] = []

    async def main() -> bool | None:
        return await pool.run(lambda: ran.append(True) or True, timeout=30,
                              wanted=lambda: False)

    try:
        assert asyncio.run(main()) is None
    finally:
        pool.close()
    assert ran == [] and pool.pending == 0


def test_close_drops_what_waits_and_refuses_more() -> None:
    pool = AuthPool(threads=1, waiting=1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def under_way() -> str:
        started.set()
        release.wait(30)
        return "first"

    async def main() -> tuple[str | None, str | None]:
        first = asyncio.ensure_future(pool.run(under_way, timeout=30))
        second = asyncio.ensure_future(pool.run(lambda: ran.append("second") or "second",
                                                timeout=30))
        while not started.is_set():  # the first is in its thread, the second waits
            await asyncio.sleep(0.001)
        pool.close()
        with pytest.raises(PoolFull):
            await pool.run(lambda: "third", timeout=30)
        release.set()  # the check under way ends on its own
        return await first, await second

    assert asyncio.run(main()) == ("first", None)
    assert ran == [] and pool.pending == 0
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("pgtarn-auth"))
