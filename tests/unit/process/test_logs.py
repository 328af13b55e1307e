"""Unit tests for the log formats: the date and time formatted once per second."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import pytest

from pgtarn.process.logs import DATE_FORMAT, TEXT_FORMAT, JsonFormatter, TextFormatter

# about the ends of a second, and the same second again after another one
_TIMES = [
    1_700_000_000.0,
    1_700_000_000.999,
    1_700_000_001.0,
    1_700_000_001.5,
    1_700_000_000.25,
    1_700_003_600.75,
]


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("pgtarn", logging.WARNING, __file__, 1, "C-%d: %s", (3, "x"), None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_text_formatter_formats_as_the_standard_one() -> None:
    ours, standard = TextFormatter(42), logging.Formatter(TEXT_FORMAT.format(pid=42), DATE_FORMAT)
    for created in _TIMES:
        assert ours.format(_record(created)) == standard.format(_record(created))
        mine, theirs = _record(created), _record(created)
        mine.levelno, mine.levelname = theirs.levelno, theirs.levelname = logging.INFO, "INFO"
        mine.msg = theirs.msg = "plain, with %% and {braces}"
        mine.args = theirs.args = ()
        assert ours.format(mine) == standard.format(theirs)
        assert mine.message == theirs.message  # as the standard one leaves it on the record


def test_text_formatter_with_an_exception_and_a_stack() -> None:
    ours, standard = TextFormatter(7), logging.Formatter(TEXT_FORMAT.format(pid=7), DATE_FORMAT)
    try:
        raise ValueError("broken")
    except ValueError:
        info = sys.exc_info()
    for created in _TIMES:
        mine, theirs = _record(created), _record(created)
        mine.exc_info = theirs.exc_info = info
        assert ours.format(mine) == standard.format(theirs)
        assert "ValueError: broken" in ours.format(mine)
        mine, theirs = _record(created), _record(created)
        mine.stack_info = theirs.stack_info = "Stack (most recent call last):\n  here"
        assert ours.format(mine) == standard.format(theirs)


@pytest.mark.parametrize("created", _TIMES)
def test_json_formatter_time_and_pid(created: float) -> None:
    formatter = JsonFormatter()
    for at in _TIMES:  # each second's stamp is kept: the others come first
        formatter.format(_record(at))
    entry = json.loads(formatter.format(_record(created)))
    local = time.localtime(created)
    assert entry["time"] == (
        time.strftime("%Y-%m-%dT%H:%M:%S", local)
        + f".{int((created % 1) * 1000):03d}"
        + time.strftime("%z", local)
    )
    assert entry["pid"] == os.getpid()
    assert entry["message"] == "C-3: x"
