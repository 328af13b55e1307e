"""Command line: PgBouncer's flags (-q -v -V -d), subcommands (demo, check, top, container).

A plain command line (flags each on their own, the configuration file) is read by
quick_options; argparse reads any other (--help, a mistake, an abbreviation, combined
flags) and is imported only then, so a pooler started the usual way does not hold it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..app import App
from ..config.inifile import load_config
from ..errors import ConfigError
from ..native.buildinfo import version_lines
from ..process import signals
from ..workers.setup import WorkerSetup

if TYPE_CHECKING:
    import argparse

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is not built for this platform
    uvloop = None  # type: ignore[assignment]


@dataclass
class Options:
    """What the command line asks for (build_parser's options, by the same names)."""

    config: str | None = None
    quiet: bool = False
    verbose: int = 0
    version: bool = False
    daemon: bool = False
    reboot: bool = False
    user: str = ""
    worker: str | None = None
    listen_fds: str = ""
    unix_fd: int | None = None


#: The flags quick_options reads, by their spellings (build_parser has the same).
_SWITCHES = {
    **dict.fromkeys(("-q", "--quiet"), "quiet"),
    **dict.fromkeys(("-V", "--version"), "version"),
    **dict.fromkeys(("-d", "--daemon"), "daemon"),
    **dict.fromkeys(("-R", "--reboot"), "reboot"),
}
_COUNTS = {"-v": "verbose", "--verbose": "verbose"}
_VALUES = {
    **dict.fromkeys(("-u", "--user"), "user"),
    "--worker": "worker",
    "--listen-fds": "listen_fds",
    "--unix-fd": "unix_fd",
}


def quick_options(argv: Sequence[str]) -> Options | None:
    """The options of a plain command line: each flag on its own (-u USER as two words), at
    most one configuration file. None for any other, which argparse reads (parse_options):
    the result is then the same as argparse's, help and errors included."""
    options = Options()
    words = iter(argv)
    for word in words:
        if word in _SWITCHES:
            setattr(options, _SWITCHES[word], True)
        elif word in _COUNTS:
            options.verbose += 1
        elif word in _VALUES:
            value = next(words, None)
            if value is None or value.startswith("-"):
                return None
            if word == "--unix-fd":
                if not (value.isascii() and value.isdigit()):
                    return None
                options.unix_fd = int(value)
            else:
                setattr(options, _VALUES[word], value)
        elif word.startswith("-") or options.config is not None:
            return None
        else:
            options.config = word
    return options


def parse_options(argv: Sequence[str]) -> Options:
    """The command line's options: quick_options's, else argparse's (which exits with its
    usage on --help or a mistake)."""
    options = quick_options(argv)
    if options is not None:
        return options
    return Options(**vars(build_parser().parse_args(list(argv))))


def load_argparse() -> ModuleType:
    """argparse, imported only for a command line quick_options does not read: argparse and
    what its help formatter imports (shutil, gettext, textwrap) would otherwise sit in the
    memory of every pooler, started as they are with a plain command line."""
    import argparse  # lazy, for the memory (see the docstring)

    return argparse


def load_demo() -> Callable[[list[str]], int]:
    """`pgtarn demo`'s entry, imported only for it: the demo's cluster code and subprocess
    would otherwise sit in every pooler's memory."""
    from ..demo import run_demo  # lazy, for the memory (see the docstring)

    return run_demo


def load_check() -> Callable[[list[str]], int]:
    """`pgtarn check`'s entry, imported only for it: a pooler has no use for its code in
    memory (RSS), small as it is."""
    from .check import run_check  # lazy, for the memory (see the docstring)

    return run_check


def load_top() -> Callable[[list[str]], int]:
    """`pgtarn top`'s entry, imported only for it: rich and psycopg (its `top` extra) would
    otherwise weigh on every pooler's memory, or fail where they are not installed."""
    from ..top import run_top  # lazy, for the memory (see the docstring)

    return run_top


def load_container() -> Callable[[list[str]], int]:
    """`pgtarn container`'s entry (the image's ENTRYPOINT), imported only for it: URL parsing
    and the config generation would otherwise sit in every pooler's memory (RSS)."""
    from .container import main as container_main  # lazy, for the memory (see the docstring)

    return container_main


def load_supervisor() -> Callable[..., Any]:
    """The Supervisor of workers = N, imported only then: the control channel and process
    code (with json and subprocess) are memory that one process does not need."""
    from ..process.supervisor import Supervisor  # lazy, for the memory (see the docstring)

    return Supervisor


def build_parser() -> argparse.ArgumentParser:
    ap = load_argparse()
    parser: argparse.ArgumentParser = ap.ArgumentParser(
        prog="pgtarn",
        description="PostgreSQL connection pooler that reads pgbouncer.ini. "
        "`pgtarn demo` starts a throwaway PostgreSQL with pgtarn in front of it; "
        "`pgtarn check CONFIG` checks a configuration without starting; "
        "`pgtarn top [CONNINFO]` shows a running pooler live.",
    )
    parser.add_argument("config", nargs="?", help="pgbouncer.ini-format configuration file")
    parser.add_argument("-q", "--quiet", action="store_true", help="no logging to stderr")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("-V", "--version", action="store_true", help="print version and exit")
    parser.add_argument(
        "-d",
        "--daemon",
        action="store_true",
        help="run in the background (needs pidfile and logfile)",
    )
    parser.add_argument(
        "-R",
        "--reboot",
        action="store_true",
        help="take over from the pgtarn running on the same port: its "
        "listening sockets and idle clients (rolling restart)",
    )
    parser.add_argument(
        "-u", "--user", default="", help="become this user once the sockets are bound (as `user =`)"
    )
    # given by the supervisor to its workers (workers = N), not by people
    parser.add_argument("--worker", help=ap.SUPPRESS)
    parser.add_argument("--listen-fds", default="", help=ap.SUPPRESS)
    parser.add_argument("--unix-fd", type=int, help=ap.SUPPRESS)
    return parser


def worker_setup(args: Options) -> WorkerSetup | None:
    """--worker INDEX/COUNT/CONTROL_FD and its descriptors, as the supervisor passes them."""
    if not args.worker:
        return None
    index, count, control = (int(part) for part in args.worker.split("/"))
    listen = tuple(int(fd) for fd in args.listen_fds.split(",") if fd)
    return WorkerSetup(index, count, control, listen, args.unix_fd)


def daemonize() -> None:
    """Detach from the terminal: fork twice, new session, stdio to /dev/null."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list and args_list[0] == "demo":
        return load_demo()(args_list[1:])
    if args_list and args_list[0] == "check":
        return load_check()(args_list[1:])
    if args_list and args_list[0] == "top":
        return load_top()(args_list[1:])
    if args_list and args_list[0] == "container":
        return load_container()(args_list[1:])
    args = parse_options(args_list)
    if args.version:
        print("\n".join(version_lines(sys.stdout.isatty())))
        return 0
    if not args.config:
        build_parser().print_usage(sys.stderr)
        print("pgtarn: error: a configuration file is required (or: pgtarn demo)", file=sys.stderr)
        return 2
    path = args.config
    try:
        config = load_config(path)
    except (ConfigError, OSError) as exc:
        print(f"pgtarn: {exc}", file=sys.stderr)
        return 1
    if args.daemon:
        if not config.pidfile:
            print("pgtarn: -d needs pidfile in the configuration", file=sys.stderr)
            return 1
        daemonize()
    runner: object = asyncio.run if uvloop is None else uvloop.run
    worker = worker_setup(args)
    quiet = args.quiet or args.daemon

    def make_app(setup: WorkerSetup | None) -> App:
        return App(
            path,
            verbose=args.verbose,
            quiet=quiet,
            worker=setup,
            reboot=args.reboot,
            user=args.user,
        )

    def worker_entry(setup: WorkerSetup) -> int:
        """A worker forked from the supervisor (workers/forked.py) runs its App here."""
        return serve(runner, make_app(setup))

    app: Any
    if worker is None and config.workers > 1:
        app = load_supervisor()(
            path,
            verbose=args.verbose,
            quiet=quiet,
            reboot=args.reboot,
            user=args.user,
            worker_entry=worker_entry,
        )
    else:
        app = make_app(worker)
    return serve(runner, app)


def serve(runner: object, app: Any) -> int:
    """Run app (an App or the Supervisor) on runner's event loop to its exit code; its
    signals held until its handlers take them (it releases them then)."""
    signals.hold()
    try:
        return runner(app.run())  # type: ignore[operator, no-any-return]
    except (ConfigError, OSError) as exc:
        print(f"pgtarn: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        signals.release()
