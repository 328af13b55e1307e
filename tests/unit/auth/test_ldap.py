"""LDAP options: auth_ldap_options's syntax, pg_hba.conf ldap rules, ldapurl, and the checks."""

from __future__ import annotations

import pytest

from pgtarn.auth.ldap import (
    LdapOptions,
    TlsPolicy,
    ldap_options,
    parse_ldap_conf,
    parse_ldap_options,
    split_ldap_options,
)
from pgtarn.config.settings import SETTINGS

from .test_hba import HBA_PATH, hba, hba_error

SIMPLE = 'ldapserver=ldap.example ldapprefix="uid=" ldapsuffix=",dc=example,dc=net"'
SEARCH = (
    'ldapserver="ldap1 ldap2" ldapport=3389 ldapbasedn="dc=example,dc=net" '
    'ldapbinddn="cn=search,dc=example,dc=net" ldapbindpasswd="pa ss""word"'
)


def test_simple_bind_mode() -> None:
    options = parse_ldap_options(SIMPLE)
    assert (options.servers, options.server_port, options.search) == (("ldap.example",), 389, False)
    assert options.bind_dn("alice") == "uid=alice,dc=example,dc=net"


def test_search_bind_mode_quotes_and_server_list() -> None:
    options = parse_ldap_options(SEARCH)
    assert options.servers == ("ldap1", "ldap2") and options.server_port == 3389
    assert options.search and options.binddn == "cn=search,dc=example,dc=net"
    assert options.bindpasswd == 'pa ss"word'
    assert options.search_filter_for("alice") == "(uid=alice)"
    assert 'pa ss"word' not in repr(options)  # the bind password is in no repr


def test_pgbouncer_syntax_commas_and_quoted_names() -> None:
    assert split_ldap_options(' "ldapport"=1,ldapserver=h , ldaptls=1 ') == [
        ("ldapport", "1"),
        ("ldapserver", "h"),
        ("ldaptls", "1"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ldapserver", 'authentication option "ldapserver" is not in name=value format'),
        ("ldapserver= h", 'no space may follow "="'),
        ('ldapserver="h', "unterminated quoted string"),
        ("ldapserver=h ldapprefix=x ldapfoo=1", 'invalid LDAP option: "ldapfoo"'),
        (
            "ldapserver=h ldapprefix=x ldapbasedn=y",
            "cannot mix options for simple bind and search+bind modes",
        ),
        ("ldapserver=h", 'requires argument "ldapbasedn", "ldapprefix", or "ldapsuffix"'),
        ("ldapbasedn=x", 'requires argument "ldapserver"'),
        (
            "ldapserver=h ldapbasedn=x ldapsearchattribute=a ldapsearchfilter=f",
            "cannot use ldapsearchattribute together with ldapsearchfilter",
        ),
        ("ldapserver=h ldapbasedn=x ldapport=0", 'invalid LDAP port number: "0"'),
        ("ldapserver=h ldapbasedn=x ldapport=389x", 'invalid LDAP port number: "389x"'),
        ("ldapserver=h ldapbasedn=x ldapscheme=ldapi", 'invalid ldapscheme value: "ldapi"'),
        ("ldapurl=http://h/dc=x", "unsupported LDAP URL scheme: http"),
        ("ldapurl=ldap://h/dc=x?uid?deep", 'bad scope "deep"'),
        ("ldapurl=ldap://h:99999/dc=x", 'bad port "99999"'),
    ],
)
def test_bad_options_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_ldap_options(text)
    assert message in str(info.value)


def test_ldap_url_sets_several_options() -> None:
    options = parse_ldap_options(
        'ldapurl="ldaps://ldap.example:6636/ou=people,dc=example,dc=net?mail,cn?one"'
    )
    assert (options.scheme, options.servers, options.server_port) == (
        "ldaps",
        ("ldap.example",),
        6636,
    )
    assert (options.basedn, options.search_attribute, options.scope) == (
        "ou=people,dc=example,dc=net",
        "mail",
        "one",
    )  # the first attribute only
    url = "ldap://h/dc=x??sub?(%7C(uid=$username)(mail=$username))"
    assert parse_ldap_options(f"ldapurl={url}").search_filter_for("bob") == (
        "(|(uid=bob)(mail=bob))"
    )


def test_ldap_url_defaults_and_a_later_option_overriding_it() -> None:
    options = ldap_options([("ldapurl", "ldap://[::1]/dc=x%20y"), ("ldapport", "1389")])
    assert (options.servers, options.server_port, options.basedn, options.scope) == (
        ("::1",),
        1389,
        "dc=x y",
        "base",
    )  # an URL without a scope: base, as RFC 4516
    assert parse_ldap_options("ldapurl=ldaps://h/dc=x").server_port == 636


def test_search_filter_placeholder_and_parentheses() -> None:
    options = parse_ldap_options('ldapserver=h ldapbasedn=x ldapsearchfilter="uid=$username"')
    assert options.search_filter_for("bob") == "(uid=bob)"  # libldap takes it bare too
    both = LdapOptions(("h",), basedn="x", search_filter="(|(uid=$username)(mail=$username))")
    assert both.search_filter_for("bob") == "(|(uid=bob)(mail=bob))"


@pytest.mark.parametrize("user", ["a*", "a(b", "a)", "a\\b", "a/b"])
def test_names_that_would_change_the_search_filter_are_refused(user: str) -> None:
    assert parse_ldap_options("ldapserver=h ldapbasedn=x").user_name_problem(user) is not None
    assert parse_ldap_options(SIMPLE).user_name_problem(user) is None  # (no filter there)


def test_show_config_masks_the_bind_password() -> None:
    shown = SETTINGS["auth_ldap_options"].format(SEARCH + ' "ldapbindpasswd"=again,x=1')
    assert "pa ss" not in shown and "again" not in shown
    assert shown.count("********") == 2 and shown.endswith(",x=1")


def test_ldap_conf_tls_settings_and_environment() -> None:
    conf = "# comment\nTLS_REQCERT never\ntls_cacert /etc/ca.pem\n"
    assert parse_ldap_conf(conf, {}) == TlsPolicy(False, "/etc/ca.pem", None)
    assert parse_ldap_conf(conf, {"LDAPTLS_REQCERT": "demand"}).verify
    assert parse_ldap_conf("", {}).verify  # libldap's default: demand
    assert not parse_ldap_conf("TLS_REQCERT allow", {}).verify


# --- pg_hba.conf ldap rules -------------------------------------------------------------------


def test_hba_ldap_rule_takes_postgresql_tokens() -> None:
    rules = hba(
        'host all all 0.0.0.0/0 ldap ldapserver=127.0.0.1 "ldapport"=1389 '
        'ldapbasedn="dc=example,dc=net" ,ldapsearchfilter="uid=$username"'
    )
    rule = rules.rules[0]
    assert rule.method == "ldap" and rule.unsupported_method is None and not rules.warnings
    assert rule.ldap is not None and rule.ldap.server_port == 1389
    assert rule.ldap.search_filter_for("bob") == "(uid=bob)"


def test_hba_ldap_rule_errors_name_the_line() -> None:
    assert hba_error("\nhost all all all ldap ldapserver=h") == (
        f'{HBA_PATH}:2: authentication method "ldap" requires argument "ldapbasedn", '
        '"ldapprefix", or "ldapsuffix" to be set'
    )


def test_ldap_options_on_another_method_are_refused() -> None:
    message = hba_error("host all all all md5 ldapserver=h")
    assert 'option "ldapserver" is not valid for authentication method "md5"' in message
