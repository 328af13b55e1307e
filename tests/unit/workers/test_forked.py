"""A child forked inside a running event loop: its own loop, its exit code, signals kept apart."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from pgtarn.workers import forked
from pgtarn.workers.forked import CRASHED, can_fork, fork

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


def _no_pidfd(pid: int, flags: int = 0) -> int:
    raise OSError(38, "Function not implemented")  # ENOSYS: a kernel before 5.3, a sandbox


def test_without_a_working_pidfd_open_workers_are_not_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """os.pidfd_open may exist and still fail (old kernels, seccomp, valgrind): then the
    supervisor starts its workers afresh instead of forking ones it cannot watch."""
    forked.pidfd_works.cache_clear()
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    try:
        assert not can_fork()
    finally:
        forked.pidfd_works.cache_clear()


def _lingers() -> int:
    time.sleep(5)  # (long enough to be found running; ends by itself should the test fail)
    return 0


def test_a_child_its_parent_cannot_watch_is_ended_not_left_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should the pidfd fail after the fork, the child is killed and reaped before the error
    goes up: no worker runs that its supervisor does not know of."""
    children: list[int] = []
    real_fork = os.fork

    def recorded_fork() -> int:
        pid = real_fork()
        if pid:
            children.append(pid)
        return pid

    async def forked_once() -> None:
        with pytest.raises(OSError):
            fork(HANDLED, lambda: None, _lingers)

    monkeypatch.setattr(os, "fork", recorded_fork)
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    asyncio.run(forked_once())
    assert len(children) == 1
    with pytest.raises(ChildProcessError):  # reaped already
        os.waitpid(children[0], os.WNOHANG)
