"""The admin console of workers = N: commands every worker ran, one answer."""

from __future__ import annotations

import pytest

from pgtarn.admin import fanout
from pgtarn.admin.result import AdminError, notice
from pgtarn.config.settings import Config
from pgtarn.runtime import Runtime
from pgtarn.workers import admin


def test_the_answer_is_the_first_success_with_a_notice_per_failed_or_silent_worker() -> None:
    replies = [
        {"worker": 0, "tag": "PAUSE", "notices": []},
        {"worker": 2, "error": "already suspended/paused", "sqlstate": "08P01"},
    ]
    result = fanout.combine(replies, 3)
    assert result.tag == "PAUSE"
    assert result.notices == [
        notice("worker 2: already suspended/paused"),
        notice("worker 1 did not answer"),
    ]


def test_notices_every_worker_gave_are_given_once() -> None:
    text = notice("settings changed: default_pool_size").decode("latin-1")
    replies = [{"worker": w, "tag": "RELOAD", "notices": [text]} for w in (0, 1)]
    assert fanout.combine(replies, 2).notices == [text.encode("latin-1")]


def test_a_command_every_worker_refused_is_an_error() -> None:
    replies = [{"worker": w, "error": "client not found", "sqlstate": "08P01"} for w in (0, 1)]
    with pytest.raises(AdminError, match="client not found"):
        fanout.combine(replies, 2)
    with pytest.raises(AdminError, match="no worker answered"):
        fanout.combine([], 2)


def test_a_worker_runs_a_command_and_reports_its_error() -> None:
    runtime = Runtime(Config.default(), {})
    assert fanout.command_here(runtime, {"word": "kill_client", "arg": "7"}) == {
        "error": "client not found",
        "sqlstate": "08P01",
    }
    refused = fanout.command_here(runtime, {"word": "shutdown"})
    assert isinstance(refused, dict) and refused["error"].startswith("not a command")
    assert fanout.show_here(runtime, {"what": "config"})["error"].startswith("not a gathered")
    shown = fanout.show_here(runtime, {"what": "pools"})
    assert shown["columns"][0] == ["database", 25] and shown["rows"][0][0] == "pgbouncer"


def test_the_supervisor_kinds_are_spelled_alike() -> None:
    assert (fanout.SHUTDOWN_KIND, fanout.RELOAD_KIND, fanout.SET_KIND) == (
        admin.SHUTDOWN_KIND,
        admin.RELOAD_KIND,
        admin.SET_KIND,
    )
