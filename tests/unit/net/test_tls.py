"""tls: contexts from the settings (protocols, ciphers, files)."""

from __future__ import annotations

import dataclasses
import ssl
from typing import Any

import pytest

from pgtarn.config.settings import Config
from pgtarn.errors import ConfigError
from pgtarn.net.tls import client_context, server_context


def config(**settings: Any) -> Config:
    return dataclasses.replace(Config(), **settings)


@pytest.mark.parametrize(
    ("protocols", "low", "high"),
    [
        ("secure", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3),
        ("tlsv1.3", ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3),
        ("tlsv1.2", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2),
        ("TLSv1.2,tlsv1.3", ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3),
    ],
)
def test_protocols(protocols: str, low: ssl.TLSVersion, high: ssl.TLSVersion) -> None:
    context = server_context(config(server_tls_sslmode="require", server_tls_protocols=protocols))
    assert context is not None
    assert (context.minimum_version, context.maximum_version) == (low, high)


def test_bad_settings_are_config_errors_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="server_tls_protocols: unknown TLS protocol"):
        server_context(config(server_tls_sslmode="require", server_tls_protocols="sslv3"))
    with pytest.raises(ConfigError, match="server_tls_ciphers"):
        server_context(config(server_tls_sslmode="require", server_tls_ciphers="NO-SUCH"))
    with pytest.raises(ConfigError, match="needs client_tls_key_file"):
        client_context(config(client_tls_sslmode="require"))
    with pytest.raises(ConfigError, match="client_tls_cert_file: cannot load"):
        client_context(
            config(
                client_tls_sslmode="require",
                client_tls_cert_file="/nonexistent",
                client_tls_key_file="/nonexistent",
            )
        )
    with pytest.raises(ConfigError, match="server_tls_ca_file: cannot load"):
        server_context(config(server_tls_sslmode="verify-ca", server_tls_ca_file="/nonexistent"))


def test_server_modes() -> None:
    assert server_context(config(server_tls_sslmode="disable")) is None
    assert client_context(config(client_tls_sslmode="disable")) is None
    for mode, verify, hostname in (
        ("prefer", ssl.CERT_NONE, False),
        ("require", ssl.CERT_NONE, False),
        ("verify-ca", ssl.CERT_REQUIRED, False),
        ("verify-full", ssl.CERT_REQUIRED, True),
    ):
        context = server_context(config(server_tls_sslmode=mode))
        assert context is not None
        assert (context.verify_mode, context.check_hostname) == (verify, hostname), mode
