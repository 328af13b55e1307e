"""LDAP checks without a directory (no server, no password), libldap's settings, the config."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pgtarn.auth.ldap import TlsPolicy, parse_ldap_options
from pgtarn.config.settings import Config
from pgtarn.errors import ConfigError
from pgtarn.net.ldapcheck import check_ldap_config, check_ldap_password, ldap_missing, tls_policy

from ..auth.test_hba import hba


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_no_server_is_a_failed_check_that_says_why() -> None:
    assert ldap_missing() is None
    port = closed_port()
    options = parse_ldap_options(f'ldapserver=127.0.0.1 ldapport={port} ldapprefix="cn="')
    outcome = check_ldap_password(options, "alice", "secret", TlsPolicy())
    assert not outcome.ok
    assert outcome.detail.startswith("could not connect to the LDAP server: ")
    assert f"127.0.0.1:{port}" in outcome.detail and "secret" not in outcome.detail


def test_an_empty_password_never_reaches_the_server() -> None:
    options = parse_ldap_options(f"ldapserver=127.0.0.1 ldapport={closed_port()} ldapprefix=cn=")
    assert check_ldap_password(options, "alice", "").detail == "empty password"


def test_tls_policy_from_ldapconf_and_variables(tmp_path: Path) -> None:
    conf = tmp_path / "ldap.conf"
    conf.write_text("TLS_REQCERT never\nTLS_CACERT /ca.pem\n")
    assert tls_policy({"LDAPCONF": str(conf)}) == TlsPolicy(False, "/ca.pem", None)
    assert tls_policy({"LDAPCONF": str(conf), "LDAPTLS_REQCERT": "hard"}).verify
    assert tls_policy({"LDAPCONF": str(tmp_path / "none"), "LDAPTLS_CACERT": "/x"}) == (
        TlsPolicy(True, "/x", None)
    )
    assert tls_policy({"LDAPCONF": str(conf), "LDAPNOINIT": "1"}) == TlsPolicy()


def test_auth_ldap_options_must_be_right_under_auth_type_ldap() -> None:
    check_ldap_config(Config(auth_type="ldap", auth_ldap_options="ldapserver=h ldapprefix=x"), None)
    with pytest.raises(ConfigError, match=r'^auth_ldap_options: .*requires argument "ldapbasedn"'):
        check_ldap_config(Config(auth_type="ldap", auth_ldap_options="ldapserver=h"), None)
    with pytest.raises(ConfigError, match="ldapserver"):
        check_ldap_config(Config(auth_type="ldap"), None)


def test_other_auth_types_leave_auth_ldap_options_alone() -> None:
    # as PgBouncer, which reads them only for auth_type = ldap
    check_ldap_config(Config(auth_type="md5", auth_ldap_options="junk"), None)
    check_ldap_config(
        Config(auth_type="hba", auth_ldap_options="junk"),
        hba("host all all all ldap ldapserver=h ldapbasedn=x"),
    )
