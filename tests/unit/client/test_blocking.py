"""BlockingCalls: calls on threads, results back on the loop, and no more pending than allowed."""

from __future__ import annotations

import asyncio
import threading

from pgtarn.client.blocking import BlockingCalls


def test_results_and_exceptions_come_back_on_the_loop() -> None:
    async def main() -> list[object]:
        calls = BlockingCalls("test", threads=2, queue_size=0)
        loop_thread = threading.get_ident()
        results: list[object] = []
        done = asyncio.Event()

        def record(outcome: object) -> None:
            assert threading.get_ident() == loop_thread  # never on the worker thread
            results.append(outcome)
            if len(results) == 2:
                done.set()

        def fail() -> int:
            raise ValueError("no")

        assert calls.submit(threading.get_ident, record)
        assert calls.submit(fail, record)
        await done.wait()
        assert calls.pending == 0
        calls.retire()
        return results

    results = asyncio.run(main())
    assert any(isinstance(r, int) and r != threading.get_ident() for r in results)
    assert any(isinstance(r, ValueError) for r in results)


def test_no_more_pending_than_threads_and_queue_and_room_again_after() -> None:
    async def main() -> None:
        calls = BlockingCalls("test", threads=1, queue_size=2)
        release = threading.Event()
        finished: list[object] = []
        all_done = asyncio.Event()

        def record(outcome: object) -> None:
            finished.append(outcome)
            if len(finished) == 3:
                all_done.set()

        for n in range(3):  # one runs (held), two wait
            assert calls.submit(lambda n=n: release.wait() and n, record)  # type: ignore[misc]
        assert calls.full()
        assert not calls.submit(lambda: 99, record)  # refused, and never run
        release.set()
        await all_done.wait()
        assert sorted(finished) == [0, 1, 2]  # type: ignore[type-var]
        assert not calls.full()
        again = asyncio.Event()
        assert calls.submit(lambda: 7, lambda outcome: again.set())
        await again.wait()
        calls.retire()

    asyncio.run(main())


def test_threads_are_started_only_as_needed_and_retire_ends_them() -> None:
    async def main() -> None:
        calls = BlockingCalls("lazy", threads=4, queue_size=0)
        done = asyncio.Event()
        assert calls.submit(lambda: 1, lambda outcome: done.set())
        await done.wait()
        threads = [t for t in threading.enumerate() if t.name.startswith("pgtarn-lazy-")]
        assert len(threads) == 1 and threads[0].daemon
        calls.retire()
        threads[0].join(timeout=30)
        assert not threads[0].is_alive()

    asyncio.run(main())
