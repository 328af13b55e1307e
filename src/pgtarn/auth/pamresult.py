"""What a PAM check answers (PamResult, PamUnavailable), without loading libpam's binding.

The login code names these at start; the ctypes binding itself (auth/pam.py) is imported
only when a PAM check is made, so a pooler that never checks a password with PAM does not
hold ctypes in its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PamResult", "PamUnavailable"]


class PamUnavailable(Exception):
    """libpam cannot be loaded: the reason, for the log."""


@dataclass(frozen=True)
class PamResult:
    """What PAM said: ok, or why not (pam_strerror's words, for the log, never the client);
    messages: the PAM_ERROR_MSG texts the modules showed."""

    ok: bool
    reason: str = ""
    messages: tuple[str, ...] = ()
