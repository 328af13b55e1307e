"""Composition root: config, listeners, pools, signals; runs until shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import os
import resource
import socket
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, cast

from . import __version__
from .admin import fanout
from .admin.tables import database_totals
from .client.connection import ClientConnection, cancel_by_key
from .config.inifile import load_config
from .config.settings import SETTINGS, Config
from .errors import ConfigError
from .janitor import JANITOR_INTERVAL, Janitor
from .net.accept import SocketServer
from .net.sockets import keepalive_listeners, tcp_options
from .net.tls import TLS_MODES, TlsSetup, tls_changes, tls_setup
from .pool.pool import Pool
from .pool.registry import Registry
from .pool.stats import Totals, averages, sum_totals
from .process import systemd
from .process.authfiles import read_hba, read_userlist
from .process.logs import setup_logging
from .process.privileges import drop_privileges
from .process.shutdown import Stopping
from .proto.client_side import forget_derived_secrets
from .restart.takeover import accept_takeover, takeover_address, takeover_listener
from .runtime import Coordinator, ReloadReport, Runtime, WorkerLimits
from .server.authquery import SecretLookup
from .server.connection import ServerConnection
from .server.health import start_health
from .server.launch import launch_server
from .server.listener import Listener
from .workers.setup import WorkerSetup
from .workers.sockets import tcp_listeners, unix_listener

log = logging.getLogger("pgtarn")


def raise_fd_limit(config: Config) -> None:
    """Lift the soft RLIMIT_NOFILE towards what max_client_conn and the pools may need.

    Without it a 1024 default turns a busy minute into failed accepts; the hard limit is
    the operator's, so a shortfall there is only reported.
    """
    pools = max(1, len(config.databases)) * (config.default_pool_size + config.reserve_pool_size)
    needed = config.max_client_conn + pools + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "file descriptor limit %d is below the %d that max_client_conn %d and "
            "the pools may need",
            soft,
            needed,
            config.max_client_conn,
        )


def tls_setup_logged(config: Config) -> TlsSetup:
    """config's TLS contexts; a failure logged with PgBouncer's words, then raised."""
    try:
        return tls_setup(config)
    except ConfigError as exc:
        log.error("TLS setup failed: %s", exc)
        raise


MetricsServer = Callable[[Runtime, str, int], Coroutine[None, None, asyncio.AbstractServer | None]]


def closed_loop_quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: a server's address resolved after the loop closed (a
    connect cancelled by the exit, its lookup still in the resolver's thread) has nobody
    left to tell, so its "Event loop is closed" is dropped; everything else is logged."""
    exc = context.get("exception")
    if loop.is_closed() and isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return
    loop.default_exception_handler(context)


def load_metrics() -> MetricsServer:
    """metrics.py's serve_metrics, imported only when metrics_port is set: prometheus_client
    (with the http, email and urllib modules it pulls in) is memory a pooler without metrics
    need not hold."""
    from .admin.metrics import serve_metrics  # lazy, for the memory (see the docstring)

    return serve_metrics


def load_worker_link() -> Callable[[int, int, socket.socket, Callable[[], None]], Coordinator]:
    """workers/link.py's WorkerLink, imported only in a worker of workers = N: the control
    channel (with json) is memory a single process does not need."""
    from .workers.link import WorkerLink  # lazy, for the memory (see the docstring)

    return WorkerLink


def load_takeover() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """reboot.py's take_over (new process), Handover (old process) and adopted_by_worker (a
    new worker), imported only for a rolling restart: it and the control channel (with json)
    are memory a pooler holds only while one happens."""
    from .restart.reboot import (  # lazy, for the memory (see the docstring)
        Handover,
        adopted_by_worker,
        take_over,
    )

    return take_over, Handover, adopted_by_worker


def load_worker_limits() -> Callable[[Coordinator, Registry[Any]], WorkerLimits]:
    """workers/slots.py's SharedLimits, imported only in a worker of workers = N (with the
    link it uses): memory a single process does not need, as for the link."""
    from .workers.slots import SharedLimits  # lazy, for the memory (see the docstring)

    return cast(Callable[[Coordinator, Registry[Any]], WorkerLimits], SharedLimits)


def cancel_from_worker(
    runtime: Runtime, message: dict[str, object]
) -> asyncio.Future[dict[str, object]] | None:
    """A CancelRequest that reached another worker with a key of this one's; the answer,
    ready when the cancel is over (the asking worker then closes the cancel connection)."""
    key = message.get("key")
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, int) for k in key)):
        return None
    ended: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()

    def done() -> None:
        if not ended.done():
            ended.set_result({})

    if not cancel_by_key(runtime, (key[0], key[1]), done):
        done()
        if not message.get("last") and runtime.forward_cancel is not None:
            runtime.forward_cancel((key[0], key[1]))  # a client still on the old pgtarn
    return ended


def join_rolling_restart(app: App, link: Coordinator) -> None:
    """A worker's part in a rolling restart (rolling.py): an old worker drains when a new
    pgtarn serves the sockets, a new one adopts the clients its supervisor passes on and
    (started with --reboot) sends it the cancel keys it does not know."""

    def drain(fds: list[int]) -> None:
        # hand over as a single process does, over the socket the supervisor relays
        if len(fds) == 1:
            app.takeover = load_takeover()[1](app, socket.socket(fileno=fds[0]), lambda: None)

    link.handle("drain", lambda _message, fds: drain(fds))
    link.handle("adopt", lambda message, fds: load_takeover()[2](app.runtime, message, fds))
    if app.reboot:
        app.runtime.forward_cancel = lambda key: link.send(
            {"kind": "reboot_cancel", "key": list(key)}
        )


class App(Stopping):
    """One pgtarn process: the whole pooler, or one worker of workers = N (its signals and
    shutdown: shutdown.py's Stopping)."""

    def __init__(
        self,
        config_path: str,
        *,
        verbose: int = 0,
        quiet: bool = False,
        worker: WorkerSetup | None = None,
        reboot: bool = False,
        user: str = "",
    ) -> None:
        self.config_path = config_path
        self.worker = worker
        #: -u: the user to become once the sockets are bound (in place of `user =`).
        self.user = user
        #: --reboot: take over from the pgtarn on our port; the takeover socket, and the
        #: rolling restart under way (reboot.py), on either side of it.
        self.reboot = reboot
        self.takeover_listener: socket.socket | None = None
        self.takeover: Any = None
        self.keep_pidfile = False
        self.handed = False
        self.link: Coordinator | None = None
        self.verbose = verbose
        self.quiet = quiet
        self.servers: list[SocketServer] = []
        self.metrics_server: asyncio.AbstractServer | None = None
        self.unix_path: str | None = None
        self.stopping: str | None = None
        self.done: asyncio.Future[None] | None = None

    async def run(self) -> int:
        config = load_config(self.config_path)
        setup_logging(config, self.verbose, self.quiet)
        for warning in config.warnings:
            log.warning("config: %s", warning)
        raise_fd_limit(config)
        runtime = Runtime(config, read_userlist(config))
        tls = tls_setup_logged(config)
        runtime.client_tls, runtime.server_tls = tls.client, tls.server
        runtime.client_tls_binding = tls.binding
        runtime.hba, runtime.ident = read_hba(config)
        self.runtime = runtime
        runtime.control = self
        # the composition root: what the runtime makes, it makes through these
        runtime.registry.launch = lambda pool, db: launch_server(
            runtime, cast(Pool[ServerConnection], pool), db
        )
        runtime.registry.open_listener = lambda pool, db, board: Listener(runtime, pool, db, board)
        runtime.registry.start_health = lambda hosts, pool, db: start_health(
            runtime, hosts, pool, db
        )
        runtime.make_lookup = SecretLookup
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(closed_loop_quiet)
        self.done = loop.create_future()
        if self.worker is not None:
            await self._join_workers(self.worker)
        elif not (self.reboot and await self._take_over(config)):
            await self._listen(config)
        keepalive_listeners(self.servers, config.tcp_keepalive)
        if self.worker is None:
            self._open_takeover(config.listen_port)
        if config.metrics_port:
            # with workers, worker 0 listens and gathers the others' samples (metrics.py)
            host = config.metrics_listen_addr or "127.0.0.1"
            metrics = await load_metrics()(
                runtime, "" if host == "*" else host, config.metrics_port
            )
            self.metrics_server = metrics
            if metrics is not None:
                log.info("metrics on http://%s:%d/metrics", host, config.metrics_port)
        if config.pidfile and self.worker is None:
            with open(config.pidfile, "w") as f:
                f.write(f"{os.getpid()}\n")
        drop_privileges(self.user or config.user)  # (a worker: once it has its sockets)
        self.watch_signals(loop, self.reload)
        self._open_forced_pools()
        runtime.spawn(self._janitor())
        runtime.spawn(self._stats_loop())
        if self.worker is None:
            log.info("pgtarn %s started, pid %d", __version__, os.getpid())
            systemd.ready()
        else:
            log.info(
                "pgtarn %s worker %d started, pid %d", __version__, self.worker.index, os.getpid()
            )
        # startup's objects live for good: frozen, the collector's full collections skip them
        gc.collect()
        gc.freeze()
        try:
            await self.done
        finally:
            self._cleanup()
        return 0

    async def _listen(self, config: Config) -> None:
        if activated := systemd.listen_sockets():  # systemd's sockets, in place of our own
            return await self._serve(activated)
        addrs = [a.strip() for a in config.listen_addr if a.strip()]
        hosts = None if "*" in addrs else addrs
        if config.unix_socket_dir:
            path = os.path.join(config.unix_socket_dir, f".s.PGSQL.{config.listen_port}")
            unix = unix_listener(path, config.listen_backlog, config.unix_socket_mode)
            self.unix_path = path
            await self._serve([unix])
            log.info("listening on unix:%s", path)
        if addrs:  # last: once its port accepts, every listener is ready (the unix one too)
            # SO_KEEPALIVE, buffers, SO_REUSEPORT before they listen (accepts inherit them)
            socks = tcp_listeners(
                hosts,
                config.listen_port,
                config.listen_backlog,
                1,
                config.tcp_keepalive,
                reuse_port=config.so_reuseport,
                buffer=config.tcp_socket_buffer,
            )[0]
            await self._serve(socks)
            for sock in socks:
                log.info("listening on %s", sock.getsockname()[:2])

    async def _take_over(self, config: Config) -> bool:
        """--reboot: serve the listening sockets of the pgtarn running on our port, which
        then drains and sends us its idle clients (False: none runs there)."""
        runtime = self.runtime
        take_over = load_takeover()[0]
        taken = await take_over(
            runtime, takeover_address(config.listen_port), lambda sock: self._serve([sock])
        )
        if taken is None:
            log.warning("--reboot: no pgtarn serves port %d; starting anew", config.listen_port)
            return False
        self.takeover, self.unix_path = taken
        return True

    def _open_takeover(self, port: int) -> None:
        """Listen for a new pgtarn started with --reboot."""
        self.takeover_listener = takeover_listener(port)
        if self.takeover_listener is not None:
            asyncio.get_running_loop().add_reader(
                self.takeover_listener.fileno(), self._takeover_asked
            )

    def _takeover_asked(self) -> None:
        conn = accept_takeover(
            self.takeover_listener,
            self.stopping is not None
            or (self.takeover is not None and not self.takeover.channel.closed),
        )
        if conn is not None:
            self.takeover = load_takeover()[1](self, conn, self._close_takeover)

    def _close_takeover(self) -> None:
        listener, self.takeover_listener = self.takeover_listener, None
        if listener is not None:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            listener.close()

    def handed_over(self) -> None:
        """A new pgtarn serves our sockets: its pidfile and unix socket are not ours."""
        self.keep_pidfile = self.handed = True

    async def _serve(self, sockets: Iterable[socket.socket]) -> None:
        """Serve listening sockets (our own, the supervisor's, an old pgtarn's, systemd's):
        each connection a ClientConnection on a SocketTransport (net/accept.py)."""
        # a C callable: called at each accept, and a closure is a Python frame there
        factory = functools.partial(ClientConnection, self.runtime)
        self.servers.append(SocketServer(asyncio.get_running_loop(), list(sockets), factory))

    async def _join_workers(self, worker: WorkerSetup) -> None:
        """A worker serves the supervisor's listening sockets and talks to it."""
        runtime = self.runtime
        fds = [*worker.listen_fds, *([worker.unix_fd] if worker.unix_fd is not None else [])]
        await self._serve(socket.socket(fileno=fd) for fd in fds)
        link_class = load_worker_link()
        self.link = link_class(
            worker.index,
            worker.count,
            socket.socket(fileno=worker.control_fd),
            self._supervisor_gone,
        )
        runtime.coordinator = self.link
        # ids unique across workers (KILL_CLIENT <id> of SHOW CLIENTS): worker i of n has i+1,
        # i+1+n, i+1+2n...
        runtime.ids = itertools.count(worker.index + 1, worker.count)
        fanout.register(runtime, self.link)
        self.link.handle("cancel", lambda message, _fds: cancel_from_worker(runtime, message))
        join_rolling_restart(self, self.link)
        limits = runtime.limits = load_worker_limits()(self.link, runtime.registry)
        runtime.registry.gate = limits
        for pool in runtime.registry:  # made before the link (min_pool_size)
            pool.gate = limits
            pool.min_pool_size = limits.share(pool.min_pool_size)

    def _supervisor_gone(self) -> None:
        """Without its supervisor a worker stops accepting and exits once its clients are
        gone (as SIGTERM), so no client is cut off but none is taken on either."""
        if self.stopping is None:
            log.error(
                "the supervisor is gone: no new connections; exiting when the clients have left"
            )
            self.shutdown("clients")

    async def _janitor(self) -> None:
        """The one periodic loop: timeouts, lifetimes, retries, reserve pool, min_pool_size."""
        janitor = Janitor(self.runtime)
        while True:
            await asyncio.sleep(JANITOR_INTERVAL)
            try:
                janitor.tick(time.monotonic())
            except Exception:  # the loop must outlive a bug in one visit
                log.exception("janitor visit failed")

    async def _stats_loop(self) -> None:
        """Every stats_period: the averages SHOW STATS shows, and the log_stats line."""
        runtime = self.runtime
        before = database_totals(runtime)
        started = time.monotonic()
        while True:
            await asyncio.sleep(max(1, runtime.config.stats_period))
            now = time.monotonic()
            totals = database_totals(runtime)
            runtime.averages = {
                name: averages(value, before.get(name, Totals()), now - started)
                for name, value in totals.items()
            }
            overall = averages(
                sum_totals(totals.values()), sum_totals(before.values()), now - started
            )
            runtime.overall_averages = overall
            before, started = totals, now
            if runtime.config.log_stats:
                log.info(
                    "stats: %d xacts/s, %d queries/s, %d client parses/s, %d server parses/s,"
                    " %d binds/s, in %d B/s, out %d B/s, xact %d us, query %d us, wait %d us",
                    overall.xact_count,
                    overall.query_count,
                    overall.client_parse_count,
                    overall.server_parse_count,
                    overall.bind_count,
                    overall.bytes_received,
                    overall.bytes_sent,
                    overall.xact_time,
                    overall.query_time,
                    overall.wait_time,
                )

    def _open_forced_pools(self) -> None:
        """Databases with a forced user have their pool from the start, for min_pool_size."""
        config = self.runtime.config
        for db in config.databases.values():
            if db.user and config.min_pool_size_for(db) > 0:
                self.runtime.registry.get_pool(db, db.user)

    def reload(self) -> ReloadReport:
        """SIGHUP, RELOAD: re-read the config file, then apply it as :meth:`apply` does."""
        with systemd.reloading():
            try:
                config = load_config(self.config_path)
            except (ConfigError, OSError) as exc:
                log.error("reload failed, keeping the old configuration: %s", exc)
                return ReloadReport(error=str(exc))
            for warning in config.warnings:
                log.warning("config: %s", warning)
            return self.apply(config, "reload")

    def _tls_setup(
        self, old: Config, config: Config, source: str, report: ReloadReport
    ) -> TlsSetup | None:
        """config's TLS contexts; None: keep the running ones. As PgBouncer, a SET of a TLS
        setting that cannot be loaded (a key set before its certificate) is taken, with a
        warning, and the contexts change once the settings load; a RELOAD or a SET of an
        sslmode that fails refuses the change (ConfigError)."""
        try:
            return tls_setup_logged(config)
        except ConfigError:
            if source != "SET" or tls_changes(old, config) & TLS_MODES:
                raise
        log.warning("SET: TLS settings could not be applied, still using the old TLS configuration")
        report.warnings.append("TLS settings could not be applied, still using old configuration")
        return None

    def apply(self, config: Config, source: str = "reload") -> ReloadReport:
        """Put config in force, for RELOAD and the admin console's SET alike: auth_file,
        TLS contexts, hba and logging are made from it anew (the old ones stay when one
        fails); settings that change only at restart keep their old values."""
        old = self.runtime.config
        report = ReloadReport()
        try:
            userlist = read_userlist(config)
            # certificates, keys and CA files are read again, whether or not a setting changed
            tls = self._tls_setup(old, config, source, report)
            hba, ident = read_hba(config)
            setup_logging(config, self.verbose, self.quiet)
        except (ConfigError, OSError) as exc:
            log.error("%s failed, keeping the old configuration: %s", source, exc)
            return ReloadReport(error=str(exc))
        for name, setting in SETTINGS.items():
            if getattr(old, name) == getattr(config, name):
                continue
            if setting.changeable:
                report.changed.append(name)
            else:
                report.rejected.append(name)
                log.warning("%s: %s changes only at restart", source, name)
                config = dataclasses.replace(config, **{name: getattr(old, name)})
        for name in sorted(set(old.databases) | set(config.databases)):
            if old.databases.get(name) != config.databases.get(name):
                report.changed.append(f"[databases] {name}")
        for name in sorted(set(old.users) | set(config.users)):
            if old.users.get(name) != config.users.get(name):
                report.changed.append(f"[users] {name}")
        for peer_id in sorted(set(old.peers) | set(config.peers)):
            if old.peers.get(peer_id) != config.peers.get(peer_id):
                report.changed.append(f"[peers] {peer_id}")
        self.runtime.config, self.runtime.tcp_options = config, tcp_options(config)
        self.runtime.userlist = userlist
        if tls is not None:
            self.runtime.client_tls, self.runtime.server_tls = tls.client, tls.server
            self.runtime.client_tls_binding = tls.binding
        self.runtime.hba, self.runtime.ident = hba, ident
        self.runtime.close_lookups()
        forget_derived_secrets()
        raise_fd_limit(config)
        keepalive_listeners(self.servers, config.tcp_keepalive)
        self.runtime.registry.apply(config)
        if tls is not None and any(
            name.startswith("server_tls") or name == "server_channel_binding"
            for name in report.changed
        ):
            # as PgBouncer: servers made under the old TLS settings are replaced, idle ones
            # now (with its words), the others when released
            for pool in self.runtime.registry:
                for server in pool.servers():
                    server.close_needed = True
                pool.close_idle("database configuration changed")
        if "max_prepared_statements" in report.changed and config.max_prepared_statements:
            # servers keep at most the new number: the oldest are closed at their next Parse
            for view in self.runtime.servers():
                if view.statements is not None:
                    view.statements.capacity = config.max_prepared_statements
        self._open_forced_pools()
        log.info(
            "configuration %s; changed: %s",
            "reloaded" if source == "reload" else f"changed by {source}",
            ", ".join(report.changed) or "nothing",
        )
        return report

    def _cleanup(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.close()
        self.close_connections()
        if self.unix_path:
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)
        self._close_takeover()
        if self.takeover is not None:
            self.takeover.finish()
        pidfile = self.runtime.config.pidfile
        if pidfile and not self.keep_pidfile:
            with contextlib.suppress(OSError):
                os.unlink(pidfile)
        log.info("pgtarn stopped")
