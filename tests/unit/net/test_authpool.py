"""The auth threads: results, the bound on checks under way and waiting, timeouts, dropping,
threads started as needed."""

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


def test_an_exception_of_the_check_reaches_the_caller_on_the_loop() -> None:
    pool = AuthPool(threads=2, waiting=0)

    def fail() -> int:
        raise ValueError("no")

    async def main() -> None:
        loop_thread = threading.get_ident()
        with pytest.raises(ValueError, match="no"):
            await pool.run(fail, timeout=None)
        assert threading.get_ident() == loop_thread  # the caller goes on in its own thread
        assert await pool.run(threading.get_ident, timeout=None) != loop_thread

    try:
        asyncio.run(main())
    finally:
        pool.close()
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
        results = [await first, await second]
        assert await pool.run(lambda: 4, timeout=None) == 4  # room again
        return results

    try:
        assert asyncio.run(main()) == [1, 2]
    finally:
        pool.close()
    assert ran == [1, 2] and pool.pending == 0


def test_a_check_not_started_in_time_is_dropped() -> None:
    pool = AuthPool(threads=1, waiting=1)
    release = threading.Event()
    ran: list[str] = []

    def first_check() -> str:
        return "first" if release.wait(30) else "not released"

    def late_check() -> str:
        ran.append("late")
        return "late"

    async def main() -> tuple[str | None, str | None]:
        first = asyncio.ensure_future(pool.run(first_check, timeout=30))
        await asyncio.sleep(0)
        late = await pool.run(late_check, timeout=0.05)
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

    def check() -> bool:
        ran.append(True)
        return True

    async def main() -> bool | None:
        return await pool.run(check, timeout=30, wanted=lambda: False)

    try:
        assert asyncio.run(main()) is None
    finally:
        pool.close()
    assert ran == [] and pool.pending == 0


def test_close_refuses_more_and_lets_what_was_given_finish() -> None:
    pool = AuthPool(threads=1, waiting=1)
    started, release = threading.Event(), threading.Event()

    def under_way() -> str:
        started.set()
        release.wait(30)
        return "first"

    async def main() -> tuple[str | None, str | None]:
        first = asyncio.ensure_future(pool.run(under_way, timeout=30))
        second = asyncio.ensure_future(pool.run(lambda: "second", timeout=30))
        while not started.is_set():  # the first is in its thread, the second waits
            await asyncio.sleep(0.001)
        pool.close()
        with pytest.raises(PoolFull):
            await pool.run(lambda: "third", timeout=30)
        release.set()  # the check under way ends, then the one waiting runs
        return await first, await second

    assert asyncio.run(main()) == ("first", "second")
    assert pool.pending == 0
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("pgtarn-auth"))


def test_threads_start_only_as_needed_and_close_ends_them() -> None:
    pool = AuthPool(threads=4, waiting=0, name="lazy")

    def ours() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("pgtarn-lazy-")]

    async def main() -> None:
        assert ours() == []  # none before the first check
        assert await pool.run(lambda: 1, timeout=None) == 1
        assert await pool.run(lambda: 2, timeout=None) == 2  # one at a time: one thread

    asyncio.run(main())
    threads = ours()
    assert len(threads) == 1 and threads[0].daemon
    pool.close()
    threads[0].join(timeout=30)
    assert not threads[0].is_alive()
