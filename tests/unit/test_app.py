"""The loop's exception handler App installs: a lookup ended after the loop closed is quiet."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pgtarn.app import closed_loop_quiet


def test_a_closed_loops_late_resolution_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        closed_loop_quiet(loop, {"message": "x", "exception": RuntimeError("Event loop is closed")})
    assert caplog.records == []


def test_any_other_exception_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            closed_loop_quiet(
                loop, {"message": "boom", "exception": RuntimeError("Event loop is closed")}
            )
            closed_loop_quiet(loop, {"message": "bad", "exception": ValueError("bad")})
    finally:
        loop.close()
    assert [r.getMessage() for r in caplog.records] == ["boom", "bad"]
