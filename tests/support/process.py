"""pgtarn as a child process for the tests: the demo's PgtarnChild plus what tests ask of it."""

from __future__ import annotations

from typing import Self

from pgtarn.demo.child import PgtarnChild

from .conninfo import make_dsn

__all__ = ["PgtarnProcess"]


class PgtarnProcess(PgtarnChild):
    """A pgtarn child process that also knows its unix socket directory, builds DSNs to
    itself and takes signals (SIGHUP reload, SIGUSR1 pause, ...)."""

    socket_dir: str
    """Directory of pgtarn's unix socket (the ini's unix_socket_dir)."""

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
        socket_dir: str = "",
    ) -> Self:
        """PgtarnChild.launch, recording `socket_dir` (the ini's unix_socket_dir)."""
        process = super().launch(
            ini_path,
            host=host,
            port=port,
            workdir=workdir,
            args=args,
            logfile=logfile,
            timeout=timeout,
        )
        process.socket_dir = socket_dir
        return process

    def dsn(self, user: str, password: str | None, dbname: str = "app", **extra: object) -> str:
        """libpq connection string to this pgtarn over TCP."""
        return make_dsn(
            host=self.host, port=self.port, dbname=dbname, user=user, password=password, **extra
        )

    def send_signal(self, sig: int) -> None:
        """Send a signal to the pgtarn process (if it still runs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
