"""Where log lines go (logfile, stderr, syslog) and how they look (text or JSON).

Every line about a connection names it with its repr: ``C-12(user@addr/database)`` for a
client, ``S-7(database/user@addr)`` for a server. Nothing logs passwords, SCRAM secrets or
query parameters: connections log names and reasons, never message bodies.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .config import Config

TEXT_FORMAT = "%(asctime)s.%(msecs)03d [{pid}] %(levelname)s %(message)s"
SYSLOG_FORMAT = "{ident}[{pid}]: %(levelname)s %(message)s"
SYSLOG_SOCKETS = ("/dev/log", "/var/run/syslog")


def load_json() -> Callable[..., str]:
    """json.dumps, imported only for log_format = json: json costs about 0.2 MB of RSS."""
    import json  # lazy, for the RSS above (see the docstring)

    return json.dumps


def load_syslog() -> type[Any]:
    """logging.handlers.SysLogHandler, imported only with syslog on: logging.handlers (with
    the pickle and queue modules it pulls in) costs about 0.5 MB of RSS."""
    import logging.handlers  # lazy, for the RSS above (see the docstring)

    return logging.handlers.SysLogHandler


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, pid, level, logger, message."""

    def __init__(self) -> None:
        super().__init__()
        self.dumps = load_json()

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
            + f".{int(record.msecs):03d}" + time.strftime("%z", time.localtime(record.created)),
            "pid": record.process,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return self.dumps(entry, ensure_ascii=False)


def _syslog_handler(config: Config) -> logging.Handler | None:
    handler_class = load_syslog()
    facility = handler_class.facility_names.get(config.syslog_facility.lower())
    if facility is None:
        facility = handler_class.LOG_DAEMON
    for path in SYSLOG_SOCKETS:
        if os.path.exists(path):
            try:
                handler: logging.Handler = handler_class(address=path, facility=facility)
                return handler
            except OSError:
                continue
    return None


def setup_logging(config: Config, verbose: int, quiet: bool) -> None:
    """Log to logfile when set, to stderr unless quiet, and to syslog when enabled.

    The new destinations are opened first: when the logfile cannot be opened, OSError is
    raised and the old ones stay in place.
    """
    root = logging.getLogger("pgtarn")
    pid = os.getpid()
    formatter: logging.Formatter
    if config.log_format == "json":
        formatter = JsonFormatter()
    else:
        formatter = logging.Formatter(TEXT_FORMAT.format(pid=pid), "%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = []
    if config.logfile:
        handlers.append(logging.FileHandler(config.logfile))
    if not quiet:
        handlers.append(logging.StreamHandler(sys.stderr))
    for handler in handlers:
        handler.setFormatter(formatter)
    syslog = None
    if config.syslog:
        syslog = _syslog_handler(config)
        if syslog is not None:
            syslog.setFormatter(
                formatter if config.log_format == "json"
                else logging.Formatter(SYSLOG_FORMAT.format(ident=config.syslog_ident, pid=pid))
            )
            handlers.append(syslog)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    level = verbose + config.verbose
    root.setLevel(logging.DEBUG if level > 0 else logging.INFO)
    root.propagate = False
    if config.syslog and syslog is None:
        root.warning("syslog: no syslog socket found; logging to the other destinations only")
