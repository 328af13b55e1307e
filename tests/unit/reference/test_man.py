"""contrib/pgtarn.1 is what the code makes now, names every option and setting, and is roff
that groff reads without a warning."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from pgtarn.cli import command as cli
from pgtarn.config.settings import SETTINGS
from pgtarn.descriptions import DATABASE_KEYS, PEER_KEYS, USER_KEYS
from pgtarn.reference import man

PAGE = Path(__file__).resolve().parents[3] / "contrib" / "pgtarn.1"


def test_committed_man_page_is_up_to_date() -> None:
    assert PAGE.exists(), f"{PAGE} missing: run python -m pgtarn.reference"
    assert PAGE.read_text(encoding="utf-8") == man.render(), (
        f"{PAGE} is out of date: run python -m pgtarn.reference and commit the result"
    )


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [
        flag
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for flag in action.option_strings
    ]


def test_every_option_of_every_command_is_on_the_page() -> None:
    page = man.render()
    parsers = {"pgtarn": cli.build_parser(), **man.subcommands()}
    for name, parser in parsers.items():
        flags = _flags(parser)
        assert flags, name
        for flag in flags:
            assert f"\\fB{flag.replace('-', chr(92) + '-')}\\fR" in page, (name, flag)
    for name in man.subcommands():
        assert f".SS\npgtarn {name}\n" in page
    assert "--worker" not in page.replace("\\-", "-")  # the supervisor's, hidden in --help


def test_every_setting_and_section_key_is_on_the_page() -> None:
    page = man.render()
    for name in SETTINGS:
        assert f".TP\n\\fB{name}\\fR (" in page, name
    for section, keys in (("databases", DATABASE_KEYS), ("users", USER_KEYS), ("peers", PEER_KEYS)):
        block = page.split(f".SS\n[{section}] keys\n", 1)[1].split("\n.SS\n", 1)[0]
        for key in keys:
            assert f".TP\n\\fB{key}\\fR (" in block, (section, key)


def test_descriptions_become_roff_without_requests_or_stray_backslashes() -> None:
    assert man.roff("a `tcp_keepcnt` and **bold**") == "a \\fBtcp_keepcnt\\fR and \\fBbold\\fR"
    assert man.roff("`-d` needs it") == "\\fB\\-d\\fR needs it"
    assert man.roff(".s.PGSQL.<port> is its name") == "\\&.s.PGSQL.<port> is its name"
    assert man.roff("a \\ backslash") == "a \\e backslash"


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_groff_reads_the_page_without_a_warning() -> None:
    done = subprocess.run(
        ["groff", "-man", "-ww", "-z"],
        input=man.render(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
