"""passcheck: one pool of auth threads sized by the settings, and what each answer means."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from pgtarn.auth.pam import PamResult, PamUnavailable
from pgtarn.client import passcheck
from pgtarn.config.settings import Config
from pgtarn.errors import PgtarnError
from pgtarn.net.ldapcheck import Outcome


def test_one_pool_kept_until_a_reload_changes_its_sizes() -> None:
    runtime = SimpleNamespace(
        config=dataclasses.replace(Config(), auth_threads=3, auth_queue_size=5), auth_pool=None
    )
    pool = passcheck.auth_pool(runtime)  # type: ignore[arg-type]
    assert (pool.threads, pool.waiting, pool.limit) == (3, 5, 8)
    runtime.config = dataclasses.replace(runtime.config, auth_pam_service="x")
    assert passcheck.auth_pool(runtime) is pool  # type: ignore[arg-type]
    runtime.config = dataclasses.replace(runtime.config, auth_queue_size=6)
    bigger = passcheck.auth_pool(runtime)  # type: ignore[arg-type]
    assert bigger is not pool and bigger.limit == 9
    bigger.close()


@pytest.mark.parametrize(
    ("method", "refusal"),
    [
        ("pam", PamResult(False, "pam_authenticate() failed: Authentication failure")),
        ("ldap", Outcome(False, "LDAP login failed")),
    ],
)
def test_verdicts(method: str, refusal: object) -> None:
    client = object()
    word = method.upper()
    accepted = PamResult(True) if method == "pam" else Outcome(True)
    assert passcheck._verdict(client, method, accepted) is None  # type: ignore[arg-type]
    refused = passcheck._verdict(client, method, refusal)  # type: ignore[arg-type]
    assert refused is not None
    assert (refused.sqlstate, refused.message) == ("28000", f"{word} authentication failed")
    broken = passcheck._verdict(client, method, OSError("boom"))  # type: ignore[arg-type]
    assert broken is not None and broken.message == f"{word} authentication failed"
    full = PgtarnError("too many", sqlstate="53300")
    assert passcheck._verdict(client, method, full) is full  # type: ignore[arg-type]


def test_pam_missing_is_a_config_error_and_no_ldap_answer_a_refusal() -> None:
    client = object()
    missing = passcheck._verdict(  # type: ignore[arg-type]
        client, "pam", PamUnavailable("libpam is not installed")
    )
    assert missing is not None
    assert (missing.sqlstate, missing.message) == ("08006", "bouncer config error")
    late = passcheck._verdict(client, "ldap", None)  # type: ignore[arg-type]
    assert late is not None and late.message == "LDAP authentication failed"
