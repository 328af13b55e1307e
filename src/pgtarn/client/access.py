"""Who may try to log in, and how: client_tls_sslmode, auth_type, pg_hba.conf rules, identities.

Decided from facts about the connection (TLS or not, address, the certificate's name, the
peer's OS user, read with SO_PEERCRED) before any password is asked for; the result is the
method ClientAuth runs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import pwd
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from ..auth.hba import HbaRule, HbaRules, IdentMaps, IPAddress
from ..config.settings import Config
from ..errors import PgtarnError

_PEERCRED = struct.Struct("3i")

#: client_tls_sslmode values under which a TCP client must use TLS.
TLS_REQUIRED = frozenset({"require", "verify-ca", "verify-full"})

#: pg_hba.conf methods -> ClientAuth's auth types ("any": the identity was the proof).
_HBA_METHODS = {
    "trust": "trust",
    "password": "plain",
    "md5": "md5",
    "scram-sha-256": "scram-sha-256",
    "cert": "any",
    "peer": "any",
    "pam": "pam",
    "ldap": "ldap",
}


@dataclass(init=False)
class Connection:
    """What is known about a client's connection before it authenticates.

    Its own __init__ and Final fields in place of frozen=True: compiled, that is a C
    constructor, where a dataclass's generated one stays interpreted (one per login)."""

    local: Final[bool]  # unix socket
    tls: Final[bool]
    address: Final[IPAddress | None]
    certificate: Final[bool]  # a client certificate was presented and verified
    certificate_name: Final[str | None]  # its CN, if it has one
    os_user: Final[Callable[[], str | None]]  # unix sockets: the peer's OS user (asked lazily)

    def __init__(
        self,
        local: bool,
        tls: bool,
        address: IPAddress | None,
        certificate: bool,
        certificate_name: str | None,
        os_user: Callable[[], str | None],
    ) -> None:
        self.local = local
        self.tls = tls
        self.address = address
        self.certificate = certificate
        self.certificate_name = certificate_name
        self.os_user = os_user


def peer_address(addr: str) -> IPAddress | None:
    """The IP address of "host:port" (None for "unix" or anything else)."""
    return _ip_address(addr.rsplit(":", 1)[0])


# Cached by host (the port differs at each connection): parsing an address is dearer than
# the rest of the access decision, and clients come from a few hosts again and again.
@lru_cache(maxsize=1024)
def _ip_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def os_user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def peer_credentials(transport: asyncio.BaseTransport | None) -> tuple[int, int] | None:
    """(pid, uid) of a unix-socket peer (SO_PEERCRED); None over TCP or when unknown."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
    except (OSError, AttributeError):
        return None
    return int(pid), int(uid)


#: PgBouncer's words for a certificate that does not name the user.
CERT_FAILED = "certificate authentication failed"


def _refused(text: str) -> PgtarnError:
    return PgtarnError(text, sqlstate="28000")


def _where(conn: Connection, user: str, database: str | None) -> str:
    """PostgreSQL's wording of who connects (database None: a physical replication one)."""
    host = "[local]" if conn.local else str(conn.address)
    encryption = "SSL encryption" if conn.tls else "no encryption"
    if database is None:
        return f'host "{host}", user "{user}", {encryption}'
    return f'host "{host}", user "{user}", database "{database}", {encryption}'


def _identity_matches(
    name: str | None, user: str, map_name: str | None, ident: IdentMaps | None
) -> bool:
    if name is None:
        return False
    if map_name is None:
        return name == user
    return ident is not None and ident.allows(map_name, name, user)


def _check_certificate(
    conn: Connection, user: str, rule: HbaRule | None, ident: IdentMaps | None, what: str
) -> None:
    if not conn.certificate:
        raise _refused("connection requires a valid client certificate")
    map_name = rule.map_name if rule is not None else None
    if not _identity_matches(conn.certificate_name, user, map_name, ident):
        raise _refused(what)


def fixed_method(config: Config) -> str | None:
    """The auth type auth_method gives every connection under config when no fact about the
    connection matters (no TLS requirement, auth_type neither hba nor cert); else None.
    A login then builds no Connection (its address parsed, its TLS read) to be told it."""
    if config.client_tls_sslmode in TLS_REQUIRED or config.auth_type in ("hba", "cert"):
        return None
    return config.auth_type


def auth_method(
    config: Config,
    hba: HbaRules | None,
    ident: IdentMaps | None,
    conn: Connection,
    database: str,
    user: str,
    replication: bool = False,
) -> str:
    """The ClientAuth auth type for this login, or a PgtarnError (28000) refusing it.
    replication: a physical replication connection (pg_hba.conf's "replication" keyword)."""
    tls_mode = config.client_tls_sslmode
    if not conn.tls and not conn.local and tls_mode in TLS_REQUIRED:
        raise _refused("SSL required")
    auth_type = config.auth_type
    if tls_mode == "verify-full" and conn.tls and auth_type != "hba":
        # As PostgreSQL's clientcert=verify-full (PgBouncer treats it as verify-ca): the
        # certificate must name the user. Under hba the rule and its map= decide.
        _check_certificate(conn, user, None, ident, CERT_FAILED)
    if auth_type == "cert":
        _check_certificate(conn, user, None, ident, CERT_FAILED)
        return "any"
    if auth_type != "hba":
        return auth_type
    if hba is None:
        raise _refused("auth_type = hba, but no auth_hba_file is loaded")
    rule = hba.match(
        local=conn.local,
        tls=conn.tls,
        database=database,
        user=user,
        address=conn.address,
        replication=replication,
    )
    if rule is None:
        if replication:
            raise _refused(
                f"no pg_hba.conf entry for replication connection from {_where(conn, user, None)}"
            )
        raise _refused(f"no pg_hba.conf entry for {_where(conn, user, database)}")
    if rule.method == "reject":
        what = "replication connection" if replication else "connection"
        raise _refused(
            f"pg_hba.conf rejects {what} for "
            f"{_where(conn, user, None if replication else database)}"
        )
    if rule.method == "cert":
        _check_certificate(conn, user, rule, ident, CERT_FAILED)
    elif rule.clientcert is not None:
        if not conn.certificate:
            raise _refused("connection requires a valid client certificate")
        if rule.clientcert == "verify-full" and not _identity_matches(
            conn.certificate_name, user, rule.map_name, ident
        ):
            raise _refused(
                f"certificate validation (clientcert=verify-full) failed for user "
                f'"{user}": CN mismatch'
            )
    elif rule.method == "peer" and not (
        conn.local and _identity_matches(conn.os_user(), user, rule.map_name, ident)
    ):
        raise _refused("unix socket login rejected")  # PgBouncer's words
    return _HBA_METHODS[rule.method]
