"""README.md stays a short way in: its links lead somewhere, its configuration is the tested
example's, and its test command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The issue's bound (#47): the rest belongs in docs/.
MAX_LINES = 200


def _blocks(language: str) -> list[list[str]]:
    return [
        block.splitlines()
        for block in re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.M | re.S)
    ]


def _settings(lines: list[str]) -> list[str]:
    """An ini's lines without comments and blank lines."""
    return [line for line in lines if line.strip() and not line.startswith(";")]


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= MAX_LINES, "move the detail into a docs/ page"


def test_every_relative_link_leads_to_a_file() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert len(local) > 20
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def test_its_configuration_is_the_example_that_the_tests_run() -> None:
    """tests/integration/test_examples.py runs examples/ against PostgreSQL."""
    example = (ROOT / "examples" / "pgbouncer.ini").read_text(encoding="utf-8").splitlines()
    assert [_settings(block) for block in _blocks("ini")] == [_settings(example)]
    userlist = (ROOT / "examples" / "userlist.txt").read_text(encoding="utf-8").splitlines()
    assert _settings(userlist) in _blocks("text")


def test_its_test_command_is_the_one_ci_runs() -> None:
    assert "pip install '.[test]' && python3 -m pytest -q" in README
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q --root-user-action=ignore '.[test]'" in ci
    assert "\npython3 -m pytest -q\n" in ci
