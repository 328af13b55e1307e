"""Shutting down: the stop signals and SHUTDOWN's modes, what stays open meanwhile, the exit.

As PgBouncer: a shutdown that waits (SIGTERM, SHUTDOWN WAIT_FOR_CLIENTS: until the clients
have left; SIGINT, SHUTDOWN WAIT_FOR_SERVERS: until every server is released) closes the TCP
listening sockets at once, so that the kernel refuses a new connection, and keeps the unix
socket open for the admin console until the process exits (a pool login there is refused
with "pooler is shutting down"). A second SIGTERM or SIGINT, a SIGQUIT or SHUTDOWN exit at
once. At the exit the clients' connections are closed without an error, as PgBouncer's,
which exits: the client sees the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from ..admin import commands
from ..errors import PgtarnError
from ..net.accept import SocketServer
from ..runtime import Runtime
from . import signals, systemd

log = logging.getLogger("pgtarn")

#: What a client is told when a shutdown that waits for the servers gives it none
#: (PgBouncer's words; the log says "closing because: server shutting down").
SHUTDOWN_ERROR = PgtarnError("server shutting down", sqlstate="57P01", severity="FATAL")
#: The reason logged for the clients still connected at the exit (they are sent nothing).
EXIT_REASON = "server shutting down"
#: The first SIGTERM or SIGINT: the mode it starts, and PgBouncer's words for what it waits for.
WAITING_SIGNALS = {
    signal.SIGTERM: ("clients", "waiting for all clients disconnect"),
    signal.SIGINT: ("servers", "waiting for all servers connections to be released"),
}


def signalled(name: str, doing: str, command: Callable[[], object]) -> None:
    """Run an admin command for a signal; log what it did, or why it was ignored."""
    try:
        command()
    except PgtarnError as exc:
        log.info("%s ignored: %s", name, exc.message)
        return
    log.info("%s: %s", name, doing)


class Stopping:
    """The signals and the shutdown of one pgtarn process (App, app.py, is one of these)."""

    runtime: Runtime
    #: The listening sockets served (app.py's _serve).
    servers: list[SocketServer]
    #: The shutdown under way: "clients", "servers" or "now" (None: none).
    stopping: str | None
    #: Set when the process is to exit (App.run awaits it).
    done: asyncio.Future[None] | None
    #: A new pgtarn took over (--reboot): the unix socket is its own now.
    handed: bool

    def watch_signals(self, loop: asyncio.AbstractEventLoop, reload: Callable[[], object]) -> None:
        """SIGHUP reloads; SIGTERM, SIGINT, SIGQUIT stop; SIGUSR1 pauses, SIGUSR2 resumes."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            loop.add_signal_handler(signum, self.stop_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, reload)
        loop.add_signal_handler(signal.SIGUSR1, self.pause)
        loop.add_signal_handler(signal.SIGUSR2, self.resume)
        signals.release()  # held since the start (cli.command.serve)

    def stop_signal(self, signum: signal.Signals) -> None:
        """SIGTERM, SIGINT: the shutdown of their mode, or the exit when one is under way;
        SIGQUIT: the exit. PgBouncer's log words for each."""
        name = signal.Signals(signum).name
        waiting = WAITING_SIGNALS.get(signum)
        if waiting is None:
            log.info("got %s, fast exit", name)
            self.shutdown("now", signalled=True)
        elif self.stopping is not None:
            log.info("got %s while shutting down, fast exit", name)
            self.shutdown("now", signalled=True)
        else:
            log.info("got %s, shutting down, %s", name, waiting[1])
            self.shutdown(waiting[0], signalled=True)

    def pause(self) -> None:
        """SIGUSR1: as the admin console's PAUSE (servers closed as they are released)."""
        signalled("SIGUSR1", "pausing", lambda: commands.start_pause(self.runtime, None))

    def resume(self) -> None:
        """SIGUSR2: as RESUME (after PAUSE or SUSPEND); ignored during a shutdown."""
        if self.stopping is not None:
            log.info("got SIGUSR2 while shutting down, ignoring")
            return
        signalled("SIGUSR2", "resuming", lambda: commands.resume(self.runtime, None))

    def shutdown(self, mode: str, signalled: bool = False) -> None:
        """clients: exit when clients left; servers: when servers are released; now: at once.

        As PgBouncer: a SIGINT or SIGTERM while a shutdown is under way exits at once; so does
        the admin console's SHUTDOWN (or SHUTDOWN WAIT_FOR_CLIENTS) then.
        """
        if self.stopping is not None and (signalled or mode != "servers"):
            mode = "now"
        self.stopping = mode
        log.info("shutdown requested (%s)", mode)
        systemd.stopping()
        self._close_listeners()
        self.runtime.accepting = False
        self.runtime.console_only = not self.handed
        self.runtime.on_client_gone = self._on_client_gone
        if mode == "servers":
            # as PAUSE: transactions under way finish; as PgBouncer, clients waiting for a
            # server, and those that ask for one from now on, are disconnected
            self.runtime.registry.pause()
            self.runtime.registry.refuse_waiting(SHUTDOWN_ERROR)
        if mode == "now":
            self._finish()
            return
        self.runtime.spawn(self._wait_done())

    def _close_listeners(self) -> None:
        """No new connection: the TCP listening sockets close. The unix socket stays for the
        admin console until the exit, unless a new pgtarn took it over."""
        for server in self.servers:
            if self.handed:
                server.close()
            else:
                server.close_tcp()

    async def _wait_done(self) -> None:
        while not self._check_done():
            await asyncio.sleep(0.05)

    def _on_client_gone(self) -> None:
        self._check_done()

    def _check_done(self) -> bool:
        if self.stopping == "clients":
            busy = bool(self.runtime.clients)
        else:
            busy = any(
                pool.active or pool.tested or pool.being_canceled for pool in self.runtime.registry
            )
        if not busy:
            self._finish()
        return not busy

    def _finish(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def close_connections(self) -> None:
        """The exit: listening sockets, clients (sent nothing), servers, listener
        connections, health checks and auth_query connections all close."""
        for listening in self.servers:
            listening.close()
        runtime = self.runtime
        for client in list(runtime.clients.values()):
            client.close(reason=EXIT_REASON)
        for pool in runtime.registry:
            for server in [*pool.idle, *pool.active, *pool.tested, *pool.being_canceled]:
                server.close("shutdown")
            if pool.board is not None:
                pool.board.close("shutdown")
        runtime.registry.close_checks()
        runtime.close_lookups(shutdown=True)
