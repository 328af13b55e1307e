"""The shapes of the settings' descriptions: one setting, one key of a section line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SettingDoc:
    """What one `[pgbouncer]` setting does, in pgtarn's words.

    `differs` says how PgBouncer's setting of the same name behaves otherwise ("" when it
    means the same); pgtarn's own settings (config.Setting.pgtarn_only) leave it empty.
    """

    section: str
    text: str
    differs: str = ""


@dataclass(frozen=True)
class KeyDoc:
    """One key of a `[databases]`, `[users]` or `[peers]` line: its type and default as text
    (the parser holds them as code, not data), what it does, and how PgBouncer differs."""

    kind: str
    default: str
    text: str
    differs: str = ""
    pgtarn_only: bool = False
