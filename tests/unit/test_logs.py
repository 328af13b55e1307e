"""Unit tests for the log formats: the date and time formatted once per second."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from pgtarn.logs import DATE_FORMAT, TEXT_FORMAT, JsonFormatter, TextFormatter

# about the ends of a second, and the same second again after another one
_TIMES = [1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.0, 1_700_000_001.5,
          1_700_000_000.25, 1_700_003_600.75]


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("pgtarn", logging.WARNING, __file__, 1, "C-%d: %s", (3, "x"),
                               None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_text_formatter_formats_as_the_standard_one() -> None:
    fmt = TEXT_FORMAT.format(pid=42)
    ours, standard = TextFormatter(fmt), logging.Formatter(fmt, DATE_FORMAT)
    for created in _TIMES:
        assert ours.format(_record(created)) == standard.format(_record(created))


@pytest.mark.parametrize("created", _TIMES)
def test_json_formatter_time_and_pid(created: float) -> None:
    formatter = JsonFormatter()
    for at in _TIMES:  # each second's stamp is kept: the others come first
        formatter.format(_record(at))
    entry = json.loads(formatter.format(_record(created)))
    local = time.localtime(created)
    assert entry["time"] == (time.strftime("%Y-%m-%dT%H:%M:%S", local)
                             + f".{int((created % 1) * 1000):03d}" + time.strftime("%z", local))
    assert entry["pid"] == os.getpid()
    assert entry["message"] == "C-3: x"
