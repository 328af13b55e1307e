"""ClientLogin with a password checked outside it (pam, ldap): CheckPassword, password_checked."""

from __future__ import annotations

import pytest

from pgtarn.errors import AuthFailed, PgtarnError
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

METHODS = pytest.mark.parametrize("method", ["pam", "ldap"])


def asked(method: str, user: str = "alice") -> ClientLogin:
    """A login that has asked for the cleartext password."""
    login = started(user=user)
    (challenge,) = login.begin_auth(method, None)
    assert isinstance(challenge, Send) and auth_code(challenge.data) == 3
    return login


def password(text: bytes) -> bytes:
    return build.password_message(text + b"\x00")


@METHODS
def test_the_password_goes_out_to_be_checked_and_then_the_login_goes_on(method: str) -> None:
    login = asked(method)
    assert login.receive_data(password(b"s3cret")) == [CheckPassword(method, "s3cret")]
    checking = login.state
    assert login.password_checked(None) == [Send(build.AUTH_OK), Authenticated(None)]
    assert (checking, login.state) == (LoginState.CHECKING, LoginState.AUTHENTICATED)


@METHODS
def test_a_refusal_ends_the_login_with_its_error(method: str) -> None:
    login = asked(method)
    login.receive_data(password(b"wrong"))
    message = f"{method.upper()} authentication failed"
    failure = only_failure(login.password_checked(AuthFailed(message, sqlstate="28000")))
    assert (fields(failure.response)["C"], fields(failure.response)["M"]) == ("28000", message)
    assert login.state is LoginState.DONE


def test_the_password_is_never_in_a_repr() -> None:
    shown = repr(CheckPassword("ldap", "s3cret"))
    assert "s3cret" not in shown and "ldap" in shown


@METHODS
def test_an_empty_password_is_refused_without_a_check(method: str) -> None:
    # some PAM stacks let an account without a password in with one; an LDAP simple bind
    # with an empty password is anonymous, and succeeds
    failure = only_failure(asked(method).receive_data(password(b"")))
    assert fields(failure.response)["M"] == "empty password returned by client"
    assert fields(failure.response)["C"] == "28P01"


def test_a_password_with_a_nul_inside_is_refused() -> None:
    # PAM takes C strings: it would check only the part before the NUL
    failure = only_failure(asked("pam").receive_data(password(b"right\x00more")))
    assert fields(failure.response)["C"] == "08P01"


def test_a_message_behind_the_password_ends_the_login_before_any_check() -> None:
    events = asked("pam").receive_data(password(b"s3cret") + build.query("select 1"))
    assert not [e for e in events if isinstance(e, CheckPassword)]
    assert fields(only_failure(events).response)["C"] == "08P01"


@METHODS
def test_a_message_while_the_check_runs_ends_the_login(method: str) -> None:
    login = asked(method)
    login.receive_data(password(b"s3cret"))
    failure = only_failure(login.receive_data(build.query("select 1")))
    assert fields(failure.response)["M"] == "message received during authentication"
    with pytest.raises(RuntimeError):  # a verdict that comes late finds the login over
        login.password_checked(None)


def test_a_second_password_while_the_check_runs_ends_the_login() -> None:
    login = asked("ldap")
    login.receive_data(password(b"one"))
    failure = only_failure(login.receive_data(password(b"two")))
    assert fields(failure.response)["C"] == "08P01"


@METHODS
def test_terminate_while_the_check_runs_closes(method: str) -> None:
    login = asked(method)
    login.receive_data(password(b"s3cret"))
    assert login.receive_data(build.TERMINATE) == [Close("")]
    assert login.state is LoginState.DONE


def test_a_second_password_in_the_same_chunk_is_refused() -> None:
    events = asked("pam").receive_data(password(b"one") + password(b"two"))
    assert fields(only_failure(events).response)["C"] == "08P01"


def test_no_verdict_without_a_password_to_check() -> None:
    with pytest.raises(RuntimeError):
        asked("ldap").password_checked(None)


def test_an_error_other_than_a_wrong_password_is_passed_on() -> None:
    login = asked("pam")
    login.receive_data(password(b"s3cret"))
    error = PgtarnError("too many PAM authentication requests in progress", sqlstate="53300")
    assert fields(only_failure(login.password_checked(error)).response)["C"] == "53300"
