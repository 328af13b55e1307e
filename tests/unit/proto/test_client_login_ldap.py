"""The login machine with a password an LDAP server checks: CheckPassword, password_checked."""

from __future__ import annotations

import pytest

from pgtarn.errors import AuthFailed
from pgtarn.proto import build
from pgtarn.proto.client_login import (
    Authenticated,
    CheckPassword,
    ClientLogin,
    Close,
    LoginState,
    Send,
)

from .test_client_login import auth_code, fields, only_failure, started


def asked(user: str = "alice") -> ClientLogin:
    """A login that asked for the cleartext password (method ldap)."""
    login = started(user=user)
    (request,) = login.begin_auth("ldap", None)
    assert isinstance(request, Send) and auth_code(request.data) == 3
    return login


def test_the_password_goes_to_the_caller_then_its_verdict_ends_the_exchange() -> None:
    login = asked()
    assert login.receive_data(build.password_message(b"s3cret\x00")) == [
        CheckPassword("ldap", "s3cret")]
    assert login.state is LoginState.CHECKING
    assert login.password_checked(None) == [Send(build.AUTH_OK), Authenticated(None)]
    assert login.state is LoginState.AUTHENTICATED


def test_a_refusal_is_the_callers_error() -> None:
    login = asked()
    login.receive_data(build.password_message(b"wrong\x00"))
    error = AuthFailed("LDAP authentication failed", sqlstate="28000")
    failure = only_failure(login.password_checked(error))
    assert (fields(failure.response)["C"], fields(failure.response)["M"]) == (
        "28000", "LDAP authentication failed")
    assert login.state is LoginState.DONE


def test_an_empty_password_is_refused_before_any_check() -> None:
    # an LDAP simple bind with an empty password is anonymous, and succeeds
    failure = only_failure(asked().receive_data(build.password_message(b"\x00")))
    assert fields(failure.response)["M"] == "empty password returned by client"


def test_one_password_per_login_while_it_is_checked() -> None:
    login = asked()
    login.receive_data(build.password_message(b"one\x00"))
    failure = only_failure(login.receive_data(build.password_message(b"two\x00")))
    assert fields(failure.response)["C"] == "08P01"
    with pytest.raises(RuntimeError):  # the login is over: no verdict is taken
        login.password_checked(None)


def test_terminate_while_checked_closes() -> None:
    login = asked()
    login.receive_data(build.password_message(b"pw\x00"))
    assert login.receive_data(build.TERMINATE) == [Close("")]


def test_the_event_never_shows_the_password() -> None:
    assert "s3cret" not in repr(CheckPassword("ldap", "s3cret"))


def test_no_verdict_without_a_password_to_check() -> None:
    with pytest.raises(RuntimeError):
        asked().password_checked(None)
