"""access.auth_method: TLS demands, certificate and peer identities, pg_hba.conf rules."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import pytest

from pgtarn.auth.hba import parse_hba, parse_ident
from pgtarn.client.access import Connection, auth_method, fixed_method, peer_address
from pgtarn.config.settings import Config
from pgtarn.errors import PgtarnError

HBA = parse_hba(
    """\
local    all  all                peer map=m
hostssl  all  certs  0.0.0.0/0   md5 clientcert=verify-full
hostssl  all  cacerts  0.0.0.0/0 md5 clientcert=verify-ca
hostssl  all  all    0.0.0.0/0   cert map=m
host     all  all    ::1/128     password
host     all  all    10.0.0.0/8  reject
host     all  pamuser 0.0.0.0/0  pam
""",
    "pg_hba.conf",
    lambda path: "",
)
IDENT = parse_ident("m  alice  app\nm  /^(.*)-cert$  \\1\n", "pg_ident.conf")


def conn(
    *,
    local: bool = False,
    tls: bool = False,
    address: str | None = "127.0.0.1",
    cert: str | None = None,
    os_user: str | None = None,
) -> Connection:
    return Connection(
        local=local,
        tls=tls,
        address=ipaddress.ip_address(address) if address else None,
        certificate=cert is not None,
        certificate_name=cert,
        os_user=lambda: os_user,
    )


def method(config: Config, connection: Connection, user: str = "app") -> str:
    return auth_method(config, HBA, IDENT, connection, "db", user)


def refused(config: Config, connection: Connection, user: str = "app") -> str:
    with pytest.raises(PgtarnError) as info:
        method(config, connection, user)
    assert info.value.sqlstate == "28000"
    return info.value.message


HBA_CONFIG = dataclasses.replace(Config(), auth_type="hba")


def test_tls_required_for_tcp_only() -> None:
    config = dataclasses.replace(Config(), client_tls_sslmode="require")
    assert refused(config, conn()) == "SSL required"
    assert method(config, conn(tls=True)) == config.auth_type
    assert method(config, conn(local=True, address=None)) == config.auth_type


def test_verify_full_and_cert_need_the_users_certificate() -> None:
    full = dataclasses.replace(Config(), client_tls_sslmode="verify-full")
    assert method(full, conn(tls=True, cert="app")) == full.auth_type
    assert "certificate authentication failed" in refused(full, conn(tls=True, cert="bob"))
    cert = dataclasses.replace(Config(), auth_type="cert")
    assert method(cert, conn(tls=True, cert="app")) == "any"
    assert "requires a valid client certificate" in refused(cert, conn(tls=True))


def test_hba_rules_in_order() -> None:
    assert method(HBA_CONFIG, conn(local=True, address=None, os_user="alice")) == "any"
    assert "unix socket login rejected" in refused(
        HBA_CONFIG, conn(local=True, address=None, os_user="mallory")
    )
    assert method(HBA_CONFIG, conn(tls=True, cert="app-cert")) == "any"  # via the map regex
    assert "certificate authentication failed" in refused(HBA_CONFIG, conn(tls=True, cert="x"))
    assert method(HBA_CONFIG, conn(tls=True, cert="certs"), "certs") == "md5"
    assert "clientcert=verify-full" in refused(HBA_CONFIG, conn(tls=True, cert="x"), "certs")
    assert method(HBA_CONFIG, conn(address="::1")) == "plain"
    assert "rejects connection" in refused(HBA_CONFIG, conn(address="10.1.2.3"))
    assert method(HBA_CONFIG, conn(), "pamuser") == "pam"
    assert refused(HBA_CONFIG, conn()) == (
        'no pg_hba.conf entry for host "127.0.0.1", user "app", database "db", no encryption'
    )


def test_verify_full_leaves_names_to_the_hba_rule_and_its_map() -> None:
    config = dataclasses.replace(HBA_CONFIG, client_tls_sslmode="verify-full")
    assert method(config, conn(tls=True, cert="app-cert")) == "any"  # mapped, not equal


def test_a_certificate_without_cn_is_still_a_certificate() -> None:
    nameless = Connection(
        local=False,
        tls=True,
        address=ipaddress.ip_address("127.0.0.1"),
        certificate=True,
        certificate_name=None,
        os_user=lambda: None,
    )
    assert method(HBA_CONFIG, nameless, "cacerts") == "md5"  # clientcert=verify-ca
    assert "clientcert=verify-full" in refused(HBA_CONFIG, nameless, "certs")


def test_hba_without_a_file_refuses() -> None:
    with pytest.raises(PgtarnError, match="no auth_hba_file"):
        auth_method(HBA_CONFIG, None, None, conn(), "db", "app")


def test_peer_address() -> None:
    assert peer_address("127.0.0.1:5432") == ipaddress.ip_address("127.0.0.1")
    assert peer_address("::1:6000") == ipaddress.ip_address("::1")
    assert peer_address("unix") is None


def test_physical_replication_matches_only_the_replication_keyword() -> None:
    hba = parse_hba(
        "host replication repl 127.0.0.1/32 md5\n"
        "host replication all 10.0.0.0/8 reject\n"
        "host all all 0.0.0.0/0 trust\n",
        "pg_hba.conf",
        lambda path: "",
    )
    local_net = conn()
    assert auth_method(HBA_CONFIG, hba, None, local_net, "db", "repl", True) == "md5"
    # a logical one (replication=database) is a connection to its database
    assert auth_method(HBA_CONFIG, hba, None, local_net, "db", "other", False) == "trust"
    with pytest.raises(PgtarnError) as info:
        auth_method(HBA_CONFIG, hba, None, local_net, "db", "other", True)
    assert info.value.message == (
        "no pg_hba.conf entry for replication connection from "
        'host "127.0.0.1", user "other", no encryption'
    )
    with pytest.raises(PgtarnError) as info:
        auth_method(HBA_CONFIG, hba, None, conn(address="10.1.2.3"), "db", "repl", True)
    assert info.value.message == (
        'pg_hba.conf rejects replication connection for host "10.1.2.3", user "repl", no encryption'
    )


@pytest.mark.parametrize(
    ("settings", "fixed"),
    [
        ({"auth_type": "md5"}, "md5"),
        ({"auth_type": "scram-sha-256", "client_tls_sslmode": "prefer"}, "scram-sha-256"),
        ({"auth_type": "md5", "client_tls_sslmode": "require"}, None),
        ({"auth_type": "trust", "client_tls_sslmode": "verify-full"}, None),
        ({"auth_type": "hba"}, None),
        ({"auth_type": "cert"}, None),
    ],
)
def test_fixed_method_is_auth_method_for_every_connection(
    settings: dict[str, Any], fixed: str | None
) -> None:
    config = dataclasses.replace(Config(), **settings)
    assert fixed_method(config) == fixed
    if fixed is not None:  # whatever the connection: local, TLS or not, any address
        for connection in (conn(), conn(local=True, address=None), conn(tls=True, cert="x")):
            assert method(config, connection) == fixed
