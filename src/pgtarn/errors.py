"""Error types: those that carry the SQLSTATE a client is sent, and the configuration's."""

from __future__ import annotations


class PgtarnError(Exception):
    """An error reported to a client as an ErrorResponse."""

    sqlstate = "08P01"
    severity = "FATAL"

    def __init__(self, message: str, sqlstate: str | None = None, severity: str | None = None):
        super().__init__(message)
        self.message = message
        if sqlstate is not None:
            self.sqlstate = sqlstate
        if severity is not None:
            self.severity = severity


class ProtocolViolation(PgtarnError):
    """The peer sent bytes that break the protocol."""

    sqlstate = "08P01"


class TlsFailed(PgtarnError):
    """TLS to a server could not be set up (refused, or its certificate not accepted)."""

    sqlstate = "08006"


class LoginRefused(PgtarnError):
    """PostgreSQL refused pgtarn's login with an ErrorResponse: its SQLSTATE and its own
    message, which the clients waiting for that server are given as they are."""


class AuthFailed(PgtarnError):
    """Authentication of a client failed."""

    sqlstate = "28P01"


class ConfigError(Exception):
    """The configuration is invalid; the message names file, line and key."""


class Problems:
    """Where a configuration reader sends what it finds wrong: raised at once (startup,
    RELOAD: the first error stops them), or all kept, in order (`pgtarn check`)."""

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.errors: list[str] = []

    def add(self, error: ConfigError) -> None:
        if not self.collect:
            raise error
        self.errors.append(str(error))
