"""What an admin command answers: a Result (notices, a table, a tag) or an AdminError."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field

from ..errors import PgtarnError
from ..proto import build
from .tables import Table


class AdminError(PgtarnError):
    """A command failed; the session goes on (severity ERROR)."""

    sqlstate = "08P01"
    severity = "ERROR"


@dataclass
class Result:
    """What a command answers: notices first, then an optional table, then its tag."""

    tag: str
    table: Table | None = None
    notices: list[bytes] = field(default_factory=list)


Outcome = Result | Awaitable[Result] | None  # None: no answer (SHUTDOWN)


def notice(message: str, detail: str | None = None) -> bytes:
    return build.error_response("00000", message, "NOTICE", detail, notice=True)
