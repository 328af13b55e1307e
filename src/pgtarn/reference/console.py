"""The admin console reference page, from the console's own tables, commands and merge rules."""

from __future__ import annotations

from ..admin.commands import COMMANDS
from ..admin.console import FAKE_PARAMETERS
from ..admin.merge import MERGED, concatenate
from ..admin.show import SHOW_TABLES
from ..admin.tables import INT4, INT8, NUMERIC, TEXT
from ..config.settings import Config
from ..descriptions import console as described
from ..runtime import Runtime
from .markdown import GENERATED, cell

TYPES = {TEXT: "text", INT4: "int4", INT8: "int8", NUMERIC: "numeric"}

INTRO = """\
# Admin console reference

{generated}

The admin console is the virtual database `pgbouncer` (also reachable as `pgtarn`): connect
to it with psql or any driver, as a user of `admin_users` (every command) or `stats_users`
(SHOW only). Over the unix socket, the system user running pgtarn may log in as `pgbouncer`
without a password. It speaks the simple query protocol and the extended one without
parameters. Column names, order and types are PgBouncer's, with pgtarn's own columns at the
end; an error is ERROR 08P01 and the session goes on, and a command a user may not run is
ERROR 42501 "admin access needed".

With `workers` above 1, the console of any worker shows and controls the whole pgtarn: each
table says how the workers' rows are combined, and commands run in every worker.
"""


def columns_of(show: str) -> list[tuple[str, int]]:
    """A SHOW's columns, as its table builder makes them (on an empty runtime)."""
    return SHOW_TABLES[show](Runtime(Config.default(), {})).columns


def who_may_show(show: str) -> str:
    if show in described.ADMIN_ONLY_SHOWS:
        return "`admin_users`"
    return "`admin_users` and `stats_users`"


def _workers(show: str) -> str:
    rule = MERGED.get(show)
    if rule is None:
        return "the same in every worker: one worker answers"
    if rule is concatenate:
        return "every worker's rows, with a `worker` column added at the end"
    return "one row per key, the workers' numbers combined"


def _show(show: str) -> list[str]:
    doc = described.SHOWS[show]
    origin = "pgtarn's own" if doc.pgtarn_only else "PgBouncer's"
    if doc.extra:
        origin += ", with pgtarn's " + ", ".join(f"`{c}`" for c in doc.extra) + " at the end"
    lines = [
        f"### SHOW {show.upper()}",
        "",
        doc.text,
        "",
        f"- **Who**: {who_may_show(show)}",
        f"- **Origin**: {origin}",
        f"- **With workers**: {_workers(show)}",
        "",
        "| Column | Type | Meaning |",
        "|---|---|---|",
    ]
    meanings = described.COLUMNS[show]
    for name, oid in columns_of(show):
        lines.append(f"| `{name}` | {TYPES[oid]} | {cell(meanings[name])} |")
    return [*lines, ""]


def _commands() -> list[str]:
    lines = [
        "## Commands",
        "",
        "Only `admin_users` may run them. A database named `[db]` is optional: without "
        "it the command acts on every database.",
        "",
    ]
    for name, doc in described.COMMANDS.items():
        lines += [f"### {name.upper()}", "", f"`{doc.syntax}`", "", doc.text, ""]
        origin = "pgtarn's own" if doc.pgtarn_only else "PgBouncer's"
        if doc.differs:
            origin += f", with a difference: {doc.differs}"
        lines += [f"- **Origin**: {origin}", ""]
    return lines


def _missing() -> list[str]:
    lines = [
        "## Not in pgtarn",
        "",
        "PgBouncer's SHOW commands that pgtarn does not have (they answer `invalid command`):",
        "",
    ]
    lines += [f"- `SHOW {name.upper()}`: {why}." for name, why in described.MISSING_SHOWS.items()]
    return [*lines, ""]


def render() -> str:
    """The whole page."""
    lines = [
        INTRO.format(generated=GENERATED),
        "## SHOW commands",
        "",
        "`SHOW HELP` lists the commands. `SELECT` may stand for `SHOW`. "
        "For drivers that ask, `SHOW` of "
        + ", ".join(f"`{p}`" for p in FAKE_PARAMETERS)
        + " answers a fixed value, and `SET` of them is accepted and ignored.",
        "",
    ]
    for show in SHOW_TABLES:
        lines += _show(show)
    lines += _commands()
    lines += _missing()
    return "\n".join(lines).rstrip("\n") + "\n"


def documented_commands() -> set[str]:
    """The commands the page describes (every console command and SET)."""
    return set(described.COMMANDS)


def console_commands() -> set[str]:
    """The commands the console runs: its command table and SET."""
    return {*COMMANDS, "set"}
