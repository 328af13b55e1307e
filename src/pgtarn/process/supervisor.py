"""The supervisor of workers = N: listening sockets, worker processes, their messages.

It serves no client itself. It binds the listening sockets once (workers/sockets.py), starts
each worker with its sockets and one end of a control socketpair, restarts a worker that
dies, passes signals on, and routes the workers' messages: broadcasts, messages to one
worker, and gathered answers from all of them. A worker is forked from the supervisor when
the command line gives it the worker's entry (workers/forked.py: the code's pages shared),
else started as ``python -m pgtarn --worker ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import __version__
from ..config.inifile import load_config
from ..config.settings import Config
from ..errors import ConfigError
from ..restart import rolling
from ..workers import admin, link, slots
from ..workers.channel import Channel, ChannelClosed
from ..workers.forked import ForkedProcess, can_fork, fork
from ..workers.ledger import Ledger, Outgoing, answers, grants, on_message
from ..workers.setup import WorkerSetup
from ..workers.sockets import tcp_listeners, unix_listener
from ..workers.wire import Message
from . import signals, systemd
from .logs import setup_logging
from .privileges import drop_privileges

log = logging.getLogger("pgtarn")

#: What every worker imports and a single process does not: imported here, before the
#: workers are forked, so that they share its pages instead of each importing it again.
FOR_FORKED_WORKERS = (link, slots)

#: A worker that dies sooner than this after its start is restarted after a growing delay,
#: up to RESTART_DELAY_MAX seconds, so that a worker that cannot start does not spin.
STABLE_AFTER = 5.0
RESTART_DELAY_MAX = 5.0
#: Signals passed on to every worker as they are.
FORWARDED = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


#: The forked worker's entry: runs the worker, returns its exit code.
WorkerEntry = Callable[[WorkerSetup], int]


@dataclass
class Worker:
    """One worker process as the supervisor sees it."""

    index: int
    sockets: list[socket.socket]
    process: asyncio.subprocess.Process | ForkedProcess | None = None
    channel: Channel | None = None
    started: float = 0.0
    restarts: int = 0
    pending: set[asyncio.Task[None]] = field(default_factory=set)


def worker_argv(
    config_path: str,
    index: int,
    count: int,
    control_fd: int,
    listen_fds: list[int],
    unix_fd: int | None,
    verbose: int,
    quiet: bool,
    reboot: bool = False,
    user: str = "",
) -> list[str]:
    """The command line of one worker."""
    argv = [sys.executable, "-m", "pgtarn", "--worker", f"{index}/{count}/{control_fd}"]
    if listen_fds:
        argv += ["--listen-fds", ",".join(str(fd) for fd in listen_fds)]
    if unix_fd is not None:
        argv += ["--unix-fd", str(unix_fd)]
    if verbose:
        argv.append("-" + "v" * verbose)
    if quiet:
        argv.append("-q")
    if reboot:  # it forwards unknown cancel keys, for the old pgtarn's clients
        argv.append("--reboot")
    if user:
        argv += ["-u", user]
    return [*argv, config_path]


class Supervisor:
    """The process of a pgtarn with workers > 1 (see the module docstring)."""

    def __init__(
        self,
        config_path: str,
        *,
        verbose: int = 0,
        quiet: bool = False,
        reboot: bool = False,
        user: str = "",
        worker_entry: WorkerEntry | None = None,
    ) -> None:
        self.config_path = config_path
        #: Forks the workers when given (else each is ``python -m pgtarn --worker``).
        self.worker_entry = worker_entry
        #: -u: the user to become once the sockets are bound (in place of `user =`).
        self.user = user
        self.verbose = verbose
        self.quiet = quiet
        self.workers: list[Worker] = []
        self.unix: socket.socket | None = None
        self.unix_path: str | None = None
        self.stopping: signal.Signals | None = None
        self.done: asyncio.Future[None] | None = None
        self.config = Config.default()
        #: --reboot, and the rolling restart under way on either side (rolling.py)
        self.reboot = reboot
        self.takeover: rolling.OldSide | rolling.NewSide | None = None
        self.takeover_listener: socket.socket | None = None
        self.keep_pidfile = False
        #: Server slots and clients of every worker: the limits hold for the whole pgtarn.
        self.ledger = Ledger()

    async def run(self) -> int:
        config = self.config = load_config(self.config_path)
        setup_logging(config, self.verbose, self.quiet)
        for warning in config.warnings:
            log.warning("config: %s", warning)
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        count = config.workers
        taken = await rolling.take_over(self, config.listen_port) if self.reboot else None
        if self.reboot and taken is None:
            log.warning("--reboot: no pgtarn serves port %d; starting anew", config.listen_port)
        addrs = [a.strip() for a in config.listen_addr if a.strip()]
        hosts = None if "*" in addrs else addrs
        spread = rolling.spread(taken[0], count, config.listen_backlog) if taken else None
        # systemd's sockets (socket activation) in place of our own, each shared by all workers
        activated = systemd.listen_sockets() if spread is None else []
        tcp = (
            spread[0]
            if spread is not None
            else [list(activated) for _ in range(count)]
            if activated
            else tcp_listeners(
                hosts,
                config.listen_port,
                config.listen_backlog,
                count,
                config.tcp_keepalive,
                buffer=config.tcp_socket_buffer,
            )
            if addrs
            else [[] for _ in range(count)]
        )
        self.workers = [Worker(index, socks) for index, socks in enumerate(tcp)]
        if tcp and tcp[0] and not activated:  # systemd.py logged its own
            for sock in tcp[0]:
                log.info("listening on %s (%d workers)", sock.getsockname()[:2], count)
        if spread is not None and spread[1] is not None and taken is not None:
            self.unix, self.unix_path = spread[1], taken[1]
        elif config.unix_socket_dir and not activated:
            path = os.path.join(config.unix_socket_dir, f".s.PGSQL.{config.listen_port}")
            self.unix = unix_listener(path, config.listen_backlog, config.unix_socket_mode)
            self.unix_path = path
            log.info("listening on unix:%s (%d workers)", path, count)
        if config.pidfile:
            with open(config.pidfile, "w") as f:
                f.write(f"{os.getpid()}\n")
        for signum in FORWARDED:
            loop.add_signal_handler(signum, self._forward, signum)
        for signum in STOPPING:
            loop.add_signal_handler(signum, self.stop, signum)
        signals.release()  # held since the start (cli.command.serve)
        log.info(
            "pgtarn %s supervisor started, pid %d, %d workers", __version__, os.getpid(), count
        )
        try:
            for worker in self.workers:
                await self._start(worker)
            # the workers give up root themselves once they have their sockets; a worker
            # started again later starts as that user
            drop_privileges(self.user or config.user)
            systemd.ready()  # the sockets listen: connections wait in them for the workers
            if isinstance(self.takeover, rolling.NewSide):
                await self.takeover.serving()
            rolling.open_listener(self, config.listen_port)
            await self.done
        finally:
            self._cleanup()
        return 0

    # --- worker processes -------------------------------------------------------------------

    async def _start(self, worker: Worker) -> None:
        if self.stopping is not None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        listen_fds = [s.fileno() for s in worker.sockets]
        unix_fd = self.unix.fileno() if self.unix is not None else None
        fds = [theirs.fileno(), *listen_fds, *([unix_fd] if unix_fd is not None else [])]
        argv = worker_argv(
            self.config_path,
            worker.index,
            len(self.workers),
            theirs.fileno(),
            listen_fds,
            unix_fd,
            self.verbose,
            self.quiet,
            self.reboot,
            self.user,
        )
        try:
            if self.worker_entry is not None and can_fork():
                start = WorkerSetup(
                    worker.index, len(self.workers), theirs.fileno(), tuple(listen_fds), unix_fd
                )
                entry = self.worker_entry
                worker.process = fork(
                    FORWARDED + STOPPING,
                    lambda: in_forked_worker(self, ours, fds),
                    lambda: entry(start),
                )
            else:
                # its own session: a Ctrl-C at a terminal reaches the supervisor alone, which
                # passes it on once (a worker that got it twice would stop at once)
                worker.process = await asyncio.create_subprocess_exec(
                    *argv, pass_fds=fds, start_new_session=True, env=systemd.child_environment()
                )
        except OSError as exc:
            log.error("worker %d could not start: %s", worker.index, exc)
            ours.close()
            theirs.close()
            worker.started = time.monotonic()  # (so that the restarts back off)
            self._schedule_restart(worker)
            return
        finally:
            theirs.close()
        worker.started = time.monotonic()
        if self.stopping is not None:  # a stop signal came while it was being started
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(self.stopping)
        worker.channel = Channel(
            ours, self._message, self._channel_closed, name=f"worker {worker.index} channel"
        )
        log.info("worker %d started, pid %d", worker.index, worker.process.pid)
        task = asyncio.get_running_loop().create_task(self._watch(worker, worker.process))
        worker.pending.add(task)
        task.add_done_callback(worker.pending.discard)

    async def _watch(
        self, worker: Worker, process: asyncio.subprocess.Process | ForkedProcess
    ) -> None:
        code = await process.wait()
        if worker.channel is not None:
            worker.channel.close()
            worker.channel = None
        worker.process = None
        self.worker_gone(worker.index)
        if self.stopping is not None:
            log.info("worker %d exited (%s)", worker.index, _exit_text(code))
            if all(w.process is None for w in self.workers):
                self._finish()
            return
        log.error(
            "worker %d (pid %d) exited unexpectedly (%s); its clients lost their "
            "connections; restarting it",
            worker.index,
            process.pid,
            _exit_text(code),
        )
        self._schedule_restart(worker)

    def _schedule_restart(self, worker: Worker) -> None:
        lived = time.monotonic() - worker.started
        worker.restarts = 0 if lived > STABLE_AFTER else worker.restarts + 1
        delay = min(RESTART_DELAY_MAX, 0.1 * (2**worker.restarts)) if worker.restarts else 0
        task = asyncio.get_running_loop().create_task(self._restart(worker, delay))
        worker.pending.add(task)
        task.add_done_callback(worker.pending.discard)

    async def _restart(self, worker: Worker, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        if self.stopping is None:
            await self._start(worker)

    def worker_gone(self, index: int) -> None:
        """What the supervisor held for a worker that exited is released."""
        ledger = self.ledger
        self._send_out(
            grants(ledger.worker_gone(index)) + answers(ledger.clients_worker_gone(index))
        )

    # --- signals ----------------------------------------------------------------------------

    def _forward(self, signum: signal.Signals) -> None:
        if signum == signal.SIGHUP:
            self._reload()
        for worker in self.workers:
            self._signal(worker, signum)

    def _signal(self, worker: Worker, signum: signal.Signals, tries: int = 100) -> None:
        """Send a worker a signal. One that has not yet given up root (user =, the
        supervisor has) refuses it for a moment: sent again every 0.1 s, for 10 s at most."""
        process = worker.process
        if process is None:
            return
        try:
            process.send_signal(signum)
        except ProcessLookupError:
            pass
        except PermissionError:
            if tries > 0:
                asyncio.get_running_loop().call_later(0.1, self._signal, worker, signum, tries - 1)
            else:
                log.error(
                    "worker %d refuses %s: it runs as another user", worker.index, signum.name
                )

    def _reload(self) -> None:
        with systemd.reloading():
            self._reload_config()

    def _reload_config(self) -> None:
        try:
            config = load_config(self.config_path)
        except (ConfigError, OSError) as exc:
            log.error("reload failed in the supervisor, keeping its configuration: %s", exc)
            return
        if config.workers != self.config.workers:
            log.warning("reload: workers changes only at restart")
        with contextlib.suppress(OSError):
            setup_logging(config, self.verbose, self.quiet)
        self.config = config

    def stop(self, signum: signal.Signals) -> None:
        """SIGTERM, SIGINT, SIGQUIT: every worker gets it and shuts down as it would alone;
        the supervisor exits when they all have."""
        if self.stopping is None:
            log.info("%s: stopping the workers", signum.name)
            systemd.stopping()
        self.stopping = signum
        for worker in self.workers:
            self._signal(worker, signum)
        if all(w.process is None for w in self.workers):
            self._finish()

    def _finish(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    # --- messages ---------------------------------------------------------------------------

    def _message(self, channel: Channel, message: Message, fds: list[int]) -> None:
        kind = message.get("kind")
        if kind == "broadcast":
            inner = message.get("message")
            if isinstance(inner, dict):
                others = message.get("others", True)
                for worker in self.workers:
                    if worker.channel is not None and not (others and worker.channel is channel):
                        worker.channel.send(dict(inner))
        elif kind == "to_worker":
            inner = message.get("message")
            index = message.get("worker")
            if isinstance(inner, dict) and isinstance(index, int) and \
                    0 <= index < len(self.workers):  # fmt: skip
                target = self.workers[index].channel
                if target is not None:
                    target.send(inner)
        elif kind in ("gather", "ask_worker"):
            asking = self._gather if kind == "gather" else self._ask_worker
            task = asyncio.get_running_loop().create_task(asking(channel, message))
            self.workers[0].pending.add(task)
            task.add_done_callback(self.workers[0].pending.discard)
        else:
            self.handle(channel, message, fds)

    def handle(self, channel: Channel, message: Message, fds: list[int]) -> None:
        """Messages for the supervisor itself."""
        if str(message.get("kind")).startswith("limits_"):
            worker = next((w.index for w in self.workers if w.channel is channel), None)
            if worker is not None:
                reply, out = on_message(self.ledger, worker, message)
                if "id" in message and reply is not None:  # (None: it comes later, in out)
                    channel.reply(message, reply)
                self._send_out(out)
            return
        kind = message.get("kind")
        if kind == admin.SHUTDOWN_KIND:
            self.stop(admin.shutdown_signal(message))
            return
        if kind == admin.RELOAD_KIND:
            self._reload()
            return
        if kind == rolling.CANCEL_KIND:
            rolling.forward_cancel(self, message)
            return
        if kind == admin.SET_KIND:
            self.config = admin.with_setting(self.config, message)
            with contextlib.suppress(OSError):
                setup_logging(self.config, self.verbose, self.quiet)
            return
        log.warning("%s: unknown message %r", channel.name, message.get("kind"))
        if "id" in message:
            channel.reply(message, {"error": "unknown message"})

    def _send_out(self, out: Outgoing) -> None:
        for index, message in out:
            channel = self.workers[index].channel
            if channel is not None and not channel.closed:
                channel.send(message)

    async def _gather(self, asker: Channel, message: Message) -> None:
        inner = message.get("message")
        timeout = message.get("timeout", 5.0)
        if not isinstance(inner, dict) or not isinstance(timeout, int | float):
            asker.reply(message, {"results": []})
            return

        async def ask(worker: Worker) -> Message | None:
            channel = worker.channel
            if channel is None:
                return None
            try:
                reply, _fds = await channel.request(dict(inner), timeout)
            except (ChannelClosed, TimeoutError):
                return None
            reply.pop("re", None)
            reply["worker"] = worker.index
            return reply

        results = await asyncio.gather(*(ask(w) for w in self.workers))
        if not asker.closed:
            asker.reply(message, {"results": [r for r in results if r is not None]})

    async def _ask_worker(self, asker: Channel, message: Message) -> None:
        """One worker's reply to a message of another (a cancel: when it is over)."""
        inner, index = message.get("message"), message.get("worker")
        timeout = message.get("timeout", 5.0)
        answer: Message = {}
        if isinstance(inner, dict) and isinstance(index, int) and \
                0 <= index < len(self.workers) and isinstance(timeout, int | float):  # fmt: skip
            channel = self.workers[index].channel
            if channel is not None:
                with contextlib.suppress(ChannelClosed, TimeoutError):
                    reply, _fds = await channel.request(dict(inner), timeout)
                    reply.pop("re", None)
                    answer = {"reply": reply}
        if not asker.closed:
            asker.reply(message, answer)

    def _channel_closed(self, channel: Channel) -> None:
        """A worker's channel ends with the worker (_watch follows its exit)."""

    def _cleanup(self) -> None:
        for worker in self.workers:
            for sock in worker.sockets:
                sock.close()
        if self.unix is not None:
            self.unix.close()
        if self.unix_path:
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)
        rolling.close_listener(self)
        if self.takeover is not None:
            self.takeover.finish()
        if self.config.pidfile and not self.keep_pidfile:
            with contextlib.suppress(OSError):
                os.unlink(self.config.pidfile)
        log.info("pgtarn stopped")


def in_forked_worker(sup: Supervisor, ours: socket.socket, keep: list[int]) -> None:
    """In a forked worker, before it runs: what it must not hold of the supervisor closed
    (its end of this worker's channel and the others', the sockets of other workers,
    the takeover socket), its own session (as start_new_session), systemd's variables
    gone (as child_environment)."""
    os.setsid()
    ours.close()
    for other in sup.workers:
        if other.channel is not None:
            other.channel.sock.close()
        if isinstance(other.process, ForkedProcess):
            other.process.close_in_child()
        for sock in other.sockets:
            if sock.fileno() not in keep:
                sock.close()
    if sup.takeover_listener is not None:
        sup.takeover_listener.close()
    if sup.takeover is not None:
        sup.takeover.channel.sock.close()
    environment = systemd.child_environment()
    os.environ.clear()
    os.environ.update(environment)


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
