"""TLS 1.3 cipher suites set on an SSLContext through OpenSSL (net/tls13.py)."""

from __future__ import annotations

import ssl

import pytest

from pgtarn.config.settings import Config
from pgtarn.errors import ConfigError
from pgtarn.net.tls import server_context
from pgtarn.net.tls13 import set_tls13_ciphers


def tls13_suites(context: ssl.SSLContext) -> list[str]:
    return [c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.3"]


def test_the_suites_given_are_the_only_ones_left() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert len(tls13_suites(context)) > 1
    set_tls13_ciphers(context, "client_tls13_ciphers", "TLS_CHACHA20_POLY1305_SHA256")
    assert tls13_suites(context) == ["TLS_CHACHA20_POLY1305_SHA256"]
    set_tls13_ciphers(
        context, "client_tls13_ciphers", "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256"
    )
    assert tls13_suites(context) == ["TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256"]


def test_an_unknown_suite_is_a_clear_error_and_changes_nothing() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    set_tls13_ciphers(context, "client_tls13_ciphers", "TLS_AES_256_GCM_SHA384")
    with pytest.raises(
        ConfigError,
        match=r"client_tls13_ciphers: failed to set the TLSv1\.3 "
        r"cipher suites: unknown",
    ):
        set_tls13_ciphers(context, "client_tls13_ciphers", "unknown")
    assert tls13_suites(context) == ["TLS_AES_256_GCM_SHA384"]


def test_server_tls13_ciphers_reach_the_server_context() -> None:
    config = Config.default().with_setting("server_tls13_ciphers", "TLS_AES_128_GCM_SHA256")
    context = server_context(config)
    assert context is not None
    assert tls13_suites(context) == ["TLS_AES_128_GCM_SHA256"]
    # TLS 1.3 off: the setting has nothing to apply to, as PgBouncer
    below = config.with_setting("server_tls_protocols", "tlsv1.2")
    assert server_context(below) is not None
