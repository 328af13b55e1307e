"""One LDAP password check (simple bind, or search+bind), blocking: it runs in an auth thread.

As PostgreSQL and PgBouncer do it: in simple bind mode the user binds as ldapprefix + name +
ldapsuffix; in search+bind mode pgtarn binds as ldapbinddn (or anonymously), searches
ldapbasedn for the one entry the filter finds, then binds as that entry on a new
connection. The password is right when the last bind succeeds. The servers of ldapserver
are tried in order. The client library is ldap3 (the optional extra pgtarn[ldap]).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import ssl
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..auth.hba import HbaRules
from ..auth.ldap import LdapOptions, TlsPolicy, parse_ldap_conf, parse_ldap_options
from ..config.settings import Config
from ..errors import ConfigError

__all__ = [
    "CONNECT_TIMEOUT",
    "REQUEST_TIMEOUT",
    "Outcome",
    "check_ldap_config",
    "check_ldap_password",
    "ldap_missing",
    "tls_policy",
]

#: Seconds to connect to one server: PgBouncer's LDAP network timeout. (ldap3 takes whole
#: seconds: it packs them into a socket option.)
CONNECT_TIMEOUT = 3
#: Seconds to wait for the answer to one request (bind, search, StartTLS).
REQUEST_TIMEOUT = 10
#: Where libldap reads its settings when LDAPCONF does not say (Debian's, then others').
_LDAP_CONFS = ("/etc/ldap/ldap.conf", "/etc/openldap/ldap.conf")


def ldap_missing() -> str | None:
    """What to do when the LDAP client library is missing (None: it is there)."""
    if importlib.util.find_spec("ldap3") is None:
        return "LDAP authentication needs the ldap3 package: install pgtarn[ldap]"
    return None


def check_ldap_config(config: Config, hba: HbaRules | None) -> None:
    """At startup, RELOAD, SET and in `pgtarn check`: auth_ldap_options is right when
    auth_type = ldap (as PgBouncer, other auth types leave it unread), and the client library
    is installed when anything uses LDAP; else ConfigError."""
    uses_hba = (
        config.auth_type == "hba"
        and hba is not None
        and any(rule.ldap is not None for rule in hba.rules)
    )
    if config.auth_type != "ldap" and not uses_hba:
        return
    missing = ldap_missing()
    if missing is not None:
        raise ConfigError(missing)
    if config.auth_type == "ldap":
        try:
            parse_ldap_options(config.auth_ldap_options)
        except ValueError as exc:
            raise ConfigError(f"auth_ldap_options: {exc}") from None


@cache
def load_ldap3() -> Any:
    """The ldap3 package, imported at the first LDAP check: with pyasn1 it is the largest
    import pgtarn has, which a pooler that never checks a password with LDAP does not hold."""
    with warnings.catch_warnings():
        # ldap3 2.9 uses names that newer pyasn1 releases deprecate (it works with both)
        warnings.simplefilter("ignore", DeprecationWarning)
        import ldap3  # lazy, for the memory (see the docstring)
    return ldap3


@dataclass(frozen=True)
class Outcome:
    """A check's result; detail says why it failed, for the log (never with a password)."""

    ok: bool
    detail: str = ""


class _Failed(Exception):
    """The check ends here: the message is the Outcome's detail."""


def tls_policy(env: Mapping[str, str] = os.environ) -> TlsPolicy:
    """libldap's TLS settings: LDAPCONF (else the system's ldap.conf) and LDAPTLS_*."""
    if env.get("LDAPNOINIT"):
        return TlsPolicy()
    path = env.get("LDAPCONF")
    for candidate in (path,) if path else _LDAP_CONFS:
        try:
            with open(candidate, encoding="utf-8", errors="replace") as f:
                return parse_ldap_conf(f.read(), env)
        except OSError:
            continue
    return parse_ldap_conf("", env)


def check_ldap_password(
    options: LdapOptions, user: str, password: str, policy: TlsPolicy | None = None
) -> Outcome:
    """Whether the LDAP server takes user's password (see the module docstring)."""
    missing = ldap_missing()
    if missing is not None:
        return Outcome(False, missing)
    if not password:  # an empty password would be an unauthenticated bind, which succeeds
        return Outcome(False, "empty password")
    ldap3 = load_ldap3()
    try:
        tls = _tls(ldap3, policy if policy is not None else tls_policy(), options)
        dn = _find_dn(ldap3, options, user, tls) if options.search else options.bind_dn(user)
        conn, server = _connect(ldap3, options, tls, dn, password)
        try:
            if not conn.bind():
                raise _Failed(
                    f'LDAP login failed for user "{dn}" on server "{server}": {_why(conn)}'
                )
        finally:
            _close(conn)
    except _Failed as failed:
        return Outcome(False, str(failed))
    except Exception as exc:  # ldap3 raises more than its own errors (struct.error, ...)
        return Outcome(False, f"LDAP error: {type(exc).__name__}: {_text(exc)}")
    return Outcome(True)


def _find_dn(ldap3: Any, options: LdapOptions, user: str, tls: Any) -> str:
    """Search+bind mode: the DN of the one entry the search finds for user."""
    problem = options.user_name_problem(user)
    if problem is not None:
        raise _Failed(problem)
    search_filter = options.search_filter_for(user)
    conn, server = _connect(ldap3, options, tls, options.binddn, options.bindpasswd)
    try:
        if not conn.bind():
            raise _Failed(
                f"could not perform initial LDAP bind for ldapbinddn "
                f'"{options.binddn or ""}" on server "{server}": {_why(conn)}'
            )
        scope = {"base": ldap3.BASE, "one": ldap3.LEVEL}.get(options.scope, ldap3.SUBTREE)
        if (
            not conn.search(
                options.basedn, search_filter, search_scope=scope, attributes=[ldap3.NO_ATTRIBUTES]
            )
            and conn.result.get("description") != "success"
        ):
            raise _Failed(
                f'could not search LDAP for filter "{search_filter}" on server '
                f'"{server}": {_why(conn)}'
            )
        found = [
            entry["dn"] for entry in conn.response or () if entry.get("type") == "searchResEntry"
        ]
    finally:
        _close(conn)
    if not found:
        raise _Failed(
            f'LDAP user "{user}" does not exist (search for filter '
            f'"{search_filter}" on server "{server}" returned no entries)'
        )
    if len(found) > 1:
        raise _Failed(
            f'LDAP user "{user}" is not unique (search for filter '
            f'"{search_filter}" on server "{server}" returned {len(found)} entries)'
        )
    return str(found[0])


def _connect(
    ldap3: Any, options: LdapOptions, tls: Any, user: str | None, password: str | None
) -> tuple[Any, str]:
    """An open connection (TLS started if ldaptls) to the first server of ldapserver that
    answers, set to bind as user (None: anonymously), and that server's name."""
    errors: list[str] = []
    for host in options.servers:
        server = ldap3.Server(
            host,
            port=options.server_port,
            use_ssl=options.scheme == "ldaps",
            tls=tls,
            get_info=ldap3.NONE,
            connect_timeout=CONNECT_TIMEOUT,
        )
        if user:
            conn = ldap3.Connection(
                server,
                user=user,
                password=password or "",
                authentication=ldap3.SIMPLE,
                auto_bind=ldap3.AUTO_BIND_NONE,
                receive_timeout=REQUEST_TIMEOUT,
                read_only=True,
            )
        else:
            conn = ldap3.Connection(
                server,
                authentication=ldap3.ANONYMOUS,
                auto_bind=ldap3.AUTO_BIND_NONE,
                receive_timeout=REQUEST_TIMEOUT,
                read_only=True,
            )
        try:
            conn.open(read_server_info=False)
        except (ldap3.core.exceptions.LDAPException, OSError) as exc:
            _close(conn)
            errors.append(f"{host}:{options.server_port}: {_text(exc)}")
            continue
        if options.starttls:
            try:
                started = conn.start_tls(read_server_info=False)
            except (ldap3.core.exceptions.LDAPException, OSError) as exc:
                _close(conn)
                raise _Failed(
                    f"could not start LDAP TLS session: {_text(exc)}, server: "
                    f"{host}, port: {options.server_port}"
                ) from None
            if not started:
                _close(conn)
                raise _Failed(
                    f"could not start LDAP TLS session: {_why(conn)}, server: "
                    f"{host}, port: {options.server_port}"
                )
        return conn, host
    raise _Failed("could not connect to the LDAP server: " + "; ".join(errors))


def _tls(ldap3: Any, policy: TlsPolicy, options: LdapOptions) -> Any:
    if options.scheme != "ldaps" and not options.starttls:
        return None
    return ldap3.Tls(
        validate=ssl.CERT_REQUIRED if policy.verify else ssl.CERT_NONE,
        ca_certs_file=policy.ca_file,
        ca_certs_path=policy.ca_dir,
    )


def _close(conn: Any) -> None:
    """Unbind and close; a connection that broke meanwhile changes no outcome."""
    with contextlib.suppress(load_ldap3().core.exceptions.LDAPException, OSError):
        conn.unbind()
    sock = getattr(conn, "socket", None)
    if sock is not None:  # ldap3 keeps the socket of a connect that failed: closed here
        sock.close()


def _why(conn: Any) -> str:
    """The server's answer to the last request, as ldap3 keeps it."""
    result = conn.result or {}
    words = [str(result.get("description") or "no answer"), str(result.get("message") or "")]
    return ": ".join(word for word in words if word)


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
