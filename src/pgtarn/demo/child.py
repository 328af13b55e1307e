"""pgtarn as a child process (`python -m pgtarn <ini>`): start, wait until it listens, stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

__all__ = ["PgtarnChild", "PgtarnStartError"]


class PgtarnStartError(RuntimeError):
    """A pgtarn child process exited or did not start listening in time."""


class PgtarnChild:
    """A pgtarn server running as a child process; its output goes to files in its workdir."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        *,
        ini_path: str,
        host: str,
        port: int,
        stdout_path: str,
        stderr_path: str,
        logfile: str | None = None,
    ) -> None:
        self.proc = proc
        self.ini_path = ini_path
        self.host = host
        self.port = port
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.logfile = logfile

    @classmethod
    def launch(
        cls,
        ini_path: str,
        *,
        host: str,
        port: int,
        workdir: str,
        args: tuple[str, ...] | list[str] = (),
        logfile: str | None = None,
        timeout: float = 15.0,
    ) -> Self:
        """Start pgtarn on `ini_path` and wait until `host:port` accepts TCP connections.

        stdout/stderr go to `<workdir>/pgtarn.stdout` and `.stderr`; `logfile` is the
        ini's logfile, if it has one (log_text reads it). Raises PgtarnStartError (with
        pgtarn's output) if it exits or is not listening within `timeout` seconds; the
        process is stopped then.
        """
        stdout_path = str(Path(workdir) / "pgtarn.stdout")
        stderr_path = str(Path(workdir) / "pgtarn.stderr")
        env = dict(os.environ)
        env.setdefault("PYTHONFAULTHANDLER", "1")
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgtarn", *args, ini_path],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        child = cls(
            proc,
            ini_path=ini_path,
            host=host,
            port=port,
            stdout_path=stdout_path,
            stderr_path=stderr_path,
            logfile=logfile,
        )
        try:
            child.wait_ready(timeout)
        except BaseException:
            child.stop(timeout=5)
            raise
        return child

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Poll until the TCP port accepts a connection; raise if the process dies first."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise PgtarnStartError(
                    f"pgtarn exited with code {self.proc.returncode} before listening on "
                    f"{self.host}:{self.port}\n--- output ---\n{self.log_text()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
            except OSError:
                pass
            else:
                if self.proc.poll() is None:
                    return
                continue  # someone else's listener, and ours died: report that above
            if time.monotonic() > deadline:
                raise PgtarnStartError(
                    f"pgtarn did not listen on {self.host}:{self.port} within {timeout}s"
                    f"\n--- output ---\n{self.log_text()}"
                )
            time.sleep(0.05)

    @staticmethod
    def _read(path: str | None) -> str:
        if not path:
            return ""
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stderr_text(self) -> str:
        """What pgtarn wrote to stderr so far."""
        return self._read(self.stderr_path)

    def log_text(self) -> str:
        """pgtarn's logfile (if any), then its stderr and stdout."""
        parts = [self._read(self.logfile), self.stderr_text(), self._read(self.stdout_path)]
        return "\n".join(p for p in parts if p)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to `timeout` s, then SIGKILL (its whole session); return the code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
