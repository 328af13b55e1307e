"""Unit tests for pg_hba.conf / pg_ident.conf parsing and rule matching."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtarn.auth.hba import (
    HbaRules,
    IdentMaps,
    load_hba,
    load_ident,
    parse_hba,
    parse_ident,
)
from pgtarn.errors import ConfigError, Problems

HBA_PATH = "/etc/pgtarn/pg_hba.conf"
IDENT_PATH = "/etc/pgtarn/pg_ident.conf"


def hba(text: str, files: dict[str, str] | None = None) -> HbaRules:
    def read(path: str) -> str:
        try:
            return (files or {})[path]
        except KeyError:
            raise FileNotFoundError(2, "No such file or directory", path) from None

    return parse_hba(text, HBA_PATH, read)


def line_of(
    rules: HbaRules,
    *,
    local: bool = False,
    tls: bool = False,
    database: str = "db",
    user: str = "alice",
    address: str | None = "10.1.2.3",
    replication: bool = False,
) -> int | None:
    """The line of the rule that applies, or None."""
    rule = rules.match(
        local=local,
        tls=tls,
        database=database,
        user=user,
        address=None if address is None else ipaddress.ip_address(address),
        replication=replication,
    )
    return None if rule is None else rule.line


def hba_error(text: str, files: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        hba(text, files)
    return str(info.value)


TABLE = """\
# TYPE  DATABASE   USER     ADDRESS          METHOD
local   all        postgres                  peer
local   sales      all                       md5
hostssl all        all      10.0.0.0/8       scram-sha-256
host    sales      bob      10.0.0.0/8       reject
host    sales,hr   all      10.1.0.0/16      password
host    all        all      192.168.1.0 255.255.255.0 trust
host    all        all      ::1/128          md5

host    all        all      all              reject
"""


@pytest.mark.parametrize(
    ("conn", "line"),
    [
        (dict(local=True, user="postgres", database="x"), 2),
        (dict(local=True, user="alice", database="sales"), 3),
        (dict(local=True, user="alice", database="other"), None),  # no local rule fits
        (dict(tls=True, database="sales", user="bob"), 4),
        (dict(database="sales", user="bob"), 5),
        (dict(database="sales", user="carol"), 6),
        (dict(database="hr", user="carol"), 6),
        (dict(database="hr", user="carol", address="10.2.0.1"), 10),
        (dict(address="192.168.1.77"), 7),
        (dict(address="192.168.2.77"), 10),
        (dict(address="::1"), 8),
        (dict(address="::2"), 10),
        (dict(address=None), 10),
    ],
)
def test_first_matching_rule_wins(conn: dict[str, Any], line: int | None) -> None:
    rules = hba(TABLE)
    assert line_of(rules, **conn) == line
    assert [r.line for r in rules.rules] == [2, 3, 4, 5, 6, 7, 8, 10]
    assert rules.warnings == ()


def test_rule_fields() -> None:
    rule = hba('host sales,"hr" bob 10.1.2.3/8 scram-sha-256 # remote\n').rules[0]
    assert (rule.line, rule.conn_type, rule.method) == (1, "host", "scram-sha-256")
    assert [d.text for d in rule.databases] == ["sales", "hr"]
    assert [u.text for u in rule.users] == ["bob"]
    assert rule.address is not None
    assert (rule.address.version, rule.address.network) == (4, 10 << 24)
    assert rule.address.mask == 0xFF000000
    assert (rule.map_name, rule.clientcert, rule.unsupported_method) == (None, None, None)


@pytest.mark.parametrize(
    ("conn_type", "local", "tls", "matches"),
    [
        ("local", True, False, True),
        ("local", False, False, False),
        ("host", False, False, True),
        ("host", False, True, True),
        ("host", True, False, False),
        ("hostssl", False, True, True),
        ("hostssl", False, False, False),
        ("hostnossl", False, False, True),
        ("hostnossl", False, True, False),
        ("hostgssenc", False, False, False),
        ("hostgssenc", False, True, False),
        ("hostnogssenc", False, False, True),
        ("hostnogssenc", False, True, True),
        ("hostnogssenc", True, False, False),
    ],
)
def test_connection_types(conn_type: str, local: bool, tls: bool, matches: bool) -> None:
    address = "" if conn_type == "local" else "all"
    rules = hba(f"{conn_type} all all {address} trust")
    assert (line_of(rules, local=local, tls=tls) == 1) is matches


def test_hostgssenc_is_accepted_with_a_warning() -> None:
    rules = hba("\nhostgssenc all all all trust")
    assert rules.warnings == (
        f"{HBA_PATH}:2: hostgssenc never matches: pgtarn has no GSSAPI encryption",
    )


@pytest.mark.parametrize(
    ("database_field", "database", "user", "replication", "matches"),
    [
        ("all", "anything", "alice", False, True),
        ("all", "anything", "alice", True, False),  # all does not cover replication
        ("replication", "replication", "alice", False, False),
        ("replication", "anything", "alice", True, True),
        ('"replication"', "replication", "alice", False, True),  # quoted: a plain name
        ('"replication"', "replication", "alice", True, False),
        ('"all"', "anything", "alice", False, False),
        ('"all"', "all", "alice", False, True),
        ("sameuser", "alice", "alice", False, True),
        ("sameuser", "bob", "alice", False, False),
        ("sameuser", "alice", "alice", True, False),
        ('"sameuser"', "sameuser", "alice", False, True),
        ("Sales", "sales", "alice", False, False),  # names are case-sensitive
        ("Sales", "Sales", "alice", False, True),
        ("sales", "sales", "alice", True, False),
        ("sales,replication", "x", "alice", True, True),
    ],
)
def test_database_keywords(
    database_field: str, database: str, user: str, replication: bool, matches: bool
) -> None:
    rules = hba(f"host {database_field} all all trust")
    got = line_of(rules, database=database, user=user, replication=replication)
    assert (got == 1) is matches


@pytest.mark.parametrize(
    ("user_field", "user", "matches"),
    [
        ("all", "anyone", True),
        ('"all"', "anyone", False),
        ('"all"', "all", True),
        ("bob,carol", "carol", True),
        ("bob,carol", "dave", False),
        ("Bob", "bob", False),
        ('"+admins"', "+admins", True),
        ("sameuser", "sameuser", True),  # not a keyword in the user field
    ],
)
def test_user_field(user_field: str, user: str, matches: bool) -> None:
    assert (line_of(hba(f"local all {user_field} trust"), local=True, user=user) == 1) is matches


def test_quoting_keeps_spaces_commas_hash_and_doubled_quotes() -> None:
    rule = hba('local "my db","a,b",x "o""brien" trust # "not" a field').rules[0]
    assert [d.text for d in rule.databases] == ["my db", "a,b", "x"]
    assert [u.text for u in rule.users] == ['o"brien']
    assert all(not d.keyword for d in rule.databases)
    assert line_of(hba('local "my db" all trust'), local=True, database="my db") == 1
    assert line_of(hba('local "a#b" all trust'), local=True, database="a#b") == 1


def test_list_spacing_follows_postgresql() -> None:
    # A comma right after an item continues the list, even across blanks: "a, b" is one field.
    rule = hba('local a,  b, "c" all trust').rules[0]
    assert [d.text for d in rule.databases] == ["a", "b", "c"]
    assert [u.text for u in rule.users] == ["all"]


def test_blank_and_comment_lines_are_skipped_and_line_numbers_are_real() -> None:
    rules = hba("\n   \n# comment\n\t# indented\nlocal all all trust\r\n\nhost all all all md5")
    assert [(r.line, r.method) for r in rules.rules] == [(5, "trust"), (7, "md5")]


def test_continuation_lines() -> None:
    text = "# top\nhost sales,\\\n   hr all \\\n 10.0.0.0/8 md5\nlocal all all trust\\\n"
    rules = hba(text)
    assert [r.line for r in rules.rules] == [2, 5]
    assert [d.text for d in rules.rules[0].databases] == ["sales", "hr"]
    assert rules.rules[0].method == "md5"
    assert "hba.conf:2:" in hba_error("# x\nhost all \\\n all 10.0.0.0/8 bogus")


def test_backslash_before_a_newline_continues_even_a_comment() -> None:
    # As PostgreSQL, the joining happens before comments are stripped.
    assert hba("# comment \\\nlocal all all trust\nhost all all all md5").rules[0].line == 3


def test_at_file_for_databases_and_users() -> None:
    files = {
        "/etc/pgtarn/dbs.txt": '# databases\nsales, hr\n"quoted db" @more/nested.txt # x\n',
        "/etc/pgtarn/more/nested.txt": "deep",
        "/abs/users": "bob\ncarol  dave\n",
    }
    rule = hba("host @dbs.txt @/abs/users,erin all md5", files).rules[0]
    assert [d.text for d in rule.databases] == ["sales", "hr", "quoted db", "deep"]
    assert [u.text for u in rule.users] == ["bob", "carol", "dave", "erin"]


def test_at_file_keywords_keep_their_meaning_and_quoted_at_is_a_name() -> None:
    rules = hba('local @kw "@kw" trust', {"/etc/pgtarn/kw": "all"})
    assert line_of(rules, local=True, database="x", user="@kw") == 1
    assert line_of(rules, local=True, database="x", user="kw") is None
    assert line_of(hba("local @ all trust"), local=True, database="@") == 1  # lone @: a name


def test_at_file_errors_name_the_file_and_line() -> None:
    message = hba_error("\n\nlocal @missing all trust")
    assert message.startswith(f'{HBA_PATH}:3: cannot read "/etc/pgtarn/missing"')
    message = hba_error("local @u all trust", {"/etc/pgtarn/u": 'ok\n"unterminated\n'})
    assert message == "/etc/pgtarn/u:2: unterminated quoted string"
    message = hba_error("local all @g trust", {"/etc/pgtarn/g": "x\n+admins"})
    assert message.startswith('/etc/pgtarn/g:2: group "+admins" is not supported')
    message = hba_error("local @loop all trust", {"/etc/pgtarn/loop": "a @loop"})
    assert message == '/etc/pgtarn/loop:1: @file nesting too deep at "@loop"'


@pytest.mark.parametrize(
    ("address_field", "client", "matches"),
    [
        ("10.0.0.0/8", "10.200.3.4", True),
        ("10.0.0.0/8", "11.0.0.1", False),
        ("10.1.2.3/8", "10.9.9.9", True),  # host bits in the rule are ignored
        ("10.1.2.3/32", "10.1.2.3", True),
        ("10.1.2.3/32", "10.1.2.4", False),
        ("0.0.0.0/0", "203.0.113.5", True),
        ("0.0.0.0/0", "2001:db8::1", False),
        ("10.0.0.0/8", "::ffff:10.1.2.3", True),  # IPv4-mapped client
        ("10.0.0.0/8", "::ffff:11.1.2.3", False),
        ("10.0.0.0/8", "::a01:203", False),  # IPv4-compatible is not mapped
        ("::ffff:10.0.0.0/104", "10.4.5.6", True),  # a mapped rule names IPv4 clients
        ("::ffff:10.0.0.0/104", "11.4.5.6", False),
        ("::/0", "10.4.5.6", False),
        ("::/0", "2001:db8::1", True),
        ("2001:db8::/32", "2001:db8:ffff::1", True),
        ("2001:db8::/32", "2001:db9::1", False),
        ("::1/128", "::1", True),
        ("fe80::1%eth0/64", "fe80::abcd", True),
        ("10.0.0.1 255.255.255.0", "10.0.0.200", True),
        ("10.0.0.1 255.255.255.0", "10.0.1.1", False),
        ("10.0.0.0 255.0.255.0", "10.7.0.9", True),  # masks need not be contiguous
        ("10.0.0.0 255.0.255.0", "10.7.1.9", False),
        ("2001:db8:: ffff:ffff::", "2001:db8:1::1", True),
        ("all", "10.0.0.1", True),
        ("all", "::1", True),
    ],
)
def test_addresses(address_field: str, client: str, matches: bool) -> None:
    assert (line_of(hba(f"host all all {address_field} trust"), address=client) == 1) is matches


def test_unknown_client_address_matches_only_all() -> None:
    rules = hba("host all all 0.0.0.0/0 trust\nhost all all all md5")
    assert line_of(rules, address=None) == 2


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("bogus all all trust", 1, 'invalid connection type "bogus"'),
        ("local,host all all trust", 1, "multiple values in the connection type field"),
        ("include other.conf", 1, '"include" directives are not supported'),
        ("local", 1, "end of line before the database field"),
        ("local all", 1, "end of line before the user field"),
        ("local all all", 1, "end of line before the authentication method field"),
        ("host all all", 1, "end of line before the address field"),
        ("host all all 10.0.0.0/8", 1, "end of line before the authentication method field"),
        ("host all all 10.0.0.1", 1, "end of line before the IP mask field"),
        ("local samerole all trust", 1, '"samerole" is not supported'),
        ("local samegroup all trust", 1, '"samegroup" is not supported'),
        ("local all +admins trust", 1, 'group "+admins" is not supported'),
        ("host all all samehost trust", 1, '"samehost" is not supported'),
        ("host all all samenet trust", 1, '"samenet" is not supported'),
        ("host all all db.example.com trust", 1, "host names are not supported"),
        ("host all all .example.com trust", 1, "host names are not supported"),
        ('host all all "all" trust', 1, "host names are not supported"),
        ("host all all a.b/24 trust", 1, 'invalid IP address "a.b/24"'),
        ("host all all 10.0.0.0/33 trust", 1, "invalid CIDR mask"),
        ("host all all ::/129 trust", 1, "invalid CIDR mask"),
        ("host all all 10.0.0.0/x trust", 1, "invalid CIDR mask"),
        ("host all all 10.0.0.0/ trust", 1, "invalid CIDR mask"),
        ("host all all 10.0.0.0/\u0661 trust", 1, "invalid CIDR mask"),
        ("host all all 10.0.0.0 nonsense trust", 1, 'invalid IP mask "nonsense"'),
        ("host all all 10.0.0.0 ffff:: trust", 1, "do not match"),
        ("host all all 10.0.0.0/8,::1/128 trust", 1, "multiple values in the address field"),
        ("local all all magic", 1, 'invalid authentication method "magic"'),
        ("local all all md5,trust", 1, "multiple values in the authentication method field"),
        ("host all all all peer", 1, "peer authentication is only supported on local sockets"),
        ("local all all cert", 1, "cert authentication is only supported on host and hostssl"),
        ("local all all gss", 1, "gss authentication is not supported on local sockets"),
        ("hostgssenc all all all md5", 1, "GSSAPI encryption only supports gss"),
        ("local all all peer map", 1, 'option "map" is not in name=value format'),
        ("local all all peer colour=blue", 1, 'unrecognized authentication option name "colour"'),
        ("local all all md5 map=x", 1, 'option "map" is not valid for authentication method'),
        ("host all all all md5 clientcert=verify-ca", 1, "clientcert can only be configured"),
        ("hostssl all all all md5 clientcert=1", 1, 'invalid clientcert "1"'),
        ("hostssl all all all cert clientcert=verify-ca", 1, "only accepts verify-full"),
        ('local "unterminated all trust', 1, "unterminated quoted string"),
        ("local /( all trust", 1, 'invalid regular expression "("'),
        ("\n# c\n\nlocal all all trust\nlocal all all", 5, "end of line before"),
    ],
)
def test_errors_name_file_and_line(text: str, line: int, fragment: str) -> None:
    message = hba_error(text)
    assert message.startswith(f"{HBA_PATH}:{line}: ")
    assert fragment in message


@pytest.mark.parametrize("method", ["gss", "sspi", "radius", "ident", "bsd"])
def test_unsupported_methods_reject_with_a_warning(method: str) -> None:
    rules = hba(
        f"local all postgres peer\n\nhost all all all {method} krb_realm=x\nhost all all all trust"
    )
    rule = rules.rules[1]
    assert (rule.method, rule.unsupported_method) == ("reject", method)
    assert line_of(rules) == 3  # the rule still matches, so the trust rule after it is not used
    assert rules.warnings == (
        f'{HBA_PATH}:3: authentication method "{method}" is not supported; this rule rejects '
        "the connections it matches",
    )


def test_pam_is_a_method() -> None:
    rules = hba("host all all all pam pam_use_hostname=0\nlocal all all pam")
    assert [(r.method, r.unsupported_method) for r in rules.rules] == [("pam", None)] * 2
    assert rules.warnings == ()


@pytest.mark.parametrize("option", ["pamservice=other", "pam_use_hostname=1"])
def test_pam_with_options_pgtarn_cannot_honour_rejects_with_a_warning(option: str) -> None:
    # one service (auth_pam_service) for all; PAM_RHOST is always the address
    rules = hba(f"host all all all pam {option}")
    assert rules.rules[0].method == "reject"
    name = option.split("=")[0]
    assert rules.warnings == (
        f'{HBA_PATH}:1: authentication method "pam with {name}" is not supported; this rule '
        "rejects the connections it matches",
    )


def test_ident_on_a_unix_socket_means_peer() -> None:
    rules = hba("local all all ident map=m")
    assert (rules.rules[0].method, rules.rules[0].map_name) == ("peer", "m")
    assert rules.rules[0].unsupported_method is None
    assert rules.warnings == ()


@pytest.mark.parametrize(
    ("text", "method", "map_name", "clientcert"),
    [
        ("local all all peer map=local_map", "peer", "local_map", None),
        ('local all all peer "map=my map"', "peer", "my map", None),
        ('local all all peer map="my map"', "peer", "my map", None),
        ("hostssl all all all cert", "cert", None, "verify-full"),
        (
            "hostssl all all all cert map=certmap clientcert=verify-full",
            "cert",
            "certmap",
            "verify-full",
        ),
        (
            "hostssl all all all scram-sha-256 clientcert=verify-ca",
            "scram-sha-256",
            None,
            "verify-ca",
        ),
        ("hostssl all all all md5 clientcert=verify-full", "md5", None, "verify-full"),
        ("local all all trust pamservice=x include_realm=0", "trust", None, None),
        ("local all all peer map=a map=b", "peer", "b", None),
    ],
)
def test_options(text: str, method: str, map_name: str | None, clientcert: str | None) -> None:
    rule = hba(text).rules[0]
    assert (rule.method, rule.map_name, rule.clientcert) == (method, map_name, clientcert)


def test_regex_database_and_user() -> None:
    rules = hba(
        'local /^sales_ all reject\nlocal all "/^(ops|dev)-[0-9]+$" md5\nlocal all all trust'
    )
    assert line_of(rules, local=True, database="sales_eu") == 1
    assert line_of(rules, local=True, database="eu_sales_eu", user="ops-12") == 2
    assert line_of(rules, local=True, database="x", user="ops-12x") == 3


def test_methods_are_kept() -> None:
    methods = ["trust", "reject", "md5", "password", "scram-sha-256", "pam"]
    rules = hba("\n".join(f"host all all all {m}" for m in methods) + "\nlocal all all peer")
    assert [r.method for r in rules.rules] == [*methods, "peer"]


def test_load_hba_reads_relative_at_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "users").write_text("bob\ncarol\n")
    (tmp_path / "hba.conf").write_text("local all @sub/users md5\nlocal all all reject\n")
    rules = load_hba(str(tmp_path / "hba.conf"))
    assert line_of(rules, local=True, user="carol") == 1
    assert line_of(rules, local=True, user="dave") == 2
    (tmp_path / "hba.conf").write_text("local all @nope md5\n")
    with pytest.raises(ConfigError, match=r"hba\.conf:1: cannot read"):
        load_hba(str(tmp_path / "hba.conf"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_hba(str(tmp_path / "absent.conf"))


# pg_ident.conf


def ident(text: str) -> IdentMaps:
    return parse_ident(text, IDENT_PATH)


def test_ident_plain_names() -> None:
    maps = ident(
        "# MAP SYSTEM PG\nstaff  alice  alice\nstaff alice  admin\nstaff bob bob\nother carol carol"
    )
    assert maps.allows("staff", "alice", "alice")
    assert maps.allows("staff", "alice", "admin")
    assert maps.allows("staff", "bob", "bob")
    assert not maps.allows("staff", "bob", "admin")
    assert not maps.allows("staff", "Alice", "alice")  # case-sensitive
    assert not maps.allows("staff", "carol", "carol")  # other map
    assert maps.allows("other", "carol", "carol")
    assert not maps.allows("missing", "alice", "alice")
    assert [e.line for e in maps.maps["staff"]] == [2, 3, 4]


def test_ident_regex_with_backreference() -> None:
    maps = ident(r"certs /^(.*)@example\.com$ \1" + "\n" + r'certs "/^x, (y)$" "pre_\1_\1"')
    assert maps.allows("certs", "alice@example.com", "alice")
    assert not maps.allows("certs", "alice@example.com", "bob")
    assert not maps.allows("certs", "alice@example.org", "alice")
    assert maps.allows("certs", "x, y", "pre_y_\\1")  # only the first \1 is replaced


def test_ident_regex_search_is_unanchored_as_written() -> None:
    maps = ident("m /admin root")
    assert maps.allows("m", "sysadmins", "root")
    assert not maps.allows("m", "adm", "root")


def test_ident_optional_group_that_did_not_match_allows_nothing() -> None:
    maps = ident(r"m /^a(b)?$ u\1")
    assert maps.allows("m", "ab", "ub")
    assert not maps.allows("m", "a", "u")


def test_ident_all_and_quoted_all() -> None:
    maps = ident('m alice all\nq bob "all"\nr carol /^ro_')
    assert maps.allows("m", "alice", "anyone")
    assert not maps.allows("m", "bob", "anyone")
    assert maps.allows("q", "bob", "all")
    assert not maps.allows("q", "bob", "anyone")
    assert maps.allows("r", "carol", "ro_reports")
    assert not maps.allows("r", "carol", "rw_reports")


def test_ident_continuation_and_quotes() -> None:
    maps = ident('"my map" \\\n  "sys user" "db user" # comment\n')
    assert maps.allows("my map", "sys user", "db user")
    assert maps.maps["my map"][0].line == 1


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("m", 1, "end of line before the system user field"),
        ("m alice", 1, "end of line before the database user field"),
        ("m alice bob extra", 1, "extra fields after the database user"),
        ("m alice,bob bob", 1, "multiple values in the system user field"),
        ("\n\nm /(unclosed bob", 3, 'invalid regular expression "(unclosed"'),
        ("m alice /[", 1, 'invalid regular expression "["'),
        ("m alice +group", 1, 'group "+group" is not supported'),
        (r"m /^nogroup$ x\1", 1, "has no group"),
        ('m "open bob', 1, "unterminated quoted string"),
        ("include_dir conf.d", 1, '"include_dir" directives are not supported'),
    ],
)
def test_ident_errors_name_file_and_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        ident(text)
    assert str(info.value).startswith(f"{IDENT_PATH}:{line}: ")
    assert fragment in str(info.value)


def test_ident_backslash_one_without_a_regex_is_literal() -> None:
    assert ident(r"m alice a\1").allows("m", "alice", "a\\1")


def test_load_ident(tmp_path: Path) -> None:
    (tmp_path / "ident.conf").write_text("m alice bob\n")
    assert load_ident(str(tmp_path / "ident.conf")).allows("m", "alice", "bob")
    with pytest.raises(ConfigError, match="cannot read"):
        load_ident(str(tmp_path / "absent.conf"))


# Fuzzing: any text either parses or raises ConfigError.

FUZZ = settings(max_examples=300, deadline=None, database=None)
PIECES = st.sampled_from(
    [
        "local",
        "host",
        "hostssl",
        "hostnossl",
        "hostgssenc",
        "all",
        "sameuser",
        "samerole",
        "replication",
        "@inc",
        "@",
        "+g",
        "/",
        "/(",
        "/^a(b)$",
        "10.0.0.0/8",
        "::1/128",
        "10.0.0.1",
        "255.255.0.0",
        "::ffff:1.2.3.4",
        "/33",
        "trust",
        "reject",
        "md5",
        "peer",
        "cert",
        "ldap",
        "ident",
        "map=m",
        "clientcert=verify-ca",
        "x=",
        "=",
        '"',
        '""',
        ",",
        "#",
        "\\",
        "\\\n",
        "\n",
        " ",
        "\t",
        "\r",
        "\\1",
        "\x00",
        "\udcff",
        "\u0661",
    ]
)
FUZZ_TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(PIECES, max_size=40).map("".join),
    st.lists(st.one_of(PIECES, st.text(max_size=5)), max_size=40).map(" ".join),
)
FUZZ_FILES = {"/etc/pgtarn/inc": "a, b @inc2\n", "/etc/pgtarn/inc2": '"c" all\n'}


@FUZZ
@given(FUZZ_TEXT)
def test_random_hba_text_parses_or_raises_config_error(text: str) -> None:
    try:
        rules = hba(text, FUZZ_FILES)
    except ConfigError as exc:
        assert str(exc).startswith("/etc/pgtarn/")
        return
    for address in (None, "10.0.0.1", "::ffff:10.0.0.1"):
        for local in (False, True):
            line_of(rules, local=local, address=address, replication=local)


@FUZZ
@given(FUZZ_TEXT)
def test_random_ident_text_parses_or_raises_config_error(text: str) -> None:
    try:
        maps = ident(text)
    except ConfigError as exc:
        assert str(exc).startswith(f"{IDENT_PATH}:")
        return
    for name in maps.maps:
        maps.allows(name, "ab", "b")


def test_collecting_reports_every_bad_line() -> None:
    problems = Problems(collect=True)
    rules = parse_hba(
        "host all all 10.0.0.0/8 md5\nhost all all nowhere md5\n"
        "local all all trust\nlocal all all sometimes\n",
        HBA_PATH,
        lambda path: "",
        problems,
    )
    assert [rule.line for rule in rules.rules] == [1, 3]
    assert [error.split(": ", 1)[0] for error in problems.errors] == [
        f"{HBA_PATH}:2",
        f"{HBA_PATH}:4",
    ]
    ident_problems = Problems(collect=True)
    maps = parse_ident(
        "m alice bob\nm onlytwo\nm /( bob\nm carol dave\n", IDENT_PATH, ident_problems
    )
    assert len(maps.maps["m"]) == 2
    assert [error.split(": ", 1)[0] for error in ident_problems.errors] == [
        f"{IDENT_PATH}:2",
        f"{IDENT_PATH}:3",
    ]


def test_a_list_may_have_blanks_around_its_commas_as_pgbouncer_reads_it() -> None:
    rules = hba(
        'host one,two  ann , bob ,cid  10.0.0.0/8  md5\nhost all "a , b" 10.0.0.0/8 trust\n'
    )
    for user in ("ann", "bob", "cid"):
        assert line_of(rules, database="two", user=user) == 1
    assert line_of(rules, database="three", user="ann") is None
    assert line_of(rules, user="a , b") == 2  # quoted: one name with its blanks
    assert line_of(rules, user="a") is None


def test_cert_on_a_host_line_is_read_and_needs_tls_to_pass() -> None:
    """PgBouncer takes cert on a host line (PostgreSQL only on hostssl); a connection
    without TLS has no certificate, so the rule refuses it at login (client/access.py)."""
    rules = hba("host all all 10.0.0.0/8 cert\n")
    assert line_of(rules, tls=False) == 1 and line_of(rules, tls=True) == 1
