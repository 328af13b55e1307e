"""pam_login: one pool of threads sized by the settings, and what each PAM answer means."""

from __future__ import annotations

import dataclasses

from pgtarn.auth.pam import PamResult, PamUnavailable
from pgtarn.client import pam_login
from pgtarn.config import Config


def test_the_pool_is_kept_until_a_reload_changes_its_sizes() -> None:
    config = dataclasses.replace(Config(), auth_pam_threads=3, auth_pam_queue_size=5)
    calls = pam_login.pam_calls(config)
    assert (calls.threads, calls.queue_size) == (3, 5)
    assert pam_login.pam_calls(dataclasses.replace(config, auth_pam_service="x")) is calls
    bigger = pam_login.pam_calls(dataclasses.replace(config, auth_pam_queue_size=6))
    assert bigger is not calls and bigger.queue_size == 6


def test_verdicts() -> None:
    client = object()
    assert pam_login._verdict(client, PamResult(True)) is None  # type: ignore[arg-type]
    refused = pam_login._verdict(  # type: ignore[arg-type]
        client, PamResult(False, "pam_authenticate() failed: Authentication failure"))
    assert refused is not None
    assert (refused.sqlstate, refused.message) == ("28000", "PAM authentication failed")
    missing = pam_login._verdict(client, PamUnavailable("libpam is not installed"))  # type: ignore[arg-type]
    assert missing is not None
    assert (missing.sqlstate, missing.message) == ("08006", "bouncer config error")
    broken = pam_login._verdict(client, OSError("boom"))  # type: ignore[arg-type]
    assert broken is not None and broken.message == "PAM authentication failed"
