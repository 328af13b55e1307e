"""passcheck: one pool of auth threads sized by the settings, and what each answer means."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest

from pgtarn.auth.pam import PamResult, PamUnavailable
from pgtarn.client import passcheck
from pgtarn.client.interfaces import LoginClient
from pgtarn.config.settings import Config
from pgtarn.errors import PgtarnError
from pgtarn.net.ldapcheck import Outcome
from pgtarn.runtime import Runtime


def named_client() -> LoginClient:
    """A client as _verdict uses one: only named in the log lines (its repr)."""
    return cast(LoginClient, object())


def test_one_pool_kept_until_a_reload_changes_its_sizes() -> None:
    runtime = Runtime(dataclasses.replace(Config(), auth_threads=3, auth_queue_size=5), {})
    pool = passcheck.auth_pool(runtime)
    assert (pool.threads, pool.waiting, pool.limit) == (3, 5, 8)
    runtime.config = dataclasses.replace(runtime.config, auth_pam_service="x")
    assert passcheck.auth_pool(runtime) is pool
    runtime.config = dataclasses.replace(runtime.config, auth_queue_size=6)
    bigger = passcheck.auth_pool(runtime)
    assert bigger is not pool and bigger.limit == 9
    bigger.close()


@pytest.mark.parametrize(
    ("method", "refusal"),
    [
        ("pam", PamResult(False, "pam_authenticate() failed: Authentication failure")),
        ("ldap", Outcome(False, "LDAP login failed")),
    ],
)
def test_verdicts(method: str, refusal: PamResult | Outcome) -> None:
    client = named_client()
    word = method.upper()
    accepted = PamResult(True) if method == "pam" else Outcome(True)
    assert passcheck._verdict(client, method, accepted) is None
    refused = passcheck._verdict(client, method, refusal)
    assert refused is not None
    assert (refused.sqlstate, refused.message) == ("28000", f"{word} authentication failed")
    broken = passcheck._verdict(client, method, OSError("boom"))
    assert broken is not None and broken.message == f"{word} authentication failed"
    full = PgtarnError("too many", sqlstate="53300")
    assert passcheck._verdict(client, method, full) is full


def test_pam_missing_is_a_config_error_and_no_ldap_answer_a_refusal() -> None:
    client = named_client()
    missing = passcheck._verdict(client, "pam", PamUnavailable("libpam is not installed"))
    assert missing is not None
    assert (missing.sqlstate, missing.message) == ("08006", "bouncer config error")
    late = passcheck._verdict(client, "ldap", None)
    assert late is not None and late.message == "LDAP authentication failed"
