"""A child forked inside a running event loop: its own loop, its exit code, signals kept apart."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from pgtarn.workers.forked import CRASHED, fork

HANDLED = (signal.SIGUSR1, signal.SIGUSR2)


async def _child_of_a_running_loop(run: Callable[[], int]) -> tuple[int, list[signal.Signals]]:
    """Fork under a loop that handles HANDLED; the child's code and what the loop saw."""
    loop = asyncio.get_running_loop()
    seen: list[signal.Signals] = []
    for signum in HANDLED:
        loop.add_signal_handler(signum, seen.append, signum)
    try:
        process = fork(HANDLED, lambda: None, run)
        code = await asyncio.wait_for(process.wait(), 30)
        await asyncio.sleep(0.1)  # a wakeup byte the child wrote would be read by now
        with pytest.raises(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        return code, seen
    finally:
        for signum in HANDLED:
            loop.remove_signal_handler(signum)


def test_the_child_runs_its_own_loop_and_exits_with_its_code() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    code, _seen = asyncio.run(_child_of_a_running_loop(lambda: asyncio.run(work())))
    assert code == 7


def test_a_signal_to_the_child_is_not_one_for_the_parents_loop() -> None:
    def signalled() -> int:
        os.kill(os.getpid(), signal.SIGUSR1)  # before it has a handler: the default, death
        return 0

    code, seen = asyncio.run(_child_of_a_running_loop(signalled))
    assert code == -signal.SIGUSR1
    assert seen == []


def test_a_child_whose_code_raises_exits_and_never_returns_into_the_parent() -> None:
    def raises() -> int:
        raise RuntimeError("boom")

    code, _seen = asyncio.run(_child_of_a_running_loop(raises))
    assert code == CRASHED


def test_a_child_that_calls_sys_exit_exits_with_that_code() -> None:
    def exits() -> int:
        raise SystemExit(3)

    code, _seen = asyncio.run(_child_of_a_running_loop(exits))
    assert code == 3
