"""Tests for pgtarn.process.privileges: `user =` becomes that user, or says why it cannot."""

from __future__ import annotations

import os
import pwd

import pytest

from pgtarn.errors import ConfigError
from pgtarn.process.privileges import drop_privileges


def test_no_user_and_the_current_user_change_nothing() -> None:
    drop_privileges("")
    drop_privileges(pwd.getpwuid(os.geteuid()).pw_name)


def test_an_unknown_user_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="no such user"):
        drop_privileges("no-such-user-here")


def test_only_root_may_become_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    other = next(entry for entry in pwd.getpwall() if entry.pw_uid != os.geteuid())
    monkeypatch.setattr(os, "geteuid", lambda: 12345 if other.pw_uid != 12345 else 12346)
    with pytest.raises(ConfigError, match="only root can become another user"):
        drop_privileges(other.pw_name)
