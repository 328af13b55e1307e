"""Keys from the terminal without blocking: stdin in cbreak mode, polled with select, the
terminal's settings restored on exit."""

from __future__ import annotations

import os
import select
import sys
import termios
import tty
from types import TracebackType
from typing import Any

READ_SIZE = 64


def split_keys(chunk: str) -> list[str]:
    """A read's characters as keys; an escape sequence (an arrow key...) is one key."""
    if chunk.startswith("\x1b"):
        return [chunk]
    return list(chunk)


class KeyReader:
    """`with KeyReader() as keys: keys.read(timeout)`; reads nothing when stdin is not a
    terminal (it then only waits), so that top runs under a pipe too."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        self._saved: list[Any] | None = None

    def __enter__(self) -> KeyReader:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def read(self, timeout: float) -> list[str]:
        """The keys pressed within `timeout` seconds (returns at the first ones)."""
        if self.fd is None:
            select.select([], [], [], max(timeout, 0.0))
            return []
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return []
        data = os.read(self.fd, READ_SIZE)
        if not data:  # the terminal went away
            return ["q"]
        return split_keys(data.decode(errors="replace"))
