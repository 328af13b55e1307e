"""A worker forked from the supervisor, its code shared copy-on-write, watched through a pidfd.

A worker started as ``python -m pgtarn`` imports the whole pooler again, into a heap of its
own. Forked from the supervisor, which has imported the same code, it shares
those pages until it writes to them. The fork happens inside the supervisor's running event
loop, so the child first puts away what belongs to that loop: the signal handlers and their
wakeup descriptor (a signal for the child would otherwise reach the supervisor's loop; asyncio
itself forgets the running loop in a child, by its pid); it then runs its own loop and exits
with its code, never returning into the supervisor's stack. The supervisor learns of its
exit from a pidfd in its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from functools import cache
from typing import NoReturn

#: The exit code of a forked worker whose code raised (sysexits.h's EX_SOFTWARE).
CRASHED = 70


@cache
def pidfd_works() -> bool:
    """Whether pidfd_open works here, not only exists: kernels before 5.3, seccomp sandboxes
    and valgrind refuse it with ENOSYS or EPERM."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def can_fork() -> bool:
    """Whether forking is safe here: a working pidfd to watch the child, and no other thread
    whose locks the child would inherit held."""
    return threading.active_count() == 1 and pidfd_works()


class ForkedProcess:
    """A forked child as asyncio.subprocess.Process shows one: pid, returncode,
    send_signal, wait; its exit seen from the pidfd's readiness, then reaped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._pidfd = os.pidfd_open(pid)
        self._loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its code is lost
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    def send_signal(self, signum: int) -> None:
        """ProcessLookupError once it has exited, PermissionError as from os.kill."""
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, signum)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def close_in_child(self) -> None:
        """In another forked child: its copy of the pidfd closed (the loop is not its own)."""
        if self.returncode is None:
            os.close(self._pidfd)


def fork(
    handled: tuple[signal.Signals, ...],
    prepare: Callable[[], None],
    run: Callable[[], int],
) -> ForkedProcess:
    """Fork a child that calls prepare() (closing what it must not hold), then run(), and
    exits with run's code. `handled` are the signals the running loop handles: blocked
    around the fork, so that none reaches the child before it has let go of the loop's."""
    for stream in (sys.stdout, sys.stderr):  # (else the child writes the buffer again)
        with contextlib.suppress(Exception):
            stream.flush()
    # the objects the code is made of out of the collector's way: its passes write to each
    # object they visit, which would copy every shared page (Python's gc.freeze() advice)
    gc.freeze()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    try:
        pid = os.fork()
        if pid == 0:
            _child(handled, mask, prepare, run)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        return ForkedProcess(pid)
    except OSError:
        # a child the supervisor cannot watch must not serve: ended before the error goes up
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def _child(
    handled: tuple[signal.Signals, ...],
    mask: set[int | signal.Signals],
    prepare: Callable[[], None],
    run: Callable[[], int],
) -> NoReturn:
    code = CRASHED
    try:
        signal.set_wakeup_fd(-1)
        for signum in handled:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        prepare()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        code = run()
    except SystemExit as exc:  # sys.exit(code), as in a process of its own
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # nothing may unwind into the supervisor's stack
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
