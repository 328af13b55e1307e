"""The admin console of workers = N: SHOW and control commands on every worker, one answer.

The worker a console client is connected to asks every worker (itself too, through the
supervisor's ``gather``) for its rows or to run the command, and answers with the merged table
(admin/merge.py) or the combined outcome (:func:`combine`). SHUTDOWN goes to the supervisor,
which stops every worker as the matching signal would; RELOAD and SET also reach the
supervisor's own configuration. In a single process (no coordinator) nothing here runs.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from ..runtime import Coordinator, Runtime
from . import commands
from .merge import MERGED, merge
from .result import AdminError, Outcome, Result, notice
from .show import SHOW_TABLES
from .tables import Table

SHOW_KIND = "admin_show"
COMMAND_KIND = "admin_command"
#: The supervisor's kinds (workers/admin.py answers them; a single process does not import
#: the workers package, so they are spelled here too, and a unit test holds them equal).
SHUTDOWN_KIND = "admin_shutdown"
RELOAD_KIND = "admin_reload"
SET_KIND = "admin_set"
#: How long SHOW and quick commands wait for the other workers; PAUSE, WAIT_CLOSE and the
#: others wait as long as transactions take (the console waits with them, as alone).
ANSWER_TIMEOUT = 5.0
WAIT_TIMEOUT = 24 * 3600.0
WAITING = frozenset({"pause", "wait_close"})
SHUTDOWN_MODES = {None: "now", "wait_for_servers": "servers", "wait_for_clients": "clients"}

Message = dict[str, Any]


def register(runtime: Runtime, coordinator: Coordinator) -> None:
    """This worker answers the other workers' SHOW and command requests."""
    coordinator.handle(SHOW_KIND, lambda message, _fds: show_here(runtime, message))
    coordinator.handle(COMMAND_KIND, lambda message, _fds: command_here(runtime, message))


# --- in each worker ----------------------------------------------------------------------------


def show_here(runtime: Runtime, message: Message) -> Message:
    """This worker's rows of a gathered SHOW table."""
    what = message.get("what")
    builder = SHOW_TABLES.get(what) if isinstance(what, str) and what in MERGED else None
    if builder is None:
        return {"error": f"not a gathered table: {what!r}"}
    table = builder(runtime)
    return {"columns": [list(c) for c in table.columns], "rows": table.rows}


def _reply(result: Result) -> Message:
    return {"tag": result.tag, "notices": [n.decode("latin-1") for n in result.notices]}


def _failed(error: AdminError) -> Message:
    return {"error": error.message, "sqlstate": error.sqlstate}


def command_here(runtime: Runtime, message: Message) -> Message | Awaitable[Message]:
    """Run a control command in this worker; its outcome as a reply (awaitable for the
    commands that wait)."""
    word, arg = str(message.get("word")), message.get("arg")
    try:
        if word == "set":
            outcome: Outcome = commands.set_setting(
                runtime, str(message.get("key")), str(message.get("value"))
            )
        else:
            handler = commands.COMMANDS.get(word)
            if handler is None or word == "shutdown":
                raise AdminError(f"not a command for every worker: {word}")
            outcome = handler(runtime, arg if isinstance(arg, str) else None)
    except AdminError as error:
        return _failed(error)
    if outcome is None:
        return {"tag": ""}
    if isinstance(outcome, Result):
        return _reply(outcome)
    waiting = outcome

    async def wait() -> Message:
        try:
            return _reply(await waiting)
        except AdminError as error:
            return _failed(error)

    return wait()


# --- in the worker of the console client -------------------------------------------------------


def local_view(runtime: Runtime, coordinator: Coordinator, what: str) -> Table:
    """This worker's table in the merged table's shape (its columns, for Describe)."""
    return merge(what, [(coordinator.index, SHOW_TABLES[what](runtime))])


async def show(runtime: Runtime, coordinator: Coordinator, what: str) -> Result:
    """SHOW <what> of the whole pgtarn (a worker that does not answer in time is left out)."""
    replies = await coordinator.gather({"kind": SHOW_KIND, "what": what}, ANSWER_TIMEOUT)
    tables = [
        (int(r["worker"]), Table([(str(n), int(t)) for n, t in r["columns"]], r["rows"]))
        for r in replies
        if "columns" in r and isinstance(r.get("worker"), int)
    ]
    if not tables:
        tables = [(coordinator.index, SHOW_TABLES[what](runtime))]
    return Result("SHOW", merge(what, tables))


def combine(replies: list[Message], count: int) -> Result:
    """The answer to a command every worker ran: an error when all failed (the first
    worker's); otherwise the first success, with a notice for each worker that failed or did
    not answer."""
    done = [r for r in replies if "error" not in r]
    failed = [r for r in replies if "error" in r]
    if not done:
        if not failed:
            raise AdminError("no worker answered")
        raise AdminError(str(failed[0]["error"]), sqlstate=str(failed[0].get("sqlstate")))
    notices: list[bytes] = []
    for reply in done:
        for text in reply.get("notices", []):
            encoded = str(text).encode("latin-1")
            if encoded not in notices:
                notices.append(encoded)
    for reply in failed:
        notices.append(notice(f"worker {reply.get('worker')}: {reply['error']}"))
    answered = {r.get("worker") for r in replies}
    for index in range(count):
        if index not in answered:
            notices.append(notice(f"worker {index} did not answer"))
    return Result(str(done[0].get("tag", "")), notices=notices)


async def _everywhere(coordinator: Coordinator, message: Message, timeout: float) -> Result:
    replies = await coordinator.gather({"kind": COMMAND_KIND, **message}, timeout)
    return combine(replies, coordinator.count)


def command(runtime: Runtime, coordinator: Coordinator, word: str, arg: str | None) -> Outcome:
    """A control command for every worker (the console has checked the access)."""
    if word == "shutdown":
        mode = SHUTDOWN_MODES.get(arg.lower() if arg is not None else None)
        if mode is None:
            raise AdminError(f"invalid command 'SHUTDOWN {arg}', use SHOW HELP;")
        coordinator.send({"kind": SHUTDOWN_KIND, "mode": mode})
        return None if mode == "now" else Result("SHUTDOWN")
    if word not in commands.COMMANDS:
        raise AdminError(f"invalid command '{word}', use SHOW HELP;")
    if word == "reload":
        if arg is not None:
            raise AdminError("RELOAD takes no argument")
        coordinator.send({"kind": RELOAD_KIND})
    timeout = WAIT_TIMEOUT if word in WAITING else ANSWER_TIMEOUT
    return _everywhere(coordinator, {"word": word, "arg": arg}, timeout)


def set_setting(coordinator: Coordinator, key: str, value: str) -> Outcome:
    """SET key = value in every worker, and in the supervisor's configuration."""
    coordinator.send({"kind": SET_KIND, "key": key, "value": value})
    return _everywhere(coordinator, {"word": "set", "key": key, "value": value}, ANSWER_TIMEOUT)
