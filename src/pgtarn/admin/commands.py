"""The admin console's control commands: PAUSE, RESUME, KILL, RELOAD, SET, SHUTDOWN, ...

Each takes the runtime and its optional argument and returns a Result, or an awaitable one
for commands that wait (PAUSE waits until the servers are released; WAIT_CLOSE until the
servers marked by RECONNECT or RELOAD are closed). The janitor-like waits poll every 50 ms.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..config.settings import SETTINGS
from ..errors import ConfigError, PgtarnError
from ..pool.lifetimes import reconnect as reconnect_pool
from ..runtime import Runtime
from ..views.states import ClientState
from .result import AdminError, Outcome, Result, notice
from .tables import ADMIN_DB

log = logging.getLogger("pgtarn.admin")

POLL = 0.05
KILLED = PgtarnError("admin forced disconnect", sqlstate="57P01", severity="FATAL")


def _error(message: str, sqlstate: str = "08P01") -> PgtarnError:
    return AdminError(message, sqlstate=sqlstate)


def _result(tag: str, notices: list[bytes] | None = None) -> Result:
    return Result(tag, notices=notices or [])


def _database(runtime: Runtime, arg: str | None, verb: str, required: bool = False) -> str | None:
    """The database a command names (checked), or None for all."""
    if arg is None:
        if required:
            raise _error("a database is required")
        return None
    if arg in (ADMIN_DB, "pgtarn") and arg not in runtime.config.databases:
        raise _error(f"cannot {verb} admin db: {arg}")
    known = set(runtime.config.databases) | set(runtime.registry.databases)
    if arg not in known or arg == "*":
        raise _error(f"no such database: {arg}")
    return arg


async def _wait_until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(POLL)


def start_pause(runtime: Runtime, arg: str | None) -> str | None:
    """Pause one database (returned) or all (None); servers close as they are released."""
    registry = runtime.registry
    database = _database(runtime, arg, "pause")
    if registry.paused or runtime.suspended:
        raise _error("already suspended/paused")
    if database is not None and database in registry.paused_databases:
        raise _error(f"database {database} is already paused")
    registry.pause(database, close_servers=True)
    log.info("PAUSE %s", database or "all databases")
    return database


def pause(runtime: Runtime, arg: str | None) -> Outcome:
    """Let transactions (or sessions) under way finish, then close the servers; new work
    waits until RESUME. Answers once every server of the scope is closed or idle-closed."""
    registry = runtime.registry
    database = start_pause(runtime, arg)

    def done() -> bool:
        lifted = not (registry.paused if database is None else registry.is_paused(database))
        return lifted or not any(p.busy for p in registry.pools_of(database))

    async def wait() -> Result:
        await _wait_until(done)
        if not (registry.paused if database is None else registry.is_paused(database)):
            raise _error("PAUSE cancelled: resumed before the servers were released")
        return _result("PAUSE")

    return wait()


def resume(runtime: Runtime, arg: str | None) -> Outcome:
    registry = runtime.registry
    if runtime.control is not None and not runtime.accepting:
        raise _error("pooler is shutting down")
    if arg is None:
        if not (registry.paused or runtime.suspended):
            raise _error("pooler is not paused/suspended")
        if runtime.suspended:
            _suspend_reading(runtime, False)
        registry.resume()  # databases paused one by one stay paused
    else:
        database = _database(runtime, arg, "resume")
        assert database is not None
        if database not in registry.paused_databases:
            raise _error(f"database {database} is not paused")
        registry.resume(database)
    log.info("RESUME %s", arg or "all databases")
    return _result("RESUME")


def _suspend_reading(runtime: Runtime, suspend: bool) -> None:
    """SUSPEND: stop reading every client (but admin sessions) and server; RESUME: read again."""
    runtime.suspended = suspend
    transports = [c.transport for c in runtime.clients.values() if c.state is not ClientState.ADMIN]
    transports += [s.transport for s in runtime.servers()]
    for transport in transports:
        if transport is not None and not transport.is_closing():
            if suspend:
                transport.pause_reading()
            else:
                transport.resume_reading()
    for pool in runtime.registry:  # notifications wait in PostgreSQL's queue
        if pool.board is not None:
            pool.board.hold(suspend or pool.paused)


def suspend(runtime: Runtime, arg: str | None) -> Outcome:
    if arg is not None:
        raise _error("SUSPEND takes no argument")
    registry = runtime.registry
    if registry.paused or runtime.suspended:
        raise _error("already suspended/paused")
    if registry.paused_databases:
        raise _error("cannot suspend with paused databases")
    registry.pause()
    _suspend_reading(runtime, True)
    log.info("SUSPEND")
    return _result("SUSPEND")


def kill(runtime: Runtime, arg: str | None) -> Outcome:
    """Drop every client and server (of one database) now; new clients wait for RESUME."""
    registry = runtime.registry
    database = _database(runtime, arg, "kill")
    if registry.paused or runtime.suspended:
        raise _error("already suspended/paused")
    registry.pause(database, close_servers=True)
    for client in list(runtime.clients.values()):
        pool = client.pool
        if pool is not None and (database is None or pool.database == database):
            client.close(KILLED)
    for pool in registry.pools_of(database):
        for server in pool.servers():
            server.close("killed by admin (KILL)")
        # closing a server that was logging in is no sign of a failing database
        pool.failure = None
        pool.failures = 0
    log.info("KILL %s", database or "all databases")
    return _result("KILL")


def kill_client(runtime: Runtime, arg: str | None) -> Outcome:
    if arg is None or not (arg.isascii() and arg.isdigit()):
        raise _error("invalid client pointer supplied")
    wanted = int(arg)
    for client in list(runtime.clients.values()):
        if client.id == wanted:
            log.info("KILL_CLIENT %d: %r", wanted, client)
            client.close(KILLED)
            return _result("KILL_CLIENT")
    raise _error("client not found")


def reconnect(runtime: Runtime, arg: str | None) -> Outcome:
    database = _database(runtime, arg, "reconnect")
    for pool in runtime.registry.pools_of(database):
        reconnect_pool(pool)
    return _result("RECONNECT")


def renew_statements(runtime: Runtime, arg: str | None) -> Outcome:
    """pgtarn's own: the schema changed where pgtarn could not see it (a migration on a
    direct connection): every shared prepared statement is prepared afresh before its next
    use, as after DDL sent through pgtarn. The statements are shared by all databases, so
    naming one (checked) renews them all."""
    _database(runtime, arg, "renew statements of")
    runtime.statement_cache.schema_changed()
    log.info("RENEW_STATEMENTS: generation %d", runtime.statement_cache.generation)
    return _result("RENEW_STATEMENTS")


def wait_close(runtime: Runtime, arg: str | None) -> Outcome:
    database = _database(runtime, arg, "wait in")
    registry = runtime.registry

    def done() -> bool:
        return not any(
            s.close_needed or s.connstr != p.connstr
            for p in registry.pools_of(database)
            for s in p.servers()
        )

    async def wait() -> Result:
        await _wait_until(done)
        return _result("WAIT_CLOSE")

    return wait()


def disable(runtime: Runtime, arg: str | None) -> Outcome:
    database = _database(runtime, arg, "disable", required=True)
    assert database is not None
    runtime.registry.disabled.add(database)
    return _result("DISABLE")


def enable(runtime: Runtime, arg: str | None) -> Outcome:
    database = _database(runtime, arg, "enable", required=True)
    assert database is not None
    runtime.registry.disabled.discard(database)
    return _result("ENABLE")


def reload(runtime: Runtime, arg: str | None) -> Outcome:
    if arg is not None or runtime.control is None:
        raise _error("RELOAD takes no argument")
    report = runtime.control.reload()
    if report.error is not None:
        raise _error("RELOAD failed, see logs for additional details", sqlstate="F0000")
    notices = []
    if report.changed:
        notices.append(notice("settings changed: " + ", ".join(report.changed)))
    if report.rejected:
        notices.append(
            notice(
                "settings not changed (they take effect at restart only): "
                + ", ".join(report.rejected)
            )
        )
    return _result("RELOAD", notices)


def shutdown(runtime: Runtime, arg: str | None) -> Outcome:
    modes = {None: "now", "wait_for_servers": "servers", "wait_for_clients": "clients"}
    mode = modes.get(arg.lower() if arg is not None else None)
    if mode is None or runtime.control is None:
        raise _error(f"invalid command 'SHUTDOWN {arg}', use SHOW HELP;")
    log.info("SHUTDOWN %scommand issued", f"{arg.upper()} " if arg is not None else "")
    runtime.control.shutdown(mode)
    return None if mode == "now" else _result("SHUTDOWN")


def set_setting(runtime: Runtime, key: str, value: str) -> Result:
    """SET key = value: the setting takes effect as RELOAD with that value in the file would
    make it (the same code puts it in force)."""
    name = key.lower()
    setting = SETTINGS.get(name)
    if setting is None:
        raise _error(f"SET failed: unknown setting {key}")
    if not setting.changeable:
        raise _error(f"SET failed: {name} can only change at restart")
    if runtime.control is None:
        raise _error("SET failed: no running configuration to change")
    try:
        config = runtime.config.with_setting(name, value)
    except ConfigError as exc:
        raise _error(f"SET failed: {exc}") from None
    report = runtime.control.apply(config, "SET")
    if report.error is not None:
        raise _error(f"SET failed: {report.error}")
    log.info("SET %s", name)  # the value may be a secret-bearing query: not logged
    return _result(f"SET {name}={value}", [notice(text) for text in report.warnings])


COMMANDS: dict[str, Callable[[Runtime, str | None], Outcome]] = {
    "pause": pause,
    "resume": resume,
    "suspend": suspend,
    "kill": kill,
    "kill_client": kill_client,
    "reconnect": reconnect,
    "renew_statements": renew_statements,
    "wait_close": wait_close,
    "disable": disable,
    "enable": enable,
    "reload": reload,
    "shutdown": shutdown,
}
