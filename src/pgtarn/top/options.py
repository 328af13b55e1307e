"""`pgtarn top`'s command line, apart from the code that needs rich and psycopg (the man page
reads it where they are not installed)."""

from __future__ import annotations

import argparse

DEFAULT_CONNINFO = "host=/tmp port=6432 dbname=pgbouncer user=pgbouncer"
#: --once: seconds between its two samples (rates need two).
ONCE_GAP = 0.5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgtarn top",
        description="A live view of a pgtarn or any PgBouncer, read from its admin console.",
    )
    parser.add_argument(
        "conninfo",
        nargs="?",
        default=DEFAULT_CONNINFO,
        help=f"libpq connection string of the admin console (default: {DEFAULT_CONNINFO!r})",
    )
    parser.add_argument(
        "--once", action="store_true", help=f"print one frame and exit (rates over {ONCE_GAP} s)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default 1)",
    )
    parser.add_argument(
        "--metrics",
        metavar="URL|PORT",
        help="pgtarn's Prometheus endpoint (its metrics_port), for the p99 "
        "transaction time; without it p99 shows '-'",
    )
    return parser
