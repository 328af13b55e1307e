"""What the supervisor does for the admin console's SHUTDOWN, RELOAD and SET (workers = N).

The console of the worker that got the command sends one of these kinds to the supervisor
(admin/fanout.py): SHUTDOWN becomes the stop signal of its mode, so that the supervisor stops
every worker and restarts none; RELOAD and SET change the supervisor's own configuration too
(its logging, and what a restarted worker is told).
"""

from __future__ import annotations

import signal
from typing import Any

from ..config.settings import SETTINGS, Config
from ..errors import ConfigError

SHUTDOWN_KIND = "admin_shutdown"
RELOAD_KIND = "admin_reload"
SET_KIND = "admin_set"

#: SHUTDOWN's modes (as App.shutdown names them) -> the signal a worker stops that way on.
SHUTDOWN_SIGNALS = {
    "now": signal.SIGQUIT,
    "servers": signal.SIGINT,
    "clients": signal.SIGTERM,
}


def shutdown_signal(message: dict[str, Any]) -> signal.Signals:
    """The signal the supervisor stops its workers with for a SHUTDOWN message."""
    return SHUTDOWN_SIGNALS.get(str(message.get("mode")), signal.SIGQUIT)


def with_setting(config: Config, message: dict[str, Any]) -> Config:
    """config with a SET message's setting, when it is one that may change; else config."""
    key, value = message.get("key"), message.get("value")
    if not isinstance(key, str) or not isinstance(value, str):
        return config
    setting = SETTINGS.get(key.lower())
    if setting is None or not setting.changeable:
        return config
    try:
        return config.with_setting(key.lower(), value)
    except ConfigError:
        return config
