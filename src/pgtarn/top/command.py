"""`pgtarn top [--once] [--interval S] [--metrics URL|PORT] [CONNINFO]`: the loop that reads
the admin console every interval, the keys in between, and draws the frame."""

from __future__ import annotations

import sys
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict
from rich.console import Console
from rich.live import Live

from .keys import KeyReader
from .model import Controls, Sample, View, build_view, database_names
from .options import ONCE_GAP, build_parser
from .screen import frame
from .source import AdminSource


def describe_target(conninfo: str) -> str:
    """user@host:port of a connection string, without its password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "?"
    host = parts.get("host") or "localhost"
    return f"{parts.get('user', '')}@{host}:{parts.get('port', 5432)}"


def _view(before: Sample | None, after: Sample | None, controls: Controls) -> View | None:
    return None if after is None else build_view(before, after, controls)


def run_once(source: AdminSource, target: str) -> int:
    try:
        first = source.sample()
        time.sleep(ONCE_GAP)
        second = source.sample()
    except (psycopg.Error, OSError) as exc:
        print(f"pgtarn top: {exc}", file=sys.stderr)
        return 1
    controls = Controls()
    Console().print(
        frame(build_view(first, second, controls), controls, target, ONCE_GAP, interactive=False)
    )
    return 0


def run_live(source: AdminSource, target: str, interval: float) -> int:
    controls = Controls()
    before: Sample | None = None
    after: Sample | None = None
    error: str | None = None
    next_sample = time.monotonic()
    with KeyReader() as keys, Live(console=Console(), screen=True, auto_refresh=False) as live:
        while not controls.quit:
            if time.monotonic() >= next_sample:
                try:
                    before, after, error = after, source.sample(), None
                except (psycopg.Error, OSError) as exc:
                    error = str(exc).strip() or type(exc).__name__
                next_sample = time.monotonic() + interval
            live.update(
                frame(_view(before, after, controls), controls, target, interval, error),
                refresh=True,
            )
            for key in keys.read(next_sample - time.monotonic()):
                controls.press(key, database_names(after))
    return 0


def run_top(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        print("pgtarn top: --interval must be more than 0", file=sys.stderr)
        return 2
    source = AdminSource(args.conninfo, args.metrics)
    target = describe_target(args.conninfo)
    try:
        if args.once:
            return run_once(source, target)
        return run_live(source, target, args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        source.close()
