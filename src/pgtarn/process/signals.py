"""The signals pgtarn handles, held from its start until its handlers are in place."""

from __future__ import annotations

import signal

#: Stop (SIGTERM, SIGINT, SIGQUIT), reload (SIGHUP), pause and resume (SIGUSR1, SIGUSR2):
#: the default action of each ends the process.
HANDLED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def hold() -> None:
    """From here the handled signals wait (blocked) instead of ending the process: its port
    accepts and its pidfile is written, so that it looks started, before its handlers are in
    place. Threads started from here inherit the block, leaving the signals to this one."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)


def release() -> None:
    """The handlers are in place: a held signal is delivered now, and any later at once."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
