"""auth_type = ldap and pg_hba.conf's ldap method against a real OpenLDAP server (slapd)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess

from .certs import Pki
from .conftest import PgtarnFactory
from .drivers import connect
from .ldapserver import (
    BASE_DN,
    PEOPLE,
    SEARCHER_DN,
    SEARCHER_PASSWORD,
    TWIN,
    Slapd,
    slapd_missing,
)
from .test_admin import admin, show
from .test_auth import login_error

pytestmark = pytest.mark.integration

LDAP_FAILED = "LDAP authentication failed"


@pytest.fixture(scope="module")
def slapd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Slapd]:
    missing = slapd_missing()
    if missing is not None:
        pytest.skip(missing)
    server = Slapd(tmp_path_factory.mktemp("slapd"), pki)
    try:
        yield server
    finally:
        server.stop()


def simple_bind(slapd: Slapd, **extra: str) -> str:
    """Options of simple bind mode: the DN is cn=<user> under PEOPLE."""
    words = [f'ldapserver=127.0.0.1 ldapport={slapd.port} ldapprefix="cn=" ldapsuffix=",{PEOPLE}"']
    words += [f"{name}={value}" for name, value in extra.items()]
    return " ".join(words)


def search_bind(slapd: Slapd, **extra: str) -> str:
    """Options of search+bind mode, searching as the searcher account."""
    words = [
        f'ldapserver=127.0.0.1 ldapport={slapd.port} ldapbasedn="{BASE_DN}" '
        f'ldapbinddn="{SEARCHER_DN}" ldapbindpasswd={SEARCHER_PASSWORD}'
    ]
    words += [f"{name}={value}" for name, value in extra.items()]
    return " ".join(words)


def current_user(proc: PgtarnProcess, user: str, password: str) -> str:
    with connect(proc, user, password) as conn:
        row = conn.execute("select current_user").fetchone()
    assert row is not None
    return str(row[0])


def refused(proc: PgtarnProcess, user: str, password: str) -> psycopg.OperationalError:
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, user, password).close()
    return info.value


def ldap_refusal(proc: PgtarnProcess, user: str, password: str) -> None:
    assert LDAP_FAILED in str(refused(proc, user, password))
    assert login_error(proc, user, password) == ("28000", LDAP_FAILED)


def test_auth_type_ldap_simple_bind(pgtarn_factory: PgtarnFactory, slapd: Slapd) -> None:
    # no auth_file entry: the servers log in with the password the LDAP server took
    proc = pgtarn_factory(
        userlist={}, settings={"auth_type": "ldap", "auth_ldap_options": simple_bind(slapd)}
    )
    assert current_user(proc, "app", "app_pass") == "app"
    assert current_user(proc, "scram_user", "scram_pass") == "scram_user"
    ldap_refusal(proc, "app", "wrong")
    ldap_refusal(proc, "nobody_here", "app_pass")
    log = proc.log_text()
    assert f'LDAP login failed for user "cn=app,{PEOPLE}"' in log
    assert "invalidCredentials" in log
    assert "app_pass" not in log and "wrong" not in log


def test_hba_ldap_search_bind(pgtarn_factory: PgtarnFactory, slapd: Slapd, tmp_path: Path) -> None:
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(f"host all all 127.0.0.1/32 ldap {search_bind(slapd)}\n")
    proc = pgtarn_factory(userlist={}, settings={"auth_type": "hba", "auth_hba_file": hba})
    assert current_user(proc, "scram_user", "scram_pass") == "scram_user"
    ldap_refusal(proc, "scram_user", "app_pass")
    ldap_refusal(proc, "nobody_here", "app_pass")
    ldap_refusal(proc, TWIN, "twin_pass")
    ldap_refusal(proc, "app*", "app_pass")  # a name that would widen the search filter
    log = proc.log_text()
    assert 'LDAP user "nobody_here" does not exist' in log
    assert f'LDAP user "{TWIN}" is not unique' in log
    assert "invalid character in user name for LDAP authentication" in log
    assert SEARCHER_PASSWORD not in log and "scram_pass" not in log


CONSOLE_RULE = "host pgbouncer scram_user 127.0.0.1/32 scram-sha-256\n"
APP_LDAP_RULE = "host app all 127.0.0.1/32 ldap "


def hba_pgtarn(pgtarn_factory: PgtarnFactory, tmp_path: Path) -> tuple[Any, Path]:
    """pgtarn under auth_type = hba, its file letting scram_user reach the console."""
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(CONSOLE_RULE)
    proc = pgtarn_factory(
        settings={"auth_type": "hba", "auth_hba_file": hba, "admin_users": "scram_user"}
    )
    return proc, hba


def app_login_under(proc: PgtarnProcess, hba: Path, options: str) -> str:
    """app's login once app's HBA rule is ldap with options (RELOAD): its user, or
    "refused" (with LDAP's refusal)."""
    hba.write_text(CONSOLE_RULE + APP_LDAP_RULE + options + "\n")
    with admin(proc, "scram_user", "scram_pass") as console:
        console.execute("RELOAD")
    try:
        return current_user(proc, "app", "app_pass")
    except psycopg.OperationalError as exc:
        assert LDAP_FAILED in str(exc)
        return "refused"


def test_hba_ldap_filters_urls_and_the_search_account(
    pgtarn_factory: PgtarnFactory, slapd: Slapd, tmp_path: Path
) -> None:
    proc, hba = hba_pgtarn(pgtarn_factory, tmp_path)
    cases = [
        search_bind(slapd, ldapsearchfilter='"(|(uid=$username)(mail=$username))"'),
        search_bind(slapd, ldapsearchattribute="mail"),  # the name is no mail address: refused
        f'ldapurl="ldap://127.0.0.1:{slapd.port}/{PEOPLE}?uid?sub" '
        f'ldapbinddn="{SEARCHER_DN}" ldapbindpasswd={SEARCHER_PASSWORD}',
        # anonymous clients may not search this directory: no search account, no user found
        f'ldapserver=127.0.0.1 ldapport={slapd.port} ldapbasedn="{BASE_DN}"',
    ]
    outcomes = [app_login_under(proc, hba, options) for options in cases]
    assert outcomes == ["app", "refused", "app", "refused"]


def test_ldaps_and_starttls(
    pgtarn_factory: PgtarnFactory,
    slapd: Slapd,
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # libldap's own settings say which CA to trust, as for PgBouncer and PostgreSQL
    ldap_conf = tmp_path / "ldap.conf"
    ldap_conf.write_text(f"TLS_CACERT {pki.ca}\n")
    monkeypatch.setenv("LDAPCONF", str(ldap_conf))
    proc, hba = hba_pgtarn(pgtarn_factory, tmp_path)
    prefix = f'ldapprefix="cn=" ldapsuffix=",{PEOPLE}"'
    ldaps = f"ldapserver=127.0.0.1 ldapscheme=ldaps ldapport={slapd.ldaps_port} {prefix}"
    starttls = f"ldapserver=127.0.0.1 ldapport={slapd.port} ldaptls=1 {prefix}"
    wrong_port = f"ldapserver=127.0.0.1 ldapscheme=ldaps ldapport={slapd.port} {prefix}"

    def outcome(options: str) -> str:
        return app_login_under(proc, hba, options)

    assert [outcome(o) for o in (ldaps, starttls, wrong_port)] == ["app", "app", "refused"]
    ldap_conf.write_text("TLS_REQCERT demand\n")  # the system's CAs: the test CA is not one
    assert [outcome(o) for o in (ldaps, starttls)] == ["refused", "refused"]
    ldap_conf.write_text("TLS_REQCERT never\n")
    assert [outcome(o) for o in (ldaps, starttls)] == ["app", "app"]
    assert "certificate" in proc.log_text().lower()


def test_ldap_server_down_is_a_clear_refusal(pgtarn_factory: PgtarnFactory) -> None:
    with socket.socket() as unused:  # a port where nothing listens
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    proc = pgtarn_factory(
        userlist={},
        settings={
            "auth_type": "ldap",
            "auth_ldap_options": f'ldapserver=127.0.0.1 ldapport={port} ldapprefix="cn="',
        },
    )
    ldap_refusal(proc, "app", "app_pass")
    assert "could not connect to the LDAP server" in proc.log_text()


def test_a_silent_ldap_server_holds_no_other_login(
    pgtarn_factory: PgtarnFactory, tmp_path: Path
) -> None:
    """The bind waits in an auth thread: while one LDAP server does not answer, other
    logins go on; the waiting one is refused when its request times out."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    accepted: list[socket.socket] = []
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(
        f"host all app 127.0.0.1/32 ldap ldapserver=127.0.0.1 "
        f'ldapport={silent.getsockname()[1]} ldapprefix="cn="\n'
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    proc = pgtarn_factory(settings={"auth_type": "hba", "auth_hba_file": hba})
    errors: list[BaseException] = []

    def ldap_login() -> None:
        try:
            connect(proc, "app", "app_pass", connect_timeout=60).close()
        except psycopg.OperationalError as exc:
            errors.append(exc)

    waiting = threading.Thread(target=ldap_login, daemon=True)
    waiting.start()
    try:
        accepted.append(silent.accept()[0])  # the bind's connection: it gets no answer
        accepted[0].settimeout(10)
        assert accepted[0].recv(100)  # the bind request came
        assert current_user(proc, "scram_user", "scram_pass") == "scram_user"
        assert waiting.is_alive()  # (nothing answered its bind yet)
        waiting.join(timeout=60)
        assert not waiting.is_alive()
    finally:
        for conn in accepted:
            conn.close()
        silent.close()
    assert len(errors) == 1 and LDAP_FAILED in str(errors[0])


def test_the_bind_password_stays_out_of_show_config(
    pgtarn_factory: PgtarnFactory, slapd: Slapd
) -> None:
    options = search_bind(slapd)
    proc = pgtarn_factory(settings={"auth_type": "ldap", "auth_ldap_options": options})
    with admin(proc) as console:  # app logs in to the console through LDAP too
        rows = {r["key"]: r["value"] for r in show(console, "CONFIG")}
    assert SEARCHER_PASSWORD not in rows["auth_ldap_options"]
    assert "ldapbindpasswd=********" in rows["auth_ldap_options"]
    assert SEARCHER_PASSWORD not in proc.log_text()


def test_bad_ldap_options_are_refused(pgtarn_factory: PgtarnFactory, slapd: Slapd) -> None:
    proc = pgtarn_factory(settings={"auth_type": "ldap", "auth_ldap_options": simple_bind(slapd)})
    with admin(proc) as console:
        with pytest.raises(psycopg.Error, match="cannot mix options for simple bind"):
            console.execute(f"SET auth_ldap_options = '{simple_bind(slapd)} ldapbasedn=x'")
        with pytest.raises(psycopg.Error, match='requires argument "ldapbasedn"'):
            console.execute("SET auth_ldap_options = 'ldapserver=127.0.0.1'")
    assert current_user(proc, "app", "app_pass") == "app"  # the options in force stay


def test_ldap_with_auth_user_is_a_config_error(
    pgtarn_factory: PgtarnFactory, slapd: Slapd, tmp_path: Path
) -> None:
    """As PgBouncer: an LDAP login to a database with an auth_user is "bouncer config
    error", under auth_type = ldap and through an HBA ldap rule alike."""
    proc = pgtarn_factory(
        settings={"auth_type": "ldap", "auth_ldap_options": simple_bind(slapd), "auth_user": "app"}
    )
    assert "bouncer config error" in str(refused(proc, "app", "app_pass"))
    assert "LDAP can't be used together with database authentication" in proc.log_text()
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(f"host all all 127.0.0.1/32 ldap {simple_bind(slapd)}\n")
    proc = pgtarn_factory(settings={"auth_type": "hba", "auth_hba_file": hba, "auth_user": "app"})
    assert "bouncer config error" in str(refused(proc, "scram_user", "scram_pass"))
