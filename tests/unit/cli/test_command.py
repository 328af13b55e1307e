"""cli/command.py: the quick read of a plain command line gives what argparse gives, and
leaves argparse unimported; any other command line goes to argparse."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from pgtarn.cli import command
from pgtarn.cli.command import Options, parse_options, quick_options

SRC = Path(command.__file__).resolve().parents[2]

PLAIN = [
    [],
    ["pgbouncer.ini"],
    ["-d", "pgbouncer.ini"],
    ["pgbouncer.ini", "-q", "-v", "-v"],
    ["-R", "-u", "postgres", "/etc/pgtarn/pgbouncer.ini"],
    ["--quiet", "--verbose", "--daemon", "--reboot", "--user", "bob", "x.ini"],
    ["-V"],
    ["--version", "-u", "a", "-u", "b"],
    ["-q", "-q", "x.ini"],
    # a worker started by the supervisor (process/supervisor.py)
    ["--worker", "1/2/5", "--listen-fds", "3,4", "--unix-fd", "6", "x.ini"],
    ["--worker", "0/3/7", "x.ini"],
]

OTHER = [
    ["-vv", "x.ini"],
    ["-qd", "x.ini"],
    ["--user=bob", "x.ini"],
    ["-ubob", "x.ini"],
    ["--verb", "x.ini"],
    ["a.ini", "b.ini"],
    ["--", "x.ini"],
    ["-u"],
    ["-u", "-q", "x.ini"],
    ["--unix-fd", "+3", "x.ini"],
    ["--unix-fd", "\u00b2", "x.ini"],  # a digit to str.isdigit, not to int()
    ["--no-such-flag"],
]


def by_argparse(argv: list[str]) -> Options:
    return Options(**vars(command.build_parser().parse_args(argv)))


@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_a_plain_command_line_is_read_as_argparse_reads_it(argv: list[str]) -> None:
    quick = quick_options(argv)
    assert quick is not None
    assert asdict(quick) == asdict(by_argparse(argv))


@pytest.mark.parametrize("argv", OTHER, ids=" ".join)
def test_any_other_command_line_goes_to_argparse(argv: list[str]) -> None:
    assert quick_options(argv) is None


def test_argparse_reads_what_the_quick_read_leaves() -> None:
    assert parse_options(["-vv", "--user=bob", "x.ini"]) == Options(
        config="x.ini", verbose=2, user="bob"
    )


def test_help_and_mistakes_are_argparse_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exits:
        parse_options(["--help"])
    assert exits.value.code == 0
    assert "pgbouncer.ini-format configuration file" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exits:
        parse_options(["a.ini", "b.ini"])
    assert exits.value.code == 2
    assert "unrecognized arguments: b.ini" in capsys.readouterr().err


def test_a_plain_command_line_leaves_argparse_unimported() -> None:
    code = (
        "import sys; before = set(sys.modules); from pgtarn.cli.command import parse_options; "
        "options = parse_options(['-d', '-u', 'bob', 'x.ini']); "
        "print(options.user, 'argparse' in sys.modules and 'argparse' not in before)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["bob", "False"]
