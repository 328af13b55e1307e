"""What the supervisor does for the admin console's SHUTDOWN and SET (workers = N)."""

from __future__ import annotations

import signal

from pgtarn.config.settings import Config
from pgtarn.workers import admin


def test_the_supervisor_stops_on_the_signal_of_the_shutdown_mode() -> None:
    assert admin.shutdown_signal({"mode": "now"}) == signal.SIGQUIT
    assert admin.shutdown_signal({"mode": "servers"}) == signal.SIGINT
    assert admin.shutdown_signal({"mode": "clients"}) == signal.SIGTERM


def test_the_supervisor_takes_a_changeable_setting_only() -> None:
    config = Config.default()
    changed = admin.with_setting(config, {"key": "log_connections", "value": "0"})
    assert changed.log_connections is False
    assert admin.with_setting(config, {"key": "workers", "value": "3"}) is config
    assert admin.with_setting(config, {"key": "nonsense", "value": "3"}) is config
    assert admin.with_setting(config, {"key": "default_pool_size", "value": "x"}) is config
