"""`pgtarn top`'s rendering: a model.View as rich tables (one frame)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .model import POOL_COLUMNS, Controls, Row, View

KEYS_HELP = "keys: s/1-7 sort  r reverse  d next database  / filter  q quit"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _address(row: Row) -> str:
    addr, port = row.get("addr") or "", row.get("port")
    return f"{addr}:{port}" if port else str(addr)


def _pools_table(view: View, controls: Controls) -> Table:
    table = Table(title="pools", title_justify="left", expand=False)
    for index, column in enumerate(POOL_COLUMNS):
        mark = ("▲" if controls.reverse else "▼") if index == controls.sort_index else ""
        table.add_column(f"{index + 1}:{column}{mark}", justify="left" if index < 2 else "right")
    for p in view.pools:
        table.add_row(
            p.database,
            p.user,
            str(p.cl_active),
            str(p.cl_waiting),
            str(p.sv_active),
            str(p.sv_idle),
            f"{p.maxwait:.1f}",
            style="bold red" if p.cl_waiting else None,
        )
    return table


def _rates_table(view: View) -> Table:
    table = Table(title="databases", title_justify="left")
    table.add_column("database")
    for name in ("xact/s", "query/s", "avg xact ms", "p99 xact ms"):
        table.add_column(name, justify="right")
    for r in view.rates:
        table.add_row(
            r.database,
            _number(r.tps),
            _number(r.qps),
            _number(r.avg_xact_ms, 2),
            _number(r.p99_xact_ms, 2),
        )
    return table


def _clients_table(title: str, rows: list[Row], pinned: bool) -> Table:
    table = Table(title=title, title_justify="left")
    for name in (
        "database",
        "user",
        "address",
        "state",
        "server",
        "request_time",
        "wait s",
        "application_name",
    ):
        table.add_column(name, justify="right" if name == "wait s" else "left")
    if pinned:
        table.add_column("pinned")
    for row in rows:
        wait = float(row.get("wait") or 0) + float(row.get("wait_us") or 0) / 1e6
        cells = [
            str(row.get("database", "")),
            str(row.get("user", "")),
            _address(row),
            str(row.get("state", "")),
            "yes" if row.get("link") else "no",
            str(row.get("request_time", "")),
            f"{wait:.1f}",
            str(row.get("application_name") or ""),
        ]
        if pinned:
            cells.append(str(row.get("pinned", "")))
        table.add_row(*cells)
    return table


def header(target: str, interval: float, controls: Controls, error: str | None) -> Text:
    shown = controls.filter_text or "all"
    if controls.filter_text and not controls.filter_exact:
        shown = f"*{shown}*"
    text = Text(f"pgtarn top  {target}  every {interval:g} s  databases: {shown}", style="bold")
    if error:
        text.append(f"\nerror: {error}", style="bold red")
    return text


def frame(
    view: View | None,
    controls: Controls,
    target: str,
    interval: float,
    error: str | None = None,
    interactive: bool = True,
) -> RenderableType:
    """The whole screen; `view` None before the first sample; the keys' line only when
    `interactive`."""
    parts: list[RenderableType] = [header(target, interval, controls, error)]
    if view is not None:
        parts += [
            _pools_table(view, controls),
            _rates_table(view),
            _clients_table(
                f"busiest clients ({len(view.busiest)}: waiting, then oldest request)",
                view.busiest,
                view.pinned is not None,
            ),
        ]
        if view.pinned:
            parts.append(_clients_table(f"pinned clients: {len(view.pinned)}", view.pinned, True))
        elif view.pinned is not None:
            parts.append(Text("pinned clients: 0"))
    if not interactive:
        pass
    elif controls.prompt is not None:
        parts.append(Text(f"database filter (Enter applies, Esc cancels): {controls.prompt}_"))
    else:
        parts.append(Text(KEYS_HELP, style="dim"))
    return Group(*parts)
