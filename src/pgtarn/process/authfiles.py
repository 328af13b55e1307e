"""auth_file, auth_hba_file and auth_ident_file read for the pooler (startup, RELOAD).

The files are read here, their warnings logged; LDAP's options are checked with them, so
that a configuration that uses LDAP wrongly is refused before it is applied.
"""

from __future__ import annotations

import logging

from ..auth.hba import HbaRules, IdentMaps, load_hba, load_ident
from ..auth.userlist import load_userlist
from ..config.settings import Config
from ..net.ldapcheck import check_ldap_config

__all__ = ["read_hba", "read_userlist"]

log = logging.getLogger("pgtarn")


def read_userlist(config: Config) -> dict[str, str]:
    """auth_file's users and secrets; none under auth_type = pam (as PgBouncer: PAM alone
    decides)."""
    if not config.auth_file or config.auth_type == "pam":
        return {}
    return load_userlist(config.auth_file)


def read_hba(config: Config) -> tuple[HbaRules | None, IdentMaps | None]:
    """auth_hba_file and auth_ident_file, parsed (and LDAP's options); their warnings logged."""
    hba = load_hba(config.auth_hba_file) if config.auth_hba_file else None
    ident = load_ident(config.auth_ident_file) if config.auth_ident_file else None
    check_ldap_config(config, hba)
    for warning in hba.warnings if hba is not None else ():
        log.warning("auth_hba_file: %s", warning)
    return hba, ident
