"""Where log lines go (logfile, stderr, syslog) and how they look (text or JSON).

Every line about a connection begins with its repr, in PgBouncer's layout: ``C-12:
database/user@addr`` for a client, ``S-7: database/user@addr`` for a server, then the message
after a space. Nothing logs passwords, SCRAM secrets or query parameters: connections log
names and reasons, never message bodies.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..config.settings import Config

TEXT_FORMAT = "%(asctime)s.%(msecs)03d [{pid}] %(levelname)s %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
SYSLOG_FORMAT = "{ident}[{pid}]: %(levelname)s %(message)s"
SYSLOG_SOCKETS = ("/dev/log", "/var/run/syslog")


def load_json() -> Callable[..., str]:
    """json.dumps, imported only for log_format = json, so other poolers do not hold it."""
    import json  # lazy, for the memory (see the docstring)

    return json.dumps


def load_syslog() -> type[Any]:
    """logging.handlers.SysLogHandler, imported only with syslog on: logging.handlers (with
    the pickle and queue modules it pulls in) is memory a pooler logging elsewhere need not
    hold."""
    import logging.handlers  # lazy, for the memory (see the docstring)

    return logging.handlers.SysLogHandler


class SecondStamp:
    """A second's date and time in a strftime format, formatted once per second: converting
    the time (time.localtime) and formatting it were a third of a log line's cost."""

    __slots__ = ("_format", "_second", "_stamp")

    def __init__(self, fmt: str) -> None:
        self._format = fmt
        self._second = -1
        self._stamp = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._stamp = time.strftime(self._format, time.localtime(second))
            self._second = second
        return self._stamp


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT for the process pid, its date and time formatted once per second.

    A line without an exception is put together here, in one f-string: the standard
    format() (its usesTime check, the record's attributes as a dict for %-formatting) was
    half of a log line's cost, and a busy pooler logs two lines per login.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(TEXT_FORMAT.format(pid=pid), DATE_FORMAT)
        self._stamp = SecondStamp(DATE_FORMAT)
        self._pid = f" [{pid}] "

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = message = record.getMessage()
        return (
            f"{self._stamp(record.created)}.{int(record.msecs):03d}{self._pid}"
            f"{record.levelname} {message}"
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self._stamp(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, pid, level, logger, message."""

    def __init__(self) -> None:
        super().__init__()
        self.dumps = load_json()
        # the records do not collect it (setup_logging): a process logs with its own pid
        self.pid = os.getpid()
        self._stamp = SecondStamp("%Y-%m-%dT%H:%M:%S")
        self._zone = SecondStamp("%z")

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        entry = {
            "time": f"{self._stamp(created)}.{int(record.msecs):03d}{self._zone(created)}",
            "pid": self.pid,
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
    # What a record would collect and no format here uses: the calling frame (a walk up
    # the stack), the thread, the process (a system call) and the multiprocessing name. The
    # logging HOWTO's "Optimization" section names these switches.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    formatter: logging.Formatter = (
        JsonFormatter() if config.log_format == "json" else TextFormatter(pid)
    )
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
                formatter
                if config.log_format == "json"
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
