"""authfiles: auth_file not read under pam, the HBA file's LDAP rules and options checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pgtarn.config.settings import Config
from pgtarn.errors import ConfigError
from pgtarn.process.authfiles import read_hba, read_userlist


def test_auth_file_is_read_except_under_pam(tmp_path: Path) -> None:
    users = tmp_path / "userlist.txt"
    users.write_text('"ann" "secret"\n')
    config = dataclasses.replace(Config(), auth_file=str(users))
    assert read_userlist(config) == {"ann": "secret"}
    assert read_userlist(dataclasses.replace(config, auth_type="pam")) == {}


def test_hba_with_an_ldap_rule_and_wrong_ldap_options(tmp_path: Path) -> None:
    hba = tmp_path / "pg_hba.conf"
    hba.write_text('host all all 0.0.0.0/0 ldap ldapserver=h ldapprefix="cn="\n')
    config = dataclasses.replace(Config(), auth_type="hba", auth_hba_file=str(hba))
    rules, ident = read_hba(config)
    assert rules is not None and rules.rules[0].method == "ldap" and ident is None
    wrong = dataclasses.replace(
        config, auth_type="ldap", auth_ldap_options="ldapserver=h ldapprefix=x ldapbasedn=y"
    )
    with pytest.raises(ConfigError, match="cannot mix options"):
        read_hba(wrong)
