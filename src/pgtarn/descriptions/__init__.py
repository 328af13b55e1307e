"""What each setting, section key, admin command and SHOW column means, as data.

Plain data in pgtarn's own words, importing nothing of pgtarn's: the reference pages are
generated from it (``pgtarn.reference``), and any part of pgtarn may show it.
"""

from __future__ import annotations

from . import connections, settings
from .doc import KeyDoc, SettingDoc
from .entries import DATABASE_KEYS, PEER_KEYS, USER_KEYS

#: Every [pgbouncer] setting's description, by name.
SETTINGS: dict[str, SettingDoc] = {**settings.DOCS, **connections.DOCS}

__all__ = ["DATABASE_KEYS", "PEER_KEYS", "SETTINGS", "USER_KEYS", "KeyDoc", "SettingDoc"]
